"""Summaries for people (rich tables) and for scripts (JSON), from `summary.Summary` objects.

Every table says how many prompts and how many independent draws (keys, draws, documents:
`Summary.unit`) its cells hold: in the caption when every cell holds the same, else in each
cell; which paired test it ran, and when its cells are too few for any difference to be
significant; and when its rows come from more than one compute version.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd
from rich.console import Console, ConsoleOptions, Group
from rich.table import Table
from rich.text import Text

from bamctl.results.schema import SCHEMA_VERSION
from bamctl.results.stats import ALPHA, MCNEMAR, PERMUTATIONS, SIGN_FLIP, SIGN_FLIP_RANDOM, UNPAIRED, smallest_p
from bamctl.results.summary import UNRECORDED, Summary

BEST_STYLE = "bold green"
MISSING = "—"


def format_length(tokens: int) -> str:
    """16384 → "16k", 1536 → "1.5k", 1048576 → "1M", 1000 → "1000" (k = 1024 tokens)."""
    tokens = int(tokens)
    if tokens >= 1 << 20 and tokens % (1 << 20) == 0:
        return f"{tokens >> 20}M"
    if tokens >= 1024 and tokens % 512 == 0:
        return f"{tokens / 1024:g}k"
    return str(tokens)


def plural(count: int, noun: str) -> str:
    """1 → "1 key", 3 → "3 keys", 1200 → "1,200 keys" (nouns whose plural adds an s)."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def format_ratio(ratio: float) -> str:
    """32.0 → "32×", 1.5 → "1.5×", 0.25 → "0.25×", 1024.0 → "1,024×" (never an exponent)."""
    return f"{ratio:,.0f}×" if ratio >= 1000 else f"{ratio:.3g}×"


def format_cell(summary: Summary, length: int, model: str) -> str | None:
    """"0.95 [0.83, 0.99]" (score with its draw-level Wilson 95% interval) or "12.34" (perplexity);
    None if no rows. Where cells differ in size, each ends with its counts: "(40 prompts, 8 keys)"."""
    table = summary.table
    if summary.metric == "accuracy":
        score = table.at[length, ("score", model)]
        if _missing(score):
            return None
        text = f"{score:.2f} [{table.at[length, ('lo', model)]:.2f}, {table.at[length, ('hi', model)]:.2f}]"
    elif summary.metric == "answer_logprob":
        mean = table.at[length, ("answer_logprob", model)]
        if _missing(mean):
            return None
        lo, hi = table.at[length, ("lo", model)], table.at[length, ("hi", model)]
        text = format_logprob(mean) + ("" if _missing(lo) else f" [{format_logprob(lo)}, {format_logprob(hi)}]")
    else:
        ppl = table.at[length, ("ppl", model)]
        if _missing(ppl):
            return None
        text = f"{ppl:.2f}"
    if uniform_counts(summary) is None:
        text += f" ({counts_text(summary, int(table.at[length, ('n', model)]), int(table.at[length, ('n_draws', model)]))})"
    return text


def format_logprob(value: float) -> str:
    """-11.62, -0.25; a near-certain answer keeps its digits: -3.1e-05, never "-0.00"."""
    return f"{value:.2f}" if value == 0 or abs(value) >= 0.005 else f"{value:.1e}"


def prompt_unit(summary: Summary) -> str:
    """What one row of a cell is: prompts, or for perplexity the windows or buckets scored."""
    if summary.metric != "perplexity":
        return "prompts"
    return {"sliding": "windows", "buckets": "buckets"}.get(summary.protocol, "spans")


def counts_text(summary: Summary, n: int, n_draws: int) -> str:
    """"40 prompts, 8 keys"; "16 windows, 8 documents"."""
    return f"{_counted(n, prompt_unit(summary))}, {_counted(n_draws, summary.unit)}"


def _counted(count: int, nouns: str) -> str:
    """3, "keys" → "3 keys"; 1, "keys" → "1 key" (the units' plurals all end in s)."""
    return f"{count} {nouns[:-1] if count == 1 and nouns.endswith('s') else nouns}"


def uniform_counts(summary: Summary) -> tuple[int, int] | None:
    """(prompts, draws) when every cell of the table holds the same numbers, else None."""
    pairs = {
        (int(n), int(k))
        for n, k in zip(summary.table["n"].stack().dropna(), summary.table["n_draws"].stack().dropna())
    }
    return next(iter(pairs)) if len(pairs) == 1 else None


