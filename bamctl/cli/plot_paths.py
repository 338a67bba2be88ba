"""Where a plot of a results directory goes: never where a Parquet reader of the results meets it.

A results directory is a plain Parquet dataset, and so is every folder above it that a
user reads whole: ``results/`` for ``--out results/main`` (``pandas.read_parquet("results")``
reads each run below it). A PNG in any of them breaks such a read (ArrowInvalid) or, once
removed by hand, invites one that mixes runs unnoticed. So a plot goes beside the topmost
folder that holds the results within the working directory, never inside it.
"""

from __future__ import annotations

from pathlib import Path

from bamctl.errors import BamctlError


def results_root(results: Path) -> Path:
    """The outermost folder that holds ``results`` without being the working directory itself:
    ``results`` for ``--out results`` or a folder outside the working directory, ``results/``
    for ``--out results/main``."""
    here, absolute = Path.cwd().resolve(), results.resolve()
    if not absolute.is_relative_to(here) or absolute == here:
        return absolute
    return here / absolute.relative_to(here).parts[0]


def plot_path(results: Path, plot: Path | None, name: str) -> Path:
    """``plot``, or by default ``ROOT-SUB-NAME.png`` beside the results' root (``results-main-passkey.png``
    for ``--out results/main``); a path inside that root is refused with one line."""
    root = results_root(results)
    if plot is None:
        parts = Path(results.resolve()).relative_to(root.parent).parts
        return root.parent / f"{'-'.join(parts)}-{name}.png"
    if plot.resolve().is_relative_to(root):
        where = "the results directory" if root == results.resolve() else f"{root}, which holds the results directory"
        raise BamctlError(
            f"--plot {plot} is inside {where} {results}: Parquet readers of it would meet the image; "
            f"put it beside it, e.g. plots/{plot.name}"
        )
    return plot
