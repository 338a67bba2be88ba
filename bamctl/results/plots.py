"""PNG plots from result rows: accuracy against length, and depth × length heatmaps.

Uses matplotlib's object API (`Figure`, Agg canvas) and never pyplot: no global backend
switch, no display needed, safe in threads and on headless machines.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator

from bamctl.errors import BamctlError
from bamctl.plotting import save_figure
from bamctl.results.render import format_length, format_logprob
from bamctl.results.summary import GROUP_COLUMNS, is_perplexity, model_labels, summarize, with_fingerprint_labels

PANEL_INCHES = (6.0, 4.0)
ANNOTATE_MAX_CELLS = 160  # write values into heatmap cells only while they stay legible
# Colour maps that keep their meaning in greyscale print and for red-green colour-blind readers (no red
# against green): scores on cividis, whose lightness rises evenly with the value (a perceptually uniform
# map made for colour-vision deficiency), so a darker cell is always a lower score; perplexity's ratio
# to its first length on purple (lower) to orange (higher), pale at x1, each cell writing its ratio.
SCORE_COLOURS = "cividis"
RATIO_COLOURS = "PuOr_r"
RATIO_TICKS = (-2, -1, 0, 1, 2)  # log2 of the perplexity grid's ratios: ×0.25 .. ×4, its colour range
LABEL_CHARS = 32  # a model's label wraps past this many characters a line
INCHES_PER_CHAR = {"small": 0.07, "medium": 0.085}  # DejaVu Sans' mean advance at 8.3 and 10 pt, padded


def wrap_label(text: str, width: int = LABEL_CHARS) -> str:
    """``text`` in lines of at most ``width`` characters, each broken after a "/" or a space where
    one falls. Two checkpoints sharing a folder name are labelled by their whole paths; unwrapped,
    such a label takes the panel's room and constrained layout collapses it."""
    lines, line = [], ""
    for piece in re.split(r"(?<=[/ ])", text):
        if line and len(line) + len(piece) > width:
            lines.append(line.rstrip())
            line = ""
        line += piece
        while len(line) > width:  # a run with no break in it: cut it where it overflows
            lines.append(line[:width])
            line = line[width:]
    return "\n".join(lines + [line.rstrip()] if line.strip() else lines)


def label_inches(labels: Sequence[str], fontsize: str) -> float:
    """The width of the widest line among ``labels`` at ``fontsize``, estimated from its characters."""
    return INCHES_PER_CHAR[fontsize] * max((len(line) for label in labels for line in label.splitlines()), default=0)


def train_label(model: str, train: int) -> str:
    """A model as plots name it: its label and training length, wrapped to LABEL_CHARS a line."""
    return wrap_label(f"{model} (train {format_length(train)})")


def plot_curves(
    frame: pd.DataFrame, path: str | Path, *, models: Sequence[str] | None = None, threshold: float = 0.9,
    metric: str = "score",
) -> Path:
    """Accuracy (or perplexity) against length on a log2 axis, one line per model, the draw-level
    Wilson band shaded,
    each model's training length a dashed vertical line in its colour; one panel per task.
    ``metric`` "answer_logprob": the mean answer log-probability instead, its bootstrap band shaded."""
    return save_figure(curves_figure(frame, models=models, threshold=threshold, metric=metric), path)


# The column of a summary's table each kind of summary plots.
PLOTTED = {"accuracy": "score", "perplexity": "ppl", "answer_logprob": "answer_logprob"}