def paired_test_name(summary: Summary) -> str:
    """The paired tests a summary ran, as a caption names them."""
    names = {
        MCNEMAR: f"exact McNemar test, one prompt per {summary.unit[:-1]}",
        SIGN_FLIP: f"exact sign-flip permutation test over {summary.unit}",
        SIGN_FLIP_RANDOM: f"sign-flip permutation test over {summary.unit}, {PERMUTATIONS:,} seeded random flips",
        UNPAIRED: f"for models of other prompts, an unpaired two-sample permutation test over {summary.unit}, "
                  f"{PERMUTATIONS:,} seeded shuffles",
    }
    return "; ".join(names[t] for t in dict.fromkeys(r.test for r in summary.paired))


def prompt_lines(summary: Summary) -> list[str]:
    """Models of this table that saw other prompts (another tokenizer built them from the same seeds
    and lengths): why they are tested unpaired."""
    if not summary.other_prompts:
        return []
    one = len(summary.other_prompts) == 1
    how = "tested unpaired" if summary.metric != "perplexity" else \
        f"not tested ({'its perplexity is' if one else 'their perplexities are'} of other tokens)"
    return [f"{', '.join(summary.other_prompts)} saw other prompts than the rest (another tokenizer, the same seeds "
            f"and lengths): no prompt pairs with one of theirs, so {'it is' if one else 'they are'} {how}"]


def unread_lines(summary: Summary) -> list[str]:
    """Rows a server read at another length than the plan's prompt: kept in the store, left out here."""
    return [f"{plural(rows, 'row')} of {model} left out: the server read {'its prompt' if rows == 1 else 'their prompts'} "
            "at another length than sent (served_token_gap)" for model, rows in summary.unread]


def reach_lines(summary: Summary) -> list[str]:
    """Where the cells are too few for any paired difference to reach Holm-adjusted p < ALPHA, say
    so and how many draws it would take (one line for the models that share the figures)."""
    grouped: dict[tuple, list[str]] = {}
    for r in summary.out_of_reach:
        key = (r.lengths, r.n_draws, r.n_draws_fewest, r.p_min, r.p_holm_floor, r.draws_needed)
        grouped.setdefault(key, []).append(r.model)
    unit, lines = summary.unit, []
    for (lengths, most, fewest, p_min, _capped, needed), models in grouped.items():
        draws = _counted(most, unit) if most == fewest else f"at most {_counted(most, unit)}"
        smallest = f"2/2^{most} = {p_min:.3g}" if p_min == smallest_p(most, True) else f"{p_min:.3g}"
        product = lengths * p_min  # Holm's floor, before it is capped at 1
        lines.append(
            f"with {draws} per cell no difference of {', '.join(models)} from {summary.baseline} can reach "
            f"p < {ALPHA:g}: the smallest p is {smallest}, and Holm over {lengths} length{'s' if lengths > 1 else ''} "
            f"makes it {lengths} × {p_min:.3g} = {product:.3g}{', a p of 1 once capped' if product > 1 else ''}; that takes ≥ {needed} {unit} per cell "
            f"(the smallest k with {lengths} × 2/2^k < {ALPHA:g})"
        )
    return lines


def dtype_lines(summary: Summary) -> list[str]:
    """Models of the same comparison that ran in another precision sit in a table of their own: say
    which, and how to set them side by side (``--dtype auto`` resolves per back-end: vLLM runs a
    float32 model in bfloat16 on the CPU, transformers in float32)."""
    return [f"{', '.join(models)} ran in {dtype}, not {summary.dtype}: {'its' if len(models) == 1 else 'their'} rows are "
            f"in the [{dtype}] table (rows of two precisions are never pooled; one --dtype for every model sets them "
            f"side by side)" for dtype, models in summary.other_dtypes]


def version_name(version: str | None) -> str:
    return UNRECORDED if version is None else (f"{version[:8]}…" if len(version) > 8 else version)


def version_lines(summary: Summary) -> list[str]:
    """"rows of 2 compute versions: a1b2c3d4…, d4e5f6a7…"; "includes rows of compute version X reused (--reuse)"."""
    lines = []
    if len(summary.compute_versions) > 1:
        names = ", ".join(version_name(v) for v in summary.compute_versions)
        lines.append(f"rows of {len(summary.compute_versions)} compute versions: {names}")
    if summary.reused_versions:
        names = ", ".join(version_name(v) for v in summary.reused_versions)
        plural = "s" if len(summary.reused_versions) > 1 else ""
        lines.append(f"includes rows of compute version{plural} {names} reused (--reuse)")
    return lines


