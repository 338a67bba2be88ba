"""Effective length relative to a model's own short-context score (``--relative``, ``--base-length``):
NoLiMa's rule, beside the absolute one, and its certified form (draw-level Wilson bounds)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from bamctl.cli import main
from bamctl.cli.app import app
from bamctl.errors import BamctlError
from bamctl.results.render import render_summary, summaries_to_json
from bamctl.results.store import ResultStore
from bamctl.results.summary import min_certifiable_n, summarize, wilson_interval
from results_fakes import fake_row, frame_of


def cells(model: str, right_of: dict[int, tuple[int, int]]) -> list[dict]:
    """Per length, (keys right, keys): one prompt per key, so each key is one 0/1 outcome."""
    return [fake_row(model, length=length, depth=0.5, sample=i, score=1.0 if i < right else 0.0)
            for length, (right, keys) in right_of.items() for i in range(keys)]


# A weak small model: half its keys at the shortest length, fading slowly, then lost; back at 8k.
WEAK = {512: (10, 20), 1024: (9, 20), 2048: (9, 20), 4096: (6, 20), 8192: (10, 20)}


def relative_row(rows, relative, base_length=None, model="tiny-rope"):
    summary, = summarize(frame_of(rows), relative=relative, base_length=base_length)
    return summary, summary.relative_effective.loc[model]


def test_a_weak_model_has_a_relative_effective_length_where_the_absolute_one_is_none():
    summary, row = relative_row(cells("tiny-rope", WEAK), 0.85)
    assert summary.effective.loc["tiny-rope", "length"] is pd_na()  # 0.5 at the shortest: under 0.9
    # 0.85 × 0.5 = 0.425: 1k and 2k (0.45) reach it, 4k (0.30) does not, and 8k's recovery does not count
    assert (row["base_length"], row["base_score"], row["length"]) == (512, 0.5, 2048)
    assert row["ratio"] == 2048 / 512  # fake_row's tiny-rope trained at 512


def test_the_base_length_moves_the_base_and_lengths_below_it_do_not_count():
    rows = cells("tiny-rope", {512: (2, 20), **{n: v for n, v in WEAK.items() if n > 512}})
    _, row = relative_row(rows, 0.85, base_length=1024)
    # 0.85 × 0.45 = 0.3825 from 1k on; 512 (0.10) lies below the base and does not stop it
    assert (row["base_length"], row["length"]) == (1024, 2048)
    _, shortest = relative_row(rows, 0.85)
    assert shortest["length"] == 8192  # 0.85 × 0.10 from 512: every length reaches it


def test_the_certified_relative_length_holds_lower_bounds_to_the_bases_upper_bound():
    strong = {512: (40, 40), 1024: (40, 40), 2048: (37, 40), 4096: (30, 40)}
    summary, row = relative_row(cells("tiny-rope", strong), 0.85)
    assert row["length"] == 2048  # means: 0.925 at 2k reaches 0.85 × 1.0, 0.75 at 4k does not
    # the rule restated: every length's Wilson lower bound at or above 0.85 × the base's upper bound
    needed = 0.85 * wilson_interval(40, 40)[1]
    passing = [n for n, (k, keys) in strong.items() if wilson_interval(k, keys)[0] >= needed]
    assert passing == [512, 1024] and row["certified"] == 1024  # 37 of 40 keys do not support 0.85
    values = [str(c) for c in render_summary(summary).columns[1]._cells]
    assert values[-2:] == ["2k (4×)", "1k (2×)"]  # the relative rows follow the absolute ones


def test_too_few_keys_at_the_base_say_how_many_certification_needs():
    few = {512: (5, 5), 1024: (5, 5)}
    summary, row = relative_row(cells("tiny-rope", few), 0.85)
    assert row["certified"] is pd_na() and row["needs_draws"] == min_certifiable_n(0.85)
    labels = render_summary(summary).columns[0]._cells
    assert "certified relative effective length" in [str(label) for label in labels]
    document = summaries_to_json([summary])["summaries"][0]["relative_effective_length"][0]
    assert document["certified_needs_draws"] == min_certifiable_n(0.85) and document["length"] == 1024


def test_a_model_scoring_nothing_at_its_base_has_no_relative_length():
    summary, row = relative_row(cells("tiny-rope", {512: (0, 10), 1024: (0, 10)}), 0.85)
    assert row["length"] is pd_na() and row["certified"] is pd_na()
    values = [str(c) for c in render_summary(summary).columns[1]._cells]
    assert "no base score" in values


def test_results_show_gives_both_lengths_and_refuses_a_base_it_did_not_test(tmp_path, capsys):
    ResultStore(tmp_path).append(cells("tiny-rope", WEAK))
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
        summarize(frame_of(cells("tiny-rope", WEAK)), relative=0.0)


def pd_na():
    import pandas as pd

    return pd.NA


def test_a_share_of_exactly_one_is_a_share_and_anything_past_it_or_at_zero_is_not():
    rows = frame_of(cells("tiny-rope", WEAK))
    _, row = relative_row(cells("tiny-rope", WEAK), 1.0)
    assert row["length"] == 512  # 1.0 × 0.5: 1k's 0.45 falls short
    for share in (0.0, -0.5, 1.0001, 2.0):
        with pytest.raises(BamctlError, match=rf"^--relative must be in \(0, 1\], .* not {share:g}$"):
            summarize(rows, relative=share)
    with pytest.raises(BamctlError, match="^--base-length goes with --relative"):
        summarize(rows, base_length=1024)
