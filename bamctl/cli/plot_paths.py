"""Where a plot of a results directory goes: never where a Parquet reader of the results meets it.

A results directory is a plain Parquet dataset, and so is a folder above it that holds
nothing but results: ``results/`` for ``--dir results/main`` (``pandas.read_parquet("results")``
reads each run below it). A PNG in any of them breaks such a read (ArrowInvalid) or, once
removed by hand, invites one that mixes runs unnoticed. So a plot goes beside the topmost
such folder, never inside it; a folder that holds other things too (a project, a scratch
folder) is no dataset, and a plot may go there.
"""

from __future__ import annotations

from pathlib import Path

from bamctl.errors import BamctlError
from bamctl.files import check_writable


def results_root(results: Path) -> Path:
    """The outermost folder, ``results`` or above it inside the working directory, that holds
    nothing but results directories (``results/`` for ``--dir results/main``; a folder yet to
    be made counts). Folders outside the working directory are the user's own layout: only
    ``results`` itself is then kept clear."""
    here, root = Path.cwd().resolve(), results.resolve()
    folder = root.parent
    while folder.is_relative_to(here) and folder != here and _holds_only_results(folder, root):
        root, folder = folder, folder.parent
    return root


def _holds_only_results(folder: Path, known: Path) -> bool:
    """Whether every visible entry of ``folder`` is ``known``, a Parquet file or a results directory."""
    if not folder.is_dir():
        return True  # made by this run, to hold the results alone
    for entry in folder.iterdir():
        if entry.name.startswith((".", "_")) or entry == known or entry.suffix == ".parquet":
            continue
        if not (entry.is_dir() and (any(entry.glob("*.parquet")) or any(entry.glob("*/*.parquet")))):
            return False
    return True


def plot_path(results: Path, plot: Path | None, name: str) -> Path:
    """``plot``, or by default ``ROOT-SUB-NAME.png`` beside the results' root (``results-main-passkey.png``
    for ``--dir results/main``); a path inside that root, or one that cannot be written, is refused
    with one line, before the work whose figure it is (compare draws after its sweep)."""
    root = results_root(results)
    if plot is None:
        parts = Path(results.resolve()).relative_to(root.parent).parts
        plot = root.parent / f"{'-'.join(parts)}-{name}.png"
    elif plot.resolve().is_relative_to(root):
        where = "the results directory" if root == results.resolve() else f"{root}, which holds the results directory"
        raise BamctlError(
            f"--plot {plot} is inside {where} {results}: Parquet readers of it would meet the image; "
            f"put it beside it, e.g. plots/{plot.name}"
        )
    check_writable(plot, "plot to ")
    return plot