def format_effective(summary: Summary, model: str, certified: bool = False) -> str:
    """"16k (32×)": effective length (or the certified one) and its multiple of the training length;
    "< 512" if the shortest length fails; "needs ≥ 35 keys per cell" where the cells hold too few
    draws for the draw-level Wilson lower bound to reach the threshold at all."""
    assert summary.effective is not None
    row = summary.effective.loc[model]
    length, ratio = (row["certified"], row["certified_ratio"]) if certified else (row["length"], row["ratio"])
    if certified and _missing(length) and not _missing(row["needs_draws"]):
        return f"needs ≥ {int(row['needs_draws'])} {summary.unit} per cell"
    if _missing(length):
        shortest = summary.table["score"][model].dropna().index.min()
        return f"< {format_length(shortest)}" if not _missing(shortest) else MISSING
    ratio = "" if _missing(ratio) else f" ({format_ratio(ratio)})"
    return f"{format_length(length)}{ratio}"


def format_relative(summary: Summary, model: str, certified: bool = False) -> str:
    """A relative effective length as ``format_effective`` writes an absolute one; "no base score" where
    the model has no cell at the base length or scores 0 there (nothing to be a share of)."""
    assert summary.relative_effective is not None
    row = summary.relative_effective.loc[model]
    length, ratio = (row["certified"], row["certified_ratio"]) if certified else (row["length"], row["ratio"])
    if _missing(row["base_score"]) or row["base_score"] <= 0:
        return "no base score"
    if certified and _missing(length) and not _missing(row["needs_draws"]):
        return f"needs ≥ {int(row['needs_draws'])} {summary.unit} per cell"
    if _missing(length):
        return f"< {format_length(int(row['base_length']))}"
    ratio = "" if _missing(ratio) else f" ({format_ratio(ratio)})"
    return f"{format_length(length)}{ratio}"


def effective_rows(summary: Summary) -> list[tuple[str, list[str]]]:
    """The effective-length rows of a table: (label, one cell per model); with ``--relative``, the
    relative ones after them."""
    if summary.effective is None:
        return []
    rows = [
        ("effective length", [format_effective(summary, m) for m in summary.models]),
        ("certified effective length", [format_effective(summary, m, certified=True) for m in summary.models]),
    ]
    if summary.relative_effective is not None:
        rows += [
            ("relative effective length", [format_relative(summary, m) for m in summary.models]),  # its share: the caption
            ("certified relative effective length", [format_relative(summary, m, certified=True) for m in summary.models]),
        ]
    return rows


def relative_caption(summary: Summary) -> str:
    """What the relative rows mean, with each model's base length and score."""
    if summary.relative_effective is None:
        return ""
    bases = ", ".join(f"{m} {row['base_score']:.2f} at {format_length(int(row['base_length']))}"
                      for m, row in summary.relative_effective.iterrows()
                      if not _missing(row["base_length"]) and not _missing(row["base_score"]))
    return (f"; relative effective length: longest length from the base up to which every tested length has a mean ≥ "
            f"{summary.relative:g} × the model's own mean at the base ({bases}); certified: every Wilson lower bound "
            f"≥ {summary.relative:g} × the base's Wilson upper bound")


def header_label(summary: Summary, model: str) -> str:
    """A column's name, marked where the caption says more: the baseline, and a model that saw other
    prompts (tested unpaired)."""
    if model == summary.baseline:
        return f"{model} (baseline)"
    return f"{model} (other prompts)" if model in summary.other_prompts else model


def caption(summary: Summary) -> str:
    counts = uniform_counts(summary)
    unit = summary.unit
    cells = (f"{counts_text(summary, *counts)} per cell; " if counts is not None
             else f"cells differ in size: each gives its {prompt_unit(summary)} and {unit}; ")
    legend = ""
    if summary.baseline is not None:
        legend = (f"; ▲/▼ better/worse than {summary.baseline} on the same {unit} ({paired_test_name(summary)}, "
                  f"Holm-adjusted over lengths, p < {ALPHA:g})")
    notes = "".join(f"; {line}" for line in prompt_lines(summary) + unread_lines(summary) + reach_lines(summary)
                    + dtype_lines(summary) + version_lines(summary))
    if summary.metric == "answer_logprob":
        return (f"{cells}mean answer log-probability (nats: the log-probabilities of the answer's scored tokens, "
                f"summed, under teacher forcing) [95% bootstrap interval over the {unit}: {unit} resampled, each "
                f"{unit[:-1]} its mean; none with one {unit[:-1]}]; highest per length in bold{legend}{notes}")
    if summary.metric == "accuracy":
        return (f"{cells}mean score [95% Wilson interval over the {unit}: each {unit[:-1]}'s mean score, n = {unit}]; best per "
                f"length in bold; effective length: longest length up to which every tested length has a mean ≥ "
                f"{summary.threshold:g}; certified: the same with the Wilson lower bound{relative_caption(summary)}{legend}{notes}")
    warning = "" if summary.scored_alike else (
        "; the models scored different tokens of the same documents (other vocabularies): their perplexities "
        "are not comparable, and no paired test is made")
    return (f"{cells}perplexity = exp(Σ nll / Σ scored tokens; tokens outside a model's vocabulary are not "
            f"scored; a document two seeds picked counts once); lowest per length in bold{legend}{warning}{notes}")


