"""Summary tables for papers and spreadsheets: CSV, Markdown (pipe table), LaTeX (tabular), JSON.

Long form (default): one line per (task, protocol, setting, model, length) with every number,
the cell's prompts (`n`) and independent draws (`n_draws`: keys, draws, documents) among them.
Pivot form (`pivot=True`): rows = lengths, columns = models. CSV and JSON pivots hold plain
numbers (score, or perplexity) for scripts; Markdown and LaTeX pivots hold the formatted
cells of `bamctl results show` ("0.95 [0.83, 0.99]"), best per length in bold, an
effective-length row and a line under the table with what its caption must not lose: the
prompts and draws per cell, whether a difference could be significant at all, the compute
versions of its rows: one table per (task, protocol, setting).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pandas as pd

from bamctl.results.render import (
    MISSING,
    counts_text,
    effective_rows,
    format_cell,
    format_length,
    header_label,
    prompt_lines,
    reach_lines,
    summaries_to_json,
    uniform_counts,
    version_lines,
)
from bamctl.results.summary import Summary

FORMATS = ("csv", "markdown", "latex", "json")
LONG_COLUMNS = (
    "task", "protocol", "setting", "fingerprint", "dtype", "metric", "model", "length", "train_length",
    "n", "n_draws", "score", "k", "lo", "hi", "ppl", "nll", "n_scored",
)
KEY = ["task", "protocol", "setting", "fingerprint", "dtype", "metric", "length"]


def long_frame(summaries: Sequence[Summary]) -> pd.DataFrame:
    """Every cell of every summary as one row; fields a metric lacks are NaN."""
    rows: list[dict[str, Any]] = []
    for s in summaries:
        for length in s.lengths:
            for model in s.models:
                if pd.isna(s.table.at[length, ("n", model)]):
                    continue
                row = {"task": s.task, "protocol": s.protocol, "setting": s.setting, "fingerprint": s.fingerprint, "dtype": s.dtype,
                       "metric": s.metric, "model": model, "length": length}
                for field in dict.fromkeys(s.table.columns.get_level_values("field")):
                    row[field] = s.table.at[length, (field, model)]
                rows.append(row)
    frame = pd.DataFrame(rows, columns=list(LONG_COLUMNS))
    for column in ("length", "train_length", "n", "n_draws", "n_scored"):
        frame[column] = frame[column].astype("Int64")
    return frame


def pivot_frame(summaries: Sequence[Summary]) -> pd.DataFrame:
    """Rows = (task, protocol, setting, fingerprint, dtype, metric, length), columns = models, value = score or perplexity."""
    frame = long_frame(summaries)
    frame["value"] = frame["score"].where(frame["metric"] == "accuracy", frame["ppl"])
    models = list(dict.fromkeys(m for s in summaries for m in s.models))
    wide = frame.pivot(index=KEY, columns="model", values="value").reindex(columns=models)
    wide.columns.name = None
    return wide.reset_index()


STATS_COLUMNS = ("task", "protocol", "setting", "fingerprint", "dtype", "model", "baseline", "length", "n", "n_draws",
                 "test", "difference", "lo", "hi", "p", "p_min", "p_holm")


def stats_frame(summaries: Sequence[Summary]) -> pd.DataFrame:
    """The paired tests of every summary, one row per (model, length) against its baseline."""
    rows = [
        {"task": s.task, "protocol": s.protocol, "setting": s.setting, "fingerprint": s.fingerprint, "dtype": s.dtype, **r.to_dict()}
        for s in summaries
        for r in s.paired
    ]
    frame = pd.DataFrame(rows, columns=list(STATS_COLUMNS))
    frame["length"] = frame["length"].astype("Int64")
    frame["n"] = frame["n"].astype("Int64")
    frame["n_draws"] = frame["n_draws"].astype("Int64")
    return frame


def export_stats(summaries: Sequence[Summary], fmt: str) -> str:
    """The paired statistics as text in `fmt`, for a paper table."""
    frame = stats_frame(summaries)
    if fmt == "csv":
        return frame.to_csv(index=False)
    if fmt == "json":
        records = frame.astype(object).where(frame.notna(), None).to_dict(orient="records")
        return json.dumps(records, indent=2, default=int) + "\n"
    header = ["task", "protocol", "model", "baseline", "length", "n", "draws", "test", "difference", "95% interval",
              "p (Holm)"]
    rows = [
        [r.task, r.protocol, r.model, r.baseline, format_length(r.length), str(r.n), str(r.n_draws), r.test,
         f"{r.difference:+.3f}", f"[{r.lo:+.3f}, {r.hi:+.3f}]", f"{r.p_holm:.3g}"]
        for r in frame.itertuples(index=False)
    ]
    return (markdown_table if fmt == "markdown" else latex_table)(header, rows, bold=None, left=4)


def export(summaries: Sequence[Summary], fmt: str, *, pivot: bool = False, stats: bool = False) -> str:
    """The summaries as text in `fmt` (one of FORMATS); ``stats``: their paired tests instead."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; choose from {', '.join(FORMATS)}")
    if stats:
        return export_stats(summaries, fmt)
    if fmt == "csv":
        return (pivot_frame(summaries) if pivot else long_frame(summaries)).to_csv(index=False)
    if fmt == "json":
        if pivot:
            frame = pivot_frame(summaries).astype(object)
            records = frame.where(frame.notna(), None).to_dict(orient="records")  # NaN → null
            return json.dumps(records, indent=2, default=int) + "\n"
        return json.dumps(summaries_to_json(summaries), indent=2) + "\n"
    writer = markdown_table if fmt == "markdown" else latex_table
    if not pivot:
        header, rows = _long_text(summaries)
        return writer(header, rows, bold=None, left=4)
    blocks = []
    for s in summaries:
        header, rows, bold = _pivot_text(s)
        title = f"{s.title} — {s.metric}"
        notes = table_notes(s)
        if fmt == "markdown":
            blocks.append(f"**{title}**\n\n" + markdown_table(header, rows, bold=bold) + "".join(f"\n_{n}_\n" for n in notes))
        else:
            blocks.append(f"% {title}\n" + latex_table(header, rows, bold=bold) + "".join(f"% {n}\n" for n in notes))
    return "\n".join(blocks)


