"""Where models live: names of shipped reference checkpoints, and checkpoint paths.

A model argument is a catalog name (a folder under ``baselines/`` holding a checkpoint)
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

REPO_ROOT = Path(__file__).resolve().parent.parent


def baselines_dir() -> Path:
    return Path(os.environ.get("BAMCTL_BASELINES_DIR", REPO_ROOT / "baselines"))


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
    """Shipped checkpoints: every ``baselines/NAME/config.json``, by NAME."""
    root = baselines_dir()
    if not root.is_dir():
        return {}
    return {
        d.name: CatalogEntry.from_dir(d.name, d)
        for d in sorted(root.iterdir())
        if d.is_dir() and is_checkpoint_dir(d)
    }


def resolve_model(reference: str) -> Checkpoint:
    """Load a model named in the catalog, or from a checkpoint directory."""
    path = Path(reference).expanduser()
    if path.is_dir():
        return load_checkpoint(path)
    entries = catalog()
    if reference in entries:
        return load_checkpoint(entries[reference].path)
    hint = did_you_mean(reference, entries) if entries else "; no checkpoints are shipped here"
    raise BamctlError(f"unknown model {reference!r}: neither a catalog name nor a checkpoint directory{hint}")