def render_summary(
    summary: Summary, models: Sequence[str] | None = None, *, with_caption: bool = True, narrow: bool = False
) -> Table:
    """Rows = lengths, columns = models (``models``: some of them); best per row highlighted; final
    row = effective length. ``narrow``: every column at its narrowest, labels, headers and effective
    lengths wrapped, a cell's number and its ▲/▼ mark whole."""
    models = summary.models if models is None else list(models)
    # Text, not markup: a title's "[bfloat16]" and a caption's "tiny-rope[vllm]" are words, not styles
    table = Table(title=Text(f"{summary.title} — {summary.metric}", style="table.title"),
                  caption=Text(caption(summary), style="table.caption") if with_caption else None, caption_justify="left")
    table.add_column("length", justify="right", no_wrap=not narrow, width=_length_width(summary) if narrow else None)
    for model in models:
        width = _number_width(summary, model) if narrow else None
        table.add_column(Text(header_label(summary, model)), justify="right", no_wrap=not narrow, width=width)  # Text: a name is not markup
    best = summary.best
    for length in summary.lengths:
        cells: list[Text] = [Text(format_length(length))]
        for model in models:
            text = format_cell(summary, length, model)
            if text is None:
                cells.append(Text(MISSING, style="dim"))
            else:
                mark = summary.mark(length, model)
                text = f"{text} {mark}" if mark else text
                cells.append(Text(text, style=BEST_STYLE if model in best.get(length, ()) else ""))
        table.add_row(*cells)
    rows = effective_rows(summary)
    if rows:
        table.add_section()
    shown = [summary.models.index(m) for m in models]
    for label, values in rows:
        table.add_row(Text(label, style="bold"), *[Text(values[i]) for i in shown])
    return table


def _number_cell(summary: Summary, length: int, model: str) -> str:
    text = format_cell(summary, length, model)
    if text is None:
        return MISSING
    mark = summary.mark(length, model)
    return f"{text} {mark}" if mark else text


def _number_width(summary: Summary, model: str) -> int:
    """The narrowest a model's column can be: its widest number with its mark, or its header's longest word."""
    numbers = [len(_number_cell(summary, length, model)) for length in summary.lengths]
    return max([*numbers, *(len(word) for word in header_label(summary, model).split())])


def _length_width(summary: Summary) -> int:
    words = [word for label, _ in effective_rows(summary) for word in label.split()]
    return max(len(text) for text in [*(format_length(length) for length in summary.lengths), *words, "length"])


def _fitting_width(summary: Summary, models: Sequence[str]) -> int:
    """Columns at their narrowest, each with its padding and rule (rich's default box), and the outer rule."""
    return sum(width + 3 for width in [_length_width(summary), *(_number_width(summary, m) for m in models)]) + 1


def _natural_width(summary: Summary) -> int:
    """The table's width with nothing wrapped."""
    columns = [["length", *(format_length(length) for length in summary.lengths), *(label for label, _ in effective_rows(summary))]]
    for i, model in enumerate(summary.models):
        column = [header_label(summary, model), *(_number_cell(summary, length, model) for length in summary.lengths)]
        columns.append(column + [values[i] for _, values in effective_rows(summary)])
    return sum(max(len(text) for text in column) + 3 for column in columns) + 1