def markdown_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], *, bold: Sequence[Sequence[bool]] | None, left: int = 1
) -> str:
    """A GitHub pipe table; the first `left` columns left-aligned (labels), the rest right-aligned (numbers)."""
    def cell(text: str, strong: bool) -> str:
        text = text.replace("|", r"\|")
        return f"**{text}**" if strong and text else text

    lines = ["| " + " | ".join(cell(h, False) for h in header) + " |"]
    lines.append("|" + "|".join([":---"] * left + ["---:"] * (len(header) - left)) + "|")
    for i, row in enumerate(rows):
        lines.append("| " + " | ".join(cell(t, bool(bold and bold[i][j])) for j, t in enumerate(row)) + " |")
    return "\n".join(lines) + "\n"


def latex_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], *, bold: Sequence[Sequence[bool]] | None, left: int = 1
) -> str:
    """A `tabular` environment with booktabs rules (needs \\usepackage{booktabs}); `left` as in markdown_table."""
    def cell(text: str, strong: bool) -> str:
        text = latex_escape(text)
        return f"\\textbf{{{text}}}" if strong and text else text

    lines = [f"\\begin{{tabular}}{{{'l' * left}{'r' * (len(header) - left)}}}", "\\toprule"]
    lines.append(" & ".join(cell(h, False) for h in header) + r" \\")
    lines.append("\\midrule")
    for i, row in enumerate(rows):
        if row and row[0] == "effective length":  # the certified row follows it
            lines.append("\\midrule")
        lines.append(" & ".join(cell(t, bool(bold and bold[i][j])) for j, t in enumerate(row)) + r" \\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


_LATEX_SPECIALS = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
    "×": r"$\times$", "—": "--", "≥": r"$\geq$", "<": r"$<$", ">": r"$>$",
    "▲": r"$\blacktriangle$", "▼": r"$\blacktriangledown$",  # amssymb
}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIALS.get(ch, ch) for ch in text)


def table_notes(s: Summary) -> list[str]:
    """The lines under a pivot table: its cells' counts (when they are all alike: else each cell
    gives its own), and the caption's notes on models of other prompts, reach and compute versions."""
    counts = uniform_counts(s)
    head = [f"{counts_text(s, *counts)} per cell"] if counts is not None else []
    return head + prompt_lines(s) + reach_lines(s) + version_lines(s)


def _pivot_text(s: Summary) -> tuple[list[str], list[list[str]], list[list[bool]]]:
    header = ["length", *(header_label(s, m) for m in s.models)]
    best = s.best
    rows, bold = [], []
    for length in s.lengths:
        cells = [" ".join(filter(None, (format_cell(s, length, m) or MISSING, s.mark(length, m)))) for m in s.models]
        rows.append([format_length(length), *cells])
        bold.append([False] + [m in best.get(length, ()) for m in s.models])
    for label, values in effective_rows(s):
        rows.append([label, *values])
        bold.append([False] * (len(s.models) + 1))
    return header, rows, bold


def _long_text(summaries: Sequence[Summary]) -> tuple[list[str], list[list[str]]]:
    frame = long_frame(summaries)
    header = ["task", "protocol", "setting", "model", "length", "n", "draws", "score", "95% interval", "perplexity"]

    def number(value: Any, spec: str) -> str:
        return "" if pd.isna(value) else format(float(value), spec)

    rows = [
        [
            r.task, r.protocol, r.setting, r.model, format_length(r.length), str(r.n), str(r.n_draws),
            number(r.score, ".3f"),
            "" if pd.isna(r.lo) else f"[{r.lo:.3f}, {r.hi:.3f}]",
            number(r.ppl, ".2f"),
        ]
        for r in frame.itertuples(index=False)
    ]
    return header, rows
