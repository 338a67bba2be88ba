"""Effective length relative to a model's own short-context score (``--relative``, ``--base-length``):
NoLiMa's rule, beside the absolute one, and its certified form (draw-level Wilson bounds)."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from bamctl.cli import main
from bamctl.cli.app import app
from bamctl.errors import BamctlError
from bamctl.results.render import render_summary, summaries_to_json
from bamctl.results.store import ResultStore
from bamctl.results.summary import min_certifiable_n, relative_effective_length, summarize, wilson_interval
from results_fakes import fake_row, frame_of, keys_found


# A weak small model: half its keys at the shortest length, fading slowly, then lost; back at 8k.
WEAK = {512: (10, 20), 1024: (9, 20), 2048: (9, 20), 4096: (6, 20), 8192: (10, 20)}


def relative_row(rows, relative, base_length=None, model="tiny-rope"):
    summary, = summarize(frame_of(rows), relative=relative, base_length=base_length)
    return summary, summary.relative_effective.loc[model]


def test_a_weak_model_has_a_relative_effective_length_where_the_absolute_one_is_none():
    summary, row = relative_row(keys_found("tiny-rope", WEAK), 0.85)
    assert summary.effective.loc["tiny-rope", "length"] is pd_na()  # 0.5 at the shortest: under 0.9
    # 0.85 × 0.5 = 0.425: 1k and 2k (0.45) reach it, 4k (0.30) does not, and 8k's recovery does not count
    assert (row["base_length"], row["base_score"], row["length"]) == (512, 0.5, 2048)
    assert row["ratio"] == 2048 / 512  # fake_row's tiny-rope trained at 512


def test_the_base_length_moves_the_base_and_lengths_below_it_do_not_count():
    rows = keys_found("tiny-rope", {512: (2, 20), **{n: v for n, v in WEAK.items() if n > 512}})
    _, row = relative_row(rows, 0.85, base_length=1024)
    # 0.85 × 0.45 = 0.3825 from 1k on; 512 (0.10) lies below the base and does not stop it
    assert (row["base_length"], row["length"]) == (1024, 2048)
    _, shortest = relative_row(rows, 0.85)
    assert shortest["length"] == 8192  # 0.85 × 0.10 from 512: every length reaches it


def test_the_certified_relative_length_holds_lower_bounds_to_the_bases_upper_bound():
    strong = {512: (40, 40), 1024: (40, 40), 2048: (37, 40), 4096: (30, 40)}
    summary, row = relative_row(keys_found("tiny-rope", strong), 0.85)
    assert row["length"] == 2048  # means: 0.925 at 2k reaches 0.85 × 1.0, 0.75 at 4k does not
    # the rule restated: every length's Wilson lower bound at or above 0.85 × the base's upper bound
    needed = 0.85 * wilson_interval(40, 40)[1]
    passing = [n for n, (k, keys) in strong.items() if wilson_interval(k, keys)[0] >= needed]
    assert passing == [512, 1024] and row["certified"] == 1024  # 37 of 40 keys do not support 0.85
    values = [str(c) for c in render_summary(summary).columns[1]._cells]
    assert values[-2:] == ["2k (4×)", "1k (2×)"]  # the relative rows follow the absolute ones


def test_too_few_keys_at_the_base_say_how_many_certification_needs():
    few = {512: (5, 5), 1024: (5, 5)}
    summary, row = relative_row(keys_found("tiny-rope", few), 0.85)
    assert row["certified"] is pd_na() and row["needs_draws"] == min_certifiable_n(0.85)
    labels = render_summary(summary).columns[0]._cells
    assert "certified relative effective length" in [str(label) for label in labels]
    document = summaries_to_json([summary])["summaries"][0]["relative_effective_length"][0]
    assert document["certified_needs_draws"] == min_certifiable_n(0.85) and document["length"] == 1024


def test_a_model_scoring_nothing_at_its_base_has_no_relative_length():
    summary, row = relative_row(keys_found("tiny-rope", {512: (0, 10), 1024: (0, 10)}), 0.85)
    assert row["length"] is pd_na() and row["certified"] is pd_na() and row["needs_draws"] is pd_na()  # nothing to certify
    values = [str(c) for c in render_summary(summary).columns[1]._cells]
    assert "no base score" in values


def test_results_show_gives_both_lengths_and_refuses_a_base_it_did_not_test(tmp_path, capsys):
    ResultStore(tmp_path).append(keys_found("tiny-rope", WEAK))
    shown = CliRunner().invoke(app, ["results", "show", "--dir", str(tmp_path), "--relative", "0.85", "--json"])
    assert shown.exit_code == 0, shown.output
    summary, = json.loads(shown.stdout)["summaries"]
    assert summary["effective_length"][0]["length"] is None
    assert summary["relative_effective_length"][0]["length"] == 2048
    exported = CliRunner().invoke(app, ["results", "export", "--dir", str(tmp_path), "--relative", "0.85", "--format", "json"])
    assert exported.exit_code == 0, exported.output
    assert json.loads(exported.stdout)["summaries"][0]["relative_effective_length"][0]["length"] == 2048
    for args, words in ((["--relative", "0.85", "--base-length", "3k"], "not a tested length"),
                        (["--base-length", "1k"], "goes with --relative")):
        with pytest.raises(SystemExit) as exit_:
            main(["results", "show", "--dir", str(tmp_path), *args])
        error = capsys.readouterr().err
        assert exit_.value.code == 2 and words in error and len(error.strip().splitlines()) == 1
    with pytest.raises(BamctlError, match="in \\(0, 1\\]"):
        summarize(frame_of(keys_found("tiny-rope", WEAK)), relative=0.0)


def pd_na():
    import pandas as pd

    return pd.NA


def test_a_share_of_exactly_one_is_a_share_and_anything_past_it_or_at_zero_is_not():
    rows = frame_of(keys_found("tiny-rope", WEAK))
    _, row = relative_row(keys_found("tiny-rope", WEAK), 1.0)
    assert row["length"] == 512  # 1.0 × 0.5: 1k's 0.45 falls short
    for share in (0.0, -0.5, 1.0001, 2.0):
        with pytest.raises(BamctlError, match=rf"^--relative must be in \(0, 1\], .* not {share:g}$"):
            summarize(rows, relative=share)
    with pytest.raises(BamctlError, match="^--base-length goes with --relative"):
        summarize(rows, base_length=1024)


def table_of(rows):
    summary, = summarize(frame_of(rows))
    return summary.table


def keys_at_depths(model: str, length: int, keys: int, depths=(0.0, 0.5, 1.0), wrong: int = 0) -> list[dict]:
    """`keys` keys, each asked at every depth (prompts of one draw); the first `wrong` keys missed."""
    return [fake_row(model, length=length, depth=depth, sample=i, score=0.0 if i < wrong else 1.0)
            for i in range(keys) for depth in depths]


def test_certification_counts_draws_not_prompts_and_prompts_only_where_a_table_has_no_draws():
    needed = min_certifiable_n(0.85)
    # needed - 1 keys at three depths: prompts enough, draws too few
    table = table_of(keys_at_depths("tiny-rope", 512, needed - 1) + keys_at_depths("tiny-rope", 1024, needed - 1))
    row = relative_effective_length(table, 0.85).loc["tiny-rope"]
    assert row["certified"] is pd_na() and row["needs_draws"] == needed
    # a table that counts prompts alone counts them: 3 (needed - 1) are enough, so nothing is asked
    assert relative_effective_length(table.drop(columns="n_draws", level="field"), 0.85).loc["tiny-rope", "needs_draws"] is pd_na()
    one_depth = table_of(keys_at_depths("tiny-rope", 512, needed - 1, depths=(0.5,)))
    assert relative_effective_length(one_depth.drop(columns="n_draws", level="field"), 0.85).loc["tiny-rope", "needs_draws"] == needed
    uncounted = relative_effective_length(table.drop(columns=["n", "n_draws"], level="field"), 0.85).loc["tiny-rope"]
    assert uncounted["length"] == 1024 and uncounted["needs_draws"] is pd_na()  # no count: nothing to ask for


def test_exactly_the_draws_certification_needs_are_enough_even_where_a_key_was_missed():
    needed = min_certifiable_n(0.85)
    right = relative_effective_length(table_of(keys_at_depths("tiny-rope", 512, needed, depths=(0.5,))), 0.85)
    assert right.loc["tiny-rope", "certified"] == 512 and right.loc["tiny-rope", "needs_draws"] is pd_na()
    missed = relative_effective_length(table_of(keys_at_depths("tiny-rope", 512, needed, depths=(0.5,), wrong=1)), 0.85)
    assert missed.loc["tiny-rope", "certified"] is pd_na() and missed.loc["tiny-rope", "needs_draws"] is pd_na()


def test_the_certified_bar_is_the_share_times_the_bases_upper_bound_below_one():
    rows = keys_found("tiny-rope", {512: (38, 40), 1024: (26, 40), 2048: (10, 40)})
    row = relative_effective_length(table_of(rows), 0.5).loc["tiny-rope"]
    bar = 0.5 * wilson_interval(38, 40)[1]  # 0.493: 26 of 40 (lower bound 0.495) reaches it
    assert wilson_interval(26, 40)[0] >= bar > wilson_interval(10, 40)[0] and row["certified"] == 1024


def test_a_model_without_a_cell_at_the_base_or_without_any_has_no_relative_length():
    rows = keys_found("tiny-rope", {512: (10, 10), 1024: (10, 10)}) + keys_found("tiny-bam", {1024: (10, 10)})
    table = table_of(rows)
    result = relative_effective_length(table, 0.85, base_length=512)
    bam = result.loc["tiny-bam"]
    assert bam["length"] is pd_na() and bam["certified"] is pd_na() and bam["needs_draws"] is pd_na()
    assert math.isnan(result.at["tiny-bam", "base_score"]) and bam["base_length"] == 512
    assert result.loc["tiny-rope", "length"] == 1024
    table[("score", "tiny-bam")] = math.nan  # a column of no scores at all: no base to speak of
    result = relative_effective_length(table, 0.85)
    empty = result.loc["tiny-bam"]
    assert empty["base_length"] is pd_na() and empty["length"] is pd_na() and math.isnan(result.at["tiny-bam", "base_score"])


def test_the_table_level_call_refuses_what_the_cli_refuses_by_name():
    table = table_of(keys_found("tiny-rope", WEAK))
    with pytest.raises(BamctlError, match="^--base-length goes with --relative"):
        relative_effective_length(table, None, 1024)
    message = "--base-length 3000 is not a tested length; the table's lengths are 512, 1024, 2048, 4096, 8192"
    with pytest.raises(BamctlError, match=f"^{message}$"):
        relative_effective_length(table, 0.85, 3000)
