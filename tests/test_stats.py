"""Paired statistics, each checked against scipy.stats or a value worked out by hand on a small table."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from bamctl.results.schema import rows_to_table
from bamctl.results.stats import (
    bootstrap_interval,
    holm,
    mcnemar_exact,
    paired_difference_interval,
    sign_flip_p,
)
from bamctl.results.store import to_pandas
from bamctl.results.summary import effective_length, min_certifiable_n, summarize

from results_fakes import fake_row

scipy_stats = pytest.importorskip("scipy.stats", reason="scipy not installed (a test extra: pip install scipy)")


def test_mcnemar_is_the_exact_binomial_test_on_discordant_pairs():
    for b, c in [(0, 0), (5, 0), (7, 2), (3, 9), (12, 12), (1, 15)]:
        expected = 1.0 if b + c == 0 else scipy_stats.binomtest(b, b + c, 0.5).pvalue
        assert mcnemar_exact(b, c) == pytest.approx(expected, rel=1e-12)


def test_the_paired_difference_interval_by_hand():
    # b = 8, c = 2, n = 40: d = 0.15; var term = b + c - (b - c)^2 / n = 10 - 0.9 = 9.1
    lo, hi = paired_difference_interval(8, 2, 40)
    half = 1.959963984540054 * math.sqrt(9.1) / 40
    assert (lo, hi) == pytest.approx((0.15 - half, 0.15 + half))


def test_sign_flips_are_scipys_exact_paired_permutation_test():
    d = np.array([0.5, 0.25, 0.0, 1.0, 0.75, -0.25, 0.5, 0.125])
    expected = scipy_stats.permutation_test(
        (d,), np.mean, permutation_type="samples", n_resamples=np.inf, alternative="two-sided"
    ).pvalue
    assert sign_flip_p(d) == pytest.approx(expected)


def test_the_bootstrap_interval_is_seeded_and_by_the_book():
    d = np.linspace(-0.2, 0.6, 25)
    picks = np.random.default_rng(0).integers(0, 25, size=(2000, 25))
    means = d[picks].mean(axis=1)
    assert bootstrap_interval(d) == pytest.approx((np.quantile(means, 0.025), np.quantile(means, 0.975)))
    assert bootstrap_interval(d) == bootstrap_interval(d)


def test_holm_by_hand():
    # sorted: 0.01 * 3 = 0.03, 0.02 * 2 = 0.04, 0.04 * 1 = 0.04 (running max) -> back in place
    assert holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])


def _grid(scores_a, scores_b, lengths=(1024, 2048)):
    rows = []
    for length in lengths:
        for i, (a, b) in enumerate(zip(scores_a, scores_b)):
            rows.append(fake_row("tiny-rope", length=length, sample=i, score=a, depth=0.5))
            rows.append(fake_row("tiny-bam", length=length, sample=i, score=b, depth=0.5))
    return to_pandas(rows_to_table(rows))


def test_compare_tests_each_model_against_the_baseline_per_length_with_holm():
    rope = [1] * 10 + [0] * 10
    bam = [1] * 19 + [0]
    (summary,) = summarize(_grid(rope, bam), baseline="tiny-rope")
    results = {r.length: r for r in summary.paired}
    b = sum(1 for x, y in zip(bam, rope) if x == 1 and y == 0)  # bam right where rope wrong: 9
    c = sum(1 for x, y in zip(bam, rope) if x == 0 and y == 1)  # 0
    p = scipy_stats.binomtest(b, b + c, 0.5).pvalue
    for result in results.values():
        assert (result.model, result.baseline, result.test, result.n) == ("tiny-bam", "tiny-rope", "mcnemar", 20)
        assert result.difference == pytest.approx((b - c) / 20) and result.p == pytest.approx(p)
        assert result.p_holm == pytest.approx(min(1.0, 2 * p))  # two lengths, equal p
    assert summary.mark(1024, "tiny-bam") == "▲" and summary.mark(1024, "tiny-rope") == ""


def test_perplexity_pairs_documents_not_windows():
    rows = []
    nll = {"tiny-rope": [2.0, 2.2, 1.8, 2.4], "tiny-bam": [1.5, 1.9, 1.4, 2.0]}
    for model, values in nll.items():
        for doc, v in enumerate(values):
            for window in range(3):  # three windows per document: they must not count as pairs
                rows.append(fake_row(model, task="ppl", protocol="sliding", scoring="nll", length=256, depth=None,
                                     sample=doc, score=v, nll=v * 100, n_scored=100))
                rows[-1]["position"] = 1 + 100 * window
    (summary,) = summarize(to_pandas(rows_to_table(rows)), baseline="tiny-rope")
    (result,) = summary.paired
    d = np.array(nll["tiny-bam"]) - np.array(nll["tiny-rope"])
    assert result.n == 4 and result.difference == pytest.approx(d.mean())
    flips = [abs(np.mean(np.array(s) * d)) for s in itertools.product((1, -1), repeat=4)]
    assert result.p == pytest.approx(np.mean(np.array(flips) >= abs(d.mean()) - 1e-12))


def _documents(nll_per_token: dict[str, list[float]], tokens: dict[str, list[int]]):
    rows = []
    for model, values in nll_per_token.items():
        for doc, (v, n) in enumerate(zip(values, tokens[model])):
            rows.append(fake_row(model, task="ppl", protocol="sliding", scoring="nll", length=256, depth=None,
                                 sample=doc, score=v, nll=v * n, n_scored=n))
    return to_pandas(rows_to_table(rows))


def test_perplexity_test_is_the_mean_of_per_document_mean_nll_differences():
    nll = {"tiny-rope": [2.0, 2.2, 1.8, 2.4, 2.1], "tiny-bam": [1.5, 2.3, 1.4, 2.0, 2.2]}
    lengths = [50, 400, 120, 900, 75]  # documents of different lengths: each still counts once
    (summary,) = summarize(_documents(nll, {"tiny-rope": lengths, "tiny-bam": lengths}), baseline="tiny-rope")
    (result,) = summary.paired
    d = np.array(nll["tiny-bam"]) - np.array(nll["tiny-rope"])
    expected = scipy_stats.permutation_test(
        (d,), np.mean, permutation_type="samples", n_resamples=np.inf, alternative="two-sided"
    ).pvalue
    assert result.n == 5 and result.difference == pytest.approx(d.mean()) and result.p == pytest.approx(expected)


def test_perplexity_over_two_vocabularies_is_never_tested_as_paired():
    # tiny-bam scores 68 ids of each document, tiny-rope 11,000: not the same tokens
    nll = {"tiny-rope": [2.0, 2.2, 1.8, 2.4], "tiny-bam": [1.5, 1.9, 1.4, 2.0]}
    tokens = {"tiny-rope": [1000, 1000, 1000, 1000], "tiny-bam": [40, 38, 45, 41]}
    (summary,) = summarize(_documents(nll, tokens), baseline="tiny-rope")
    assert summary.paired == () and summary.baseline is None
    from bamctl.results.render import caption

    assert "different tokens" in caption(summary)


def test_certified_effective_length_needs_the_wilson_lower_bound_at_every_length():
    table = pd.DataFrame(
        {("score", "m"): [1.0, 0.95, 0.92, 0.95], ("lo", "m"): [0.91, 0.83, 0.80, 0.91],
         ("train_length", "m"): [128.0] * 4},
        index=[128, 256, 512, 1024],
    )
    table.columns = pd.MultiIndex.from_tuples(table.columns, names=["field", "model"])
    row = effective_length(table, 0.9).loc["m"]
    assert row["length"] == 1024  # the mean passes everywhere
    assert row["certified"] == 128 and row["certified_ratio"] == 1.0  # the bound fails from 256 on


@pytest.mark.parametrize("threshold", [0.5, 0.8, 0.9, 0.95, 0.99])
def test_min_certifiable_n_is_the_first_n_whose_all_correct_wilson_bound_reaches_the_threshold(threshold):
    def lower(n):
        return scipy_stats.binomtest(n, n).proportion_ci(method="wilson").low

    n = min_certifiable_n(threshold)
    assert lower(n) >= threshold and (n == 1 or lower(n - 1) < threshold)


def test_min_certifiable_n_at_0_9_is_35_and_none_at_1():
    assert min_certifiable_n(0.9) == 35  # 10/10 gives 0.72, 34/34 0.898, 35/35 0.901
    assert min_certifiable_n(1.0) is None  # the Wilson lower bound never reaches 1


def _all_correct(per_cell: int, lengths=(128, 256, 512), misses_at_128: int = 0):
    rows = []
    for length in lengths:
        for i in range(per_cell):
            score = 0.0 if length == 128 and i < misses_at_128 else 1.0
            rows.append(fake_row("tiny-bam", length=length, sample=i, score=score, depth=0.5))
    return to_pandas(rows_to_table(rows))


def test_the_certified_row_says_how_many_prompts_certification_needs():
    from bamctl.results.render import effective_rows

    (small,) = summarize(_all_correct(10))
    assert pd.isna(small.effective.loc["tiny-bam", "certified"])
    assert small.effective.loc["tiny-bam", "needs_n"] == 35
    assert dict(effective_rows(small))["certified effective length"] == ["needs ≥ 35 prompts per cell"]
    (large,) = summarize(_all_correct(40))
    assert large.effective.loc["tiny-bam", "certified"] == 512 and pd.isna(large.effective.loc["tiny-bam", "needs_n"])
    (failing,) = summarize(_all_correct(40, misses_at_128=10))
    assert dict(effective_rows(failing))["certified effective length"] == ["< 128"]  # possible, and not reached


def _cli(capsys, *args):
    from bamctl.cli import main

    with pytest.raises(SystemExit) as done:
        main(list(args))
    captured = capsys.readouterr()
    return done.value.code, captured.out, captured.err


def test_results_show_and_export_carry_the_statistics(tmp_path, capsys):
    import io
    import json

    from bamctl.results.store import ResultStore

    rows = [
        fake_row(model, length=length, sample=i, score=float(score), depth=0.5)
        for length in (1024, 2048)
        for i in range(20)
        for model, score in (("tiny-rope", i < 10), ("tiny-bam", i < 19))
    ]
    ResultStore(tmp_path).append(rows)
    code, out, _ = _cli(capsys, "results", "export", "--dir", str(tmp_path), "--stats", "--baseline", "tiny-rope", "--format", "csv")
    assert code == 0
    stats = pd.read_csv(io.StringIO(out))
    assert list(stats["length"]) == [1024, 2048] and set(stats["test"]) == {"mcnemar"}
    assert stats["difference"].tolist() == pytest.approx([0.45, 0.45])
    code, out, _ = _cli(capsys, "results", "show", "--dir", str(tmp_path), "--baseline", "tiny-rope", "--json")
    paired = json.loads(out)["summaries"][0]["paired"]
    assert [p["model"] for p in paired] == ["tiny-bam", "tiny-bam"] and all(p["p_holm"] < 0.05 for p in paired)
    code, out, _ = _cli(capsys, "results", "show", "--dir", str(tmp_path), "--baseline", "tiny-rope")
    assert "▲" in out and "tiny-rope (baseline)" in out
    code, _, err = _cli(capsys, "results", "export", "--dir", str(tmp_path), "--stats")
    assert code == 2 and "--baseline" in err
