"""Exports parse in their own tools' terms; plots are real PNG files."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest

from bamctl.errors import BamctlError
from bamctl.results.export import export, latex_escape
from bamctl.results.plots import plot_curves, plot_grid, plot_heatmap
from bamctl.results.schema import SCHEMA_VERSION, rows_to_table
from bamctl.results.store import to_pandas
from bamctl.results.summary import summarize

from results_fakes import fake_row, passkey_grid, perplexity_rows

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return to_pandas(rows_to_table(passkey_grid() + perplexity_rows()))


@pytest.fixture(scope="module")
def summaries(frame):
    return summarize(frame)


def test_csv_parses_with_pandas(summaries):
    long = pd.read_csv(io.StringIO(export(summaries, "csv")))
    assert {"model", "length", "score", "lo", "hi", "ppl", "n"} <= set(long.columns)
    assert len(long) == 2 * 4 + 2 * 2
    row = long[(long.model == "tiny-rope") & (long.length == 1024) & (long.task == "passkey")].iloc[0]
    assert row.score == 0.25 and (row.n, row.n_draws) == (12, 4)

    wide = pd.read_csv(io.StringIO(export(summaries, "csv", pivot=True)))
    assert list(wide.columns) == ["task", "protocol", "setting", "fingerprint", "dtype", "metric", "length", "tiny-bam", "tiny-rope"]
    assert wide.loc[(wide.task == "passkey") & (wide.length == 1024), "tiny-rope"].item() == 0.25


def test_json_parses(summaries):
    doc = json.loads(export(summaries, "json"))
    assert doc["schema_version"] == SCHEMA_VERSION and len(doc["summaries"]) == 2
    records = json.loads(export(summaries, "json", pivot=True))
    assert {r["length"] for r in records} == {512, 1024, 2048, 4096}
    assert records[0]["tiny-bam"] == pytest.approx(11 / 12)


def test_latex_is_a_tabular_environment(summaries):
    text = export(summaries, "latex", pivot=True)
    assert text.count("\\begin{tabular}{lrr}") == 2 and text.count("\\end{tabular}") == 2
    assert "effective length & 2k (4$\\times$) & 512 (1$\\times$) \\\\" in text
    assert "\\textbf{0.92 [0.43, 0.99]}" in text  # the key-level Wilson interval (test_results_summary)
    assert "% 12 prompts, 4 keys per cell" in text
    long = export(summaries, "latex")
    assert long.startswith("\\begin{tabular}") and "ppl & sliding &  & tiny-rope" in long
    assert latex_escape("a_b & 50% #1") == "a\\_b \\& 50\\% \\#1"


def test_markdown_is_a_pipe_table(summaries):
    text = export(summaries, "markdown", pivot=True)
    lines = text.splitlines()
    assert "| length | tiny-bam | tiny-rope |" in lines
    assert "|:---|---:|---:|" in lines
    # tiny-rope at 1k: key 0 right at every depth, keys 1-3 wrong: Wilson on 1 of 4 keys
    assert "| 1k | **0.92 [0.43, 0.99]** | 0.25 [0.05, 0.70] |" in lines
    assert "_12 prompts, 4 keys per cell_" in lines and "_2 windows, 2 documents per cell_" in lines
    assert "| effective length | 2k (4×) | 512 (1×) |" in lines
    table_lines = [l for l in export(summaries, "markdown").splitlines() if l]
    assert all(l.startswith("|") and l.endswith("|") for l in table_lines)
    assert len({l.count("|") for l in table_lines}) == 1  # every row has every column


def test_unknown_format(summaries):
    with pytest.raises(ValueError, match="unknown export format"):
        export(summaries, "xlsx")


def test_curves_png(frame, tmp_path):
    path = plot_curves(frame, tmp_path / "sub" / "curves.png")
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000


def test_heatmap_png(frame, tmp_path):
    path = plot_heatmap(frame, tmp_path / "heatmap.png", models=["tiny-rope"])
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000


def test_heatmap_needs_depths(tmp_path):
    ppl_only = to_pandas(rows_to_table(perplexity_rows()))
    with pytest.raises(BamctlError, match="needle depth"):
        plot_heatmap(ppl_only, tmp_path / "h.png")


def test_grid_png_with_marks(tmp_path):
    rows = [
        fake_row(model, length=length, sample=i, score=float(score), depth=0.5)
        for length in (1024, 2048)
        for i in range(20)
        for model, score in (("tiny-rope", i < 10), ("tiny-bam", i < 19))
    ]
    frame = to_pandas(rows_to_table(rows + perplexity_rows()))
    path = plot_grid(frame, tmp_path / "grid.png", baseline="tiny-rope")
    assert path.read_bytes()[:8] == PNG_SIGNATURE and path.stat().st_size > 10_000


def ruler_rows(n: int = 60) -> list[dict]:
    """RULER rows as its default placement leaves them: no asked depth, a random needle depth."""
    import random

    from results_fakes import fake_row

    rng, rows = random.Random(0), []
    for i in range(n):
        row = fake_row("tiny-rope", task="niah_single_1", protocol="ruler", scoring="generate", depth=None,
                       length=1024 * (1 + i % 2), sample=i, score=float(i % 3 == 0))
        row["needle_depth"] = 1.0 if i == 0 else rng.random()
        rows.append(row)
    return rows


def test_a_small_depth_grid_keeps_one_row_per_depth():
    from bamctl.results.plots import depth_rows

    rows, labels = depth_rows(pd.Series([0.0, 0.25, 0.5, 0.25, 1.0]))
    assert rows.tolist() == [0, 1, 2, 1, 3] and labels == ["0", "25", "50", "100"]


def test_random_depths_fall_into_ten_bins():
    from bamctl.results.plots import depth_rows

    depths = pd.Series([i / 97 for i in range(98)] + [0.05, 0.1, 0.999])
    rows, labels = depth_rows(depths)
    assert labels == ["0-10", "10-20", "20-30", "30-40", "40-50", "50-60", "60-70", "70-80", "80-90", "90-100"]
    assert rows.iloc[0] == 0 and rows.iloc[97] == 9  # depth 1.0 goes into the last bin
    assert rows.iloc[-3:].tolist() == [0, 1, 9]


def test_ruler_heatmap_bins_needle_depths_and_plots_the_chosen_metric(tmp_path):
    from bamctl.results.plots import depth_rows, heatmap_grid

    frame = to_pandas(rows_to_table(ruler_rows()))
    rows, labels = depth_rows(frame["needle_depth"])
    grid = heatmap_grid(frame.assign(_row=rows), "score", len(labels), [1024, 2048])
    assert grid.shape == (10, 2)
    in_first_bin = frame[(frame["needle_depth"] < 0.1) & (frame["length"] == 1024)]
    assert grid[0, 0] == pytest.approx(in_first_bin["score"].mean())
    for metric in ("score", "seconds", "correct"):
        path = plot_heatmap(frame, tmp_path / f"{metric}.png", metric=metric)
        assert path.read_bytes().startswith(PNG_SIGNATURE)


def test_heatmap_metric_must_be_a_numeric_column(tmp_path):
    frame = to_pandas(rows_to_table(ruler_rows(10)))
    with pytest.raises(BamctlError, match="did you mean score"):
        plot_heatmap(frame, tmp_path / "h.png", metric="scroe")
    with pytest.raises(BamctlError, match="not numeric"):
        plot_heatmap(frame, tmp_path / "h.png", metric="task")
