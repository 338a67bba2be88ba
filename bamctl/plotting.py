"""Writing a matplotlib figure to disk, for every module that draws one (results' plots, interpret).

matplotlib's object API only (``Figure``, Agg canvas), never pyplot: no global backend
switch, no display needed.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from bamctl.files import cannot_write


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` as a PNG, creating folders; an unwritable path is one BamctlError."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    except OSError as err:
        raise cannot_write(path, err, "plot to ") from err
    return path
