"""Tables on a narrow terminal: split into parts of fewer models, never a number or a mark cut short."""

from __future__ import annotations

import re

from rich.console import Console

from bamctl.results.render import render_summaries
from bamctl.results.summary import summarize

from results_fakes import fake_row, frame_of

OTHERS = ("tiny-bam", "tiny-alibi", "tiny-nope", "tiny-fire")


def wide_summary():
    """Five models, two lengths, 20 one-prompt keys per cell: every other model beats the baseline (▲)."""
    rows = [
        fake_row(model, length=length, sample=i, score=float(i < (10 if model == "tiny-rope" else 19)), depth=0.5)
        for length in (1024, 2048)
        for i in range(20)
        for model in ("tiny-rope", *OTHERS)
    ]
    return summarize(frame_of(rows), models=["tiny-rope", *OTHERS], baseline="tiny-rope")


def printed(width: int) -> str:
    console = Console(width=width, record=True, highlight=False)
    console.print(render_summaries(wide_summary()))
    return console.export_text()


def test_at_80_columns_every_cell_and_mark_is_whole():
    out = printed(80)
    assert out.count("] ▲") == len(OTHERS) * 2  # every mark of every length shown, after its interval
    assert "…" not in out
    for line in out.splitlines():
        assert len(line) <= 80
    table_tops = [line for line in out.splitlines() if line.startswith("┏")]
    assert len(table_tops) >= 2 and all(line.endswith("┓") for line in table_tops)  # parts, none cropped
    cells = re.findall(r"\d\.\d\d \[\d\.\d\d, \d\.\d\d\]", out)
    assert len(cells) == 5 * 2  # one per model and length, each whole
    assert out.count("length") >= len(table_tops)  # each part keeps its length column
    assert out.count("4 prompts") <= 1 and "20 prompts, 20 keys per cell" in out  # the caption once


def test_a_wide_console_keeps_one_table():
    out = printed(250)
    assert len([line for line in out.splitlines() if line.startswith("┏")]) == 1
    assert out.count("] ▲") == len(OTHERS) * 2 and "certified effective length" in out
