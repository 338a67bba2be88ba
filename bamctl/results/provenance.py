"""What produced a row: the software (bamctl version, git revision, torch version) and the engine
(device and attention path, which never split a table, so ``results show --engines`` lists them)."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from bamctl.version import __version__

if TYPE_CHECKING:
    import pandas as pd

ENGINE_COLUMNS = ("model", "dtype", "device", "attention")


@functools.cache
def git_revision() -> str | None:
    """Commit of the bamctl checkout, with `+dirty` when tracked files differ; None when not in git."""
    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            # --no-optional-locks: never touch the index another git process may be writing
            ["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no"],
            cwd=root, capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{rev}+dirty" if dirty else rev or None


def provenance() -> dict[str, str | None]:
    """`bamctl_version`, `git_revision` and `torch_version`, ready to merge into every row of a run."""
    return {"bamctl_version": __version__, "git_revision": git_revision(), "torch_version": torch_version()}


@functools.cache
def torch_version() -> str:
    """torch's version as its installed metadata gives it, without importing torch."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return "unknown"


DROPPED_COLUMNS = ("model", "task", "protocol", "length", "depth", "seed", "sample", "n_tokens", "dropped_tokens", "bos")


def dropped(frame: "pd.DataFrame") -> "pd.DataFrame":
    """The rows whose prompt the back-end cut to fit the model's maximum length: prompt tokens left
    out (``dropped_tokens``), or the BOS a model's other rows of the same task get left out (at
    exactly an ``hf:`` model's limit a perplexity window goes in without it: its perplexity is
    then not that of the other lengths)."""
    if "dropped_tokens" not in frame:
        return frame.iloc[0:0].reindex(columns=list(DROPPED_COLUMNS))
    cut = frame["dropped_tokens"].fillna(0) > 0
    if "bos" in frame:
        bos = frame["bos"].astype("boolean")
        group = [c for c in ("model_hash", "backend", "task", "protocol") if c in frame]
        others_have_it = bos.fillna(False).groupby([frame[c].astype(str) for c in group]).transform("any")
        cut |= (bos == False).fillna(False) & others_have_it  # noqa: E712 (a nullable boolean)
    columns = [c for c in DROPPED_COLUMNS if c in frame]
    return frame[cut.to_numpy(dtype=bool)][columns].reset_index(drop=True)


def engines(frame: "pd.DataFrame") -> "pd.DataFrame":
    """Rows per (model, backend, dtype, device, attention): what each model's numbers were computed
    on; the back-end where rows name it (one checkpoint on hf and on vllm is two models)."""
    columns = list(ENGINE_COLUMNS[:1]) + (["backend"] if "backend" in frame else []) + list(ENGINE_COLUMNS[1:])
    return frame.groupby(columns, sort=True, dropna=False).size().rename("rows").reset_index()