def curves_figure(frame: pd.DataFrame, *, models: Sequence[str] | None = None, threshold: float = 0.9,
                  metric: str = "score") -> Figure:
    """The figure of ``plot_curves``; its legend sits right of each panel, over no data."""
    if frame.empty:
        raise BamctlError("no result rows to plot")
    summaries = summarize(frame, threshold=threshold, models=models, metric=metric)
    labels = [[train_label(m, int(s.table[("train_length", m)].iloc[0])) for m in s.models] for s in summaries]
    legend_inches = 0.8 + label_inches(sum(labels, []), "small")  # beside each panel: it never covers a curve
    fig = Figure(figsize=((PANEL_INCHES[0] + legend_inches) * len(summaries), PANEL_INCHES[1]), layout="constrained")
    axes = fig.subplots(1, len(summaries), squeeze=False)[0]
    for ax, s, names in zip(axes, summaries, labels):
        value = PLOTTED[s.metric]
        for i, (model, name) in enumerate(zip(s.models, names)):
            colour = f"C{i % 10}"
            series = s.table[value][model].dropna()
            train = int(s.table[("train_length", model)].iloc[0])
            ax.plot(series.index, series.to_numpy(), marker="o", color=colour, label=name)
            if s.metric != "perplexity":
                lo, hi = s.table["lo"][model].loc[series.index], s.table["hi"][model].loc[series.index]
                ax.fill_between(series.index, lo.to_numpy(), hi.to_numpy(), color=colour, alpha=0.15, linewidth=0)
            ax.axvline(train, color=colour, linestyle="--", linewidth=1, alpha=0.8)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(s.lengths))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([format_length(x) for x in s.lengths])
        ax.set_xlabel("context length (tokens)")
        if s.metric == "accuracy":
            ax.set_ylim(-0.02, 1.02)
            ax.set_ylabel(f"accuracy (Wilson 95% band over {s.unit})")
            ax.axhline(s.threshold, color="grey", linestyle=":", linewidth=1)
        elif s.metric == "answer_logprob":
            ax.set_ylabel(f"mean answer log-prob, nats (bootstrap 95% band over {s.unit})")
        else:
            ax.set_ylabel("perplexity")
            finite = s.table["ppl"].stack().dropna()
            if len(finite) and finite.max() / max(finite.min(), 1e-12) > 10:  # blow-ups past train length
                ax.set_yscale("log")
        ax.set_title(s.title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    return fig


HEATMAP_PANEL_INCHES = 4.5
HEATMAP_TITLE_CHARS = int(HEATMAP_PANEL_INCHES / INCHES_PER_CHAR["medium"])
MAX_GRID_DEPTHS = 21  # more distinct depths than this are random placements (RULER's), drawn binned
DEPTH_BINS = 10


def depth_rows(depths: pd.Series) -> tuple[pd.Series, list[str]]:
    """Each row's heatmap row, and the rows' labels (depth in %).

    A small fixed grid (passkey's depths, ``--depths``) keeps one row per depth; more distinct
    depths than that are placements the task drew (RULER's random depths) and fall into 10
    bins of equal width, 100% in the last.
    """
    values = sorted(depths.unique())
    if len(values) <= MAX_GRID_DEPTHS:
        return depths.map({v: i for i, v in enumerate(values)}), [f"{100 * v:.0f}" for v in values]
    bins = np.clip(np.floor(depths.to_numpy(dtype=float) * DEPTH_BINS), 0, DEPTH_BINS - 1).astype(int)
    labels = [f"{100 * i // DEPTH_BINS}-{100 * (i + 1) // DEPTH_BINS}" for i in range(DEPTH_BINS)]
    return pd.Series(bins, index=depths.index), labels


def heatmap_grid(cells: pd.DataFrame, metric: str, n_rows: int, lengths: list[int]) -> np.ndarray:
    """The mean of ``metric`` per (``_row``, length): rows by depth, columns by length, NaN where empty."""
    means = cells.groupby(["_row", "length"])[metric].mean().unstack("length")
    return means.reindex(index=range(n_rows), columns=lengths).to_numpy(dtype=float)


def heatmap_metric(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """``frame`` with ``metric`` as floats; a column that is not there or not numeric is one BamctlError."""
    from bamctl.errors import did_you_mean

    if metric not in frame.columns:
        raise BamctlError(f"--metric {metric!r} is not a result column{did_you_mean(metric, list(frame.columns))}")
    column = frame[metric]
    if not (pd.api.types.is_numeric_dtype(column) or pd.api.types.is_bool_dtype(column)):
        numeric = [c for c in frame.columns if pd.api.types.is_numeric_dtype(frame[c])]
        raise BamctlError(f"--metric {metric} is not numeric; numeric columns: {', '.join(numeric)}")
    return frame.assign(**{metric: column.astype(float)})


def plot_heatmap(frame: pd.DataFrame, path: str | Path, *, models: Sequence[str] | None = None, metric: str = "score") -> Path:
    """Mean ``metric`` (score by default) per (depth, length), one panel per model (one row of panels
    per task): the needle-in-a-haystack picture. The depth is the one asked for, else where the needle
    landed, binned when the task drew it (see depth_rows); rows without a needle (perplexity) are left out."""
    return save_figure(heatmap_figure(frame, models=models, metric=metric), path)


def heatmap_figure(frame: pd.DataFrame, *, models: Sequence[str] | None = None, metric: str = "score") -> Figure:
    """The figure of ``plot_heatmap``."""
    frame = heatmap_metric(frame, metric)
    frame = frame.assign(depth=frame["depth"].fillna(frame["needle_depth"]))
    rows = frame[frame["depth"].notna()]
    if rows.empty:
        raise BamctlError("no result rows with a needle depth to plot; heatmaps need passkey or niah rows")
    rows = with_fingerprint_labels(rows).assign(_label=model_labels(rows))
    groups = [(key, g) for key, g in rows.groupby(list(GROUP_COLUMNS), sort=True) if not is_perplexity(g)]
    present = list(dict.fromkeys(sorted(rows["_label"])))
    order = [m for m in (models or []) if m in present] + [m for m in present if m not in (models or [])]
    values = rows[metric].dropna()
    bounded = values.empty or (values.min() >= 0 and values.max() <= 1)  # scores: a fixed 0..1 scale
    scale = dict(cmap=SCORE_COLOURS, vmin=0.0, vmax=1.0) if bounded else dict(cmap="viridis", vmin=values.min(), vmax=values.max())
    fig = Figure(figsize=(HEATMAP_PANEL_INCHES * len(order) + 1, 4.0 * len(groups)), layout="constrained")
    axes = fig.subplots(len(groups), len(order), squeeze=False)
    image = None
    for r, ((task, protocol, setting, *_), group) in enumerate(groups):
        row_of, labels = depth_rows(group["depth"])
        group = group.assign(_row=row_of)
        lengths = sorted(group["length"].unique())
        title = " / ".join(p for p in (task, protocol, setting) if p)
        for c, model in enumerate(order):
            ax = axes[r][c]
            cells = group[group["_label"] == model]
            grid = heatmap_grid(cells, metric, len(labels), lengths)
            image = ax.imshow(grid, aspect="auto", interpolation="nearest", **scale)
            ax.set_xticks(range(len(lengths)), [format_length(x) for x in lengths])
            step = max(1, len(labels) // 10)
            ax.set_yticks(range(0, len(labels), step), labels[::step])
            ax.set_xlabel("context length (tokens)")
            ax.set_ylabel("needle depth (%)")
            ax.set_title(wrap_label(f"{model} — {title}", HEATMAP_TITLE_CHARS), fontsize="medium")
            if not cells.empty:
                train = int(cells["train_length"].max())
                beyond = int(np.searchsorted(lengths, train, side="right"))  # columns past the training length
                if 0 < beyond < len(lengths):
                    ax.axvline(beyond - 0.5, color="black", linestyle="--", linewidth=1)
            if grid.size <= ANNOTATE_MAX_CELLS:
                _annotate(ax, image, grid, bounded)
    fig.colorbar(image, ax=axes.ravel().tolist(), label=f"mean {metric}", shrink=0.8)
    return fig


def _annotate(ax, image, grid: np.ndarray, bounded: bool) -> None:
    for (y, x), v in np.ndenumerate(grid):
        if np.isnan(v):
            continue
        ax.text(x, y, f"{v:.2f}" if bounded else f"{v:.3g}", ha="center", va="center", fontsize=7,
                color=ink_on(image.to_rgba(v)))


def ink_on(colour) -> str:
    """White on a dark cell, black on a light one: by the cell's relative luminance (WCAG's), at the
    value (0.18) where both inks contrast with it equally."""
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in colour[:3]]
    luminance = 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]
    return "white" if luminance < 0.18 else "black"


def plot_grid(
    frame: pd.DataFrame, path: str | Path, *, models: Sequence[str] | None = None, threshold: float = 0.9,
    baseline: str | None = None, metric: str = "score",
) -> Path:
    """Models × lengths, each cell coloured by its value and the number written in it; one panel per
    task. Accuracy: dark to light on [0, 1] (cividis: readable in greyscale and without telling
    red from green), ▲/▼ where a model differs significantly from the baseline. Perplexity:
    coloured by the ratio to the model's own perplexity at its shortest length (log scale), so a
    flat row stays pale and a blow-up turns orange; each cell writes that ratio under its
    perplexity, so the colour can be read. Legible with many models, where
    overlaid curves and bands are not: the default picture of `compare`. ``metric``
    "answer_logprob": each cell the mean answer log-probability, coloured over the panel's own range."""
    return save_figure(grid_figure(frame, models=models, threshold=threshold, baseline=baseline, metric=metric), path)


def grid_figure(
    frame: pd.DataFrame, *, models: Sequence[str] | None = None, threshold: float = 0.9, baseline: str | None = None,
    metric: str = "score",
) -> Figure:
    """The figure of ``plot_grid``."""
    if frame.empty:
        raise BamctlError("no result rows to plot")
    summaries = summarize(frame, threshold=threshold, models=models, baseline=baseline, metric=metric)
    labels = [[train_label(m, int(s.table[("train_length", m)].iloc[0])) for m in s.models] for s in summaries]
    keys = [f"\n▲/▼ vs {s.baseline}, Holm p\u00a0<\u00a00.05" if s.baseline else "" for s in summaries]
    longest_title = max(len(line) for s, key in zip(summaries, keys) for line in (s.title + key).splitlines())
    panel_inches = max(2.5, 0.85 * max(len(s.lengths) for s in summaries), INCHES_PER_CHAR["medium"] * min(longest_title, 40))
    width = panel_inches + 1.2 + label_inches(sum(labels, []), "medium")  # + the colour bar, + the model labels
    title_chars = int(panel_inches / INCHES_PER_CHAR["medium"])  # a title is centred over its panel: no wider
    titles = [wrap_label(s.title, title_chars) + wrap_label(key, title_chars) for s, key in zip(summaries, keys)]
    row_inches = max(0.45, 0.18 * max(label.count("\n") + 1 for label in sum(labels, [])))
    height = sum(row_inches * len(s.models) + 1.1 + 0.18 * (t.count("\n") + 1) for s, t in zip(summaries, titles))
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(len(summaries), 1, squeeze=False, height_ratios=[len(s.models) + 2 for s in summaries])[:, 0]
    for ax, s, names, title in zip(axes, summaries, labels, titles):
        grid = s.table[PLOTTED[s.metric]].T.reindex(s.models).to_numpy(dtype=float)  # (models, lengths)
        if s.metric == "accuracy":
            image = ax.imshow(grid, cmap=SCORE_COLOURS, vmin=0.0, vmax=1.0, aspect="auto")
            colour_bar_label = "accuracy"
        elif s.metric == "answer_logprob":  # unbounded below: the panel's own range, higher lighter as scores
            image = ax.imshow(grid, cmap=SCORE_COLOURS, vmin=np.nanmin(grid), vmax=np.nanmax(grid), aspect="auto")
            colour_bar_label = "mean answer log-prob (nats)"
        else:
            first = np.array([row[~np.isnan(row)][0] if (~np.isnan(row)).any() else np.nan for row in grid])
            ratio = grid / first[:, None]
            image = ax.imshow(np.log2(ratio), cmap=RATIO_COLOURS, vmin=-2.0, vmax=2.0, aspect="auto")
            colour_bar_label = "ppl ÷ ppl at first length"
        for (row, column), number in np.ndenumerate(grid):
            if np.isnan(number):
                continue
            mark = s.mark(s.lengths[column], s.models[row])
            if s.metric == "answer_logprob":
                text = f"{format_logprob(number)}{mark}"
            elif s.metric == "accuracy":
                text = f"{number:.2f}{mark}"
            else:  # the number the colour shows, under the perplexity itself
                text = f"{_perplexity_label(number)}{mark}\n×{_ratio_label(ratio[row, column])}"
            shown = number if s.metric != "perplexity" else np.log2(ratio[row, column])
            ax.text(column, row, text, ha="center", va="center", fontsize=8 if s.metric != "perplexity" else 7,
                    color=ink_on(image.to_rgba(shown)))
        ax.set_xticks(range(len(s.lengths)), [format_length(x) for x in s.lengths])
        ax.set_yticks(range(len(s.models)), names)
        ax.set_xlabel("context length (tokens)")
        ax.set_title(title, fontsize="medium")
        bar = fig.colorbar(image, ax=ax, label=colour_bar_label, shrink=0.9)
        if s.metric == "perplexity":  # the colour is log2 of the ratio each cell writes: label it as ratios
            bar.set_ticks(RATIO_TICKS, labels=[f"×{2.0 ** t:g}" for t in RATIO_TICKS])
    return fig


def _ratio_label(value: float) -> str:
    """×1.00, ×0.87, ×12.3, ×4.1e+03: the perplexity's multiple of its first length's."""
    return f"{value:.3g}" if value < 1000 else f"{value:.2g}"


def _perplexity_label(value: float) -> str:
    """Three significant digits without exponents: 4.52, 45.2, 452, 3835."""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"