class FittedSummary:
    """One summary's table, split into tables of fewer model columns where the console is too
    narrow for all of them: rich would otherwise cut every cell short, ▲/▼ marks first. Each
    part repeats the length column; the caption follows the last part."""

    def __init__(self, summary: Summary):
        self.summary = summary

    def parts(self, width: int) -> list[list[str]]:
        """The models of each part: as many as fit ``width`` at their narrowest, one at least."""
        models, parts, start = self.summary.models, [], 0
        while start < len(models):
            end = start + 1
            while end < len(models) and _fitting_width(self.summary, models[start:end + 1]) <= width:
                end += 1
            parts.append(models[start:end])
            start = end
        return parts

    def __rich_console__(self, console: Console, options: ConsoleOptions):
        if _natural_width(self.summary) <= options.max_width:
            yield render_summary(self.summary)
            return
        parts = self.parts(options.max_width)
        for i, models in enumerate(parts):
            yield render_summary(self.summary, models, with_caption=i == len(parts) - 1, narrow=True)


def render_summaries(summaries: Sequence[Summary]) -> Group:
    """All summaries, one table each (split to fit the console's width), ready for `Console.print`."""
    return Group(*[FittedSummary(s) for s in summaries])


def summary_to_dict(summary: Summary) -> dict[str, Any]:
    """The JSON form of one summary: the same numbers as the table, NaN as null."""
    table = summary.table
    fields = [f for f in dict.fromkeys(table.columns.get_level_values("field")) if f != "train_length"]
    best = summary.best
    cells = []
    for length in summary.lengths:
        for model in summary.models:
            n = table.at[length, ("n", model)]
            if _missing(n):
                continue
            cell: dict[str, Any] = {"model": model, "length": length}
            for field in fields:
                value = table.at[length, (field, model)]
                cell[field] = int(value) if field in ("n", "n_draws", "n_scored") else _json_float(value)
            cell["best"] = model in best.get(length, ())
            cells.append(cell)
    out: dict[str, Any] = {
        "task": summary.task,
        "protocol": summary.protocol,
        "setting": summary.setting,
        "fingerprint": summary.fingerprint,
        "dtype": summary.dtype,
        "metric": summary.metric,
        "draw_unit": summary.unit,
        "compute_versions": list(summary.compute_versions),
        "reused_compute_versions": None if summary.reused_versions is None else list(summary.reused_versions),
        "models": summary.models,
        "lengths": summary.lengths,
        "train_length": {m: int(table[("train_length", m)].iloc[0]) for m in summary.models},
        "cells": cells,
        "threshold": summary.threshold if summary.metric == "accuracy" else None,
        "effective_length": None,
        "baseline": summary.baseline,
        "paired": [r.to_dict() for r in summary.paired],
        "out_of_reach": [r.to_dict() for r in summary.out_of_reach],
        "other_prompts": list(summary.other_prompts),
        "unread_rows": {model: rows for model, rows in summary.unread},
    }
    if summary.effective is not None:
        out["effective_length"] = [
            {
                "model": model,
                "length": None if _missing(row["length"]) else int(row["length"]),
                "train_length": None if _missing(row["train_length"]) else int(row["train_length"]),
                "ratio": _json_float(row["ratio"]),
                "certified_length": None if _missing(row["certified"]) else int(row["certified"]),
                "certified_ratio": _json_float(row["certified_ratio"]),
                "certified_needs_draws": None if _missing(row["needs_draws"]) else int(row["needs_draws"]),
            }
            for model, row in summary.effective.iterrows()
        ]
    out["relative_effective_length"] = None
    if summary.relative_effective is not None:
        out["relative_effective_length"] = [
            {
                "model": model,
                "relative": summary.relative,
                "base_length": None if _missing(row["base_length"]) else int(row["base_length"]),
                "base_score": _json_float(row["base_score"]),
                "length": None if _missing(row["length"]) else int(row["length"]),
                "ratio": _json_float(row["ratio"]),
                "certified_length": None if _missing(row["certified"]) else int(row["certified"]),
                "certified_ratio": _json_float(row["certified_ratio"]),
                "certified_needs_draws": None if _missing(row["needs_draws"]) else int(row["needs_draws"]),
            }
            for model, row in summary.relative_effective.iterrows()
        ]
    return out


def summaries_to_json(summaries: Sequence[Summary]) -> dict[str, Any]:
    """`{"schema_version": SCHEMA_VERSION, "summaries": [...]}`, what `--json` prints."""
    return {"schema_version": SCHEMA_VERSION, "summaries": [summary_to_dict(s) for s in summaries]}


def _missing(value: Any) -> bool:
    return value is None or bool(pd.isna(value))


def _json_float(value: Any) -> float | None:
    if _missing(value):
        return None
    value = float(value)
    return None if math.isnan(value) or math.isinf(value) else value

