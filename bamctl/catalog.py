"""Where models live: names of shipped reference checkpoints, and checkpoint paths.

A model argument is a catalog name (a folder under ``bamctl/data/baselines/`` holding a checkpoint)
or a path to a checkpoint directory. Back-end prefixed references (``hf:PATH``) are
resolved by their back-ends.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from bamctl.checkpoint import Checkpoint, is_checkpoint_dir, load_checkpoint, read_config
from bamctl.errors import BamctlError, did_you_mean
from bamctl.positional import pe_label

BASELINES_ENV = "BAMCTL_BASELINES_DIR"
SHIPPED_BASELINES = Path(__file__).resolve().parent / "data" / "baselines"  # inside the package: wheels carry it


def baselines_dir() -> Path:
    """Where shipped checkpoints and their recipes live (``BAMCTL_BASELINES_DIR`` overrides)."""
    return Path(os.environ.get(BASELINES_ENV, SHIPPED_BASELINES))


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    path: Path
    pe: str
    train_length: int
    n_params: int

    @classmethod
    def from_dir(cls, name: str, path: Path) -> "CatalogEntry":
        config = read_config(path)
        model = config["model"]
        return cls(
            name=name,
            path=path,
            pe=pe_label(model["pe"], model["ssmax"]),
            train_length=model["train_length"],
            n_params=config.get("n_params", 0),
        )


def catalog() -> dict[str, CatalogEntry]:
    """Shipped checkpoints: every ``bamctl/data/baselines/NAME/config.json``, by NAME."""
    root = baselines_dir()
    if not root.is_dir():
        return {}
    return {
        d.name: CatalogEntry.from_dir(d.name, d)
        for d in sorted(root.iterdir())
        if d.is_dir() and not d.name.startswith(".") and is_checkpoint_dir(d)  # hidden: a training's staging folder
    }


def checkpoint_path(reference: str) -> Path:
    """The directory a catalog name or checkpoint path names; a one-line error if none."""
    path = Path(reference).expanduser()
    if path.is_dir():
        return path
    entries = catalog()
    if reference in entries:
        return entries[reference].path
    hint = did_you_mean(reference, entries) if entries else "; no checkpoints are shipped here"
    raise BamctlError(f"unknown model {reference!r}: neither a catalog name nor a checkpoint directory{hint}")


def resolve_model(reference: str) -> Checkpoint:
    """Load a model named in the catalog, or from a checkpoint directory."""
    return load_checkpoint(checkpoint_path(reference))
