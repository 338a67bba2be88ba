"""Paired statistics over independent draws, each checked against scipy.stats or a value worked out by hand on a
small table."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from bamctl.results.schema import rows_to_table
from bamctl.results.stats import (
    MCNEMAR,
    SIGN_FLIP_RANDOM,
    PairedResult,
    bootstrap_interval,
    draw_ids,
    draw_permutation_test,
    draw_sign_flip_test,
    draws_needed,
    holm,
    mcnemar_exact,
    mean_interval_over_draws,
    out_of_reach,
    one_copy_per_document,
    paired_difference_interval,
    paired_tests,
    scored_alike,
    sign_flip_p,
    sign_flips_are_enumerated,
    smallest_p,
    unpaired_tests,
)
from bamctl.results.store import to_pandas
from bamctl.results.summary import effective_length, min_certifiable_n, summarize, wilson_interval

from results_fakes import fake_row, frame_of

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


def test_random_sign_flips_agree_with_scipys_exact_test_ties_included():
    """Past 2^13 patterns (14 pairs and more) the flips are drawn, 10,000 of them, seeded: p then
    agrees with scipy's exact test (all 2^14 patterns) to Monte-Carlo error, counting the
    patterns whose mean ties the observed one (paired 0/1 scores give many)."""
    d = np.array([1, 1, 0, 1, -1, 1, 0, 0, 1, 1, -1, 0, 1, 0], dtype=float)
    assert not sign_flips_are_enumerated(len(d))
    exact = scipy_stats.permutation_test(
        (d,), np.mean, permutation_type="samples", n_resamples=np.inf, alternative="two-sided").pvalue
    assert 0.05 < exact < 0.5 and sign_flip_p(d) == pytest.approx(exact, abs=0.015)
    assert sign_flip_p(d) == sign_flip_p(d)  # seeded
    assert sign_flip_p(np.zeros(20)) == 1.0  # no difference: every pattern ties it


def test_the_bootstrap_interval_of_nothing_and_of_one_draw():
    assert all(math.isnan(x) for x in bootstrap_interval(np.array([])))
    assert bootstrap_interval(np.array([0.3])) == pytest.approx((0.3, 0.3))


def test_the_bootstrap_interval_is_seeded_and_by_the_book():
    d = np.linspace(-0.2, 0.6, 25)
    picks = np.random.default_rng(0).integers(0, 25, size=(2000, 25))
    means = d[picks].mean(axis=1)
    assert bootstrap_interval(d) == pytest.approx((np.quantile(means, 0.025), np.quantile(means, 0.975)))
    assert bootstrap_interval(d) == bootstrap_interval(d)


def _per_draw(scores, draws) -> np.ndarray:
    return np.array([np.mean([x for x, d in zip(scores, draws) if d == draw]) for draw in sorted(set(draws))])


def test_the_unpaired_test_is_scipys_exact_two_sample_permutation_test_on_the_draws():
    """Models that saw other prompts: each draw is the mean of its prompts (three prompts of one
    draw count once), and the draws' labels are shuffled. scipy's exact test (every split of the
    pooled draws) is the reference for p; ours shuffles 10,000 times, so p agrees to Monte-Carlo
    error. Scores of 0 and 1, one prompt a draw for most, make many splits tie with the observed
    difference: a test that counted only strictly larger ones would be far off."""
    m, m_draws = np.array([1, 1, 1, 0, 1, 1, 0, 1, 1]), np.array(["a", "a", "a", "b", "c", "d", "e", "f", "g"])
    b, b_draws = np.array([0, 1, 0, 0, 1, 0, 0]), np.array(["h", "i", "j", "k", "l", "m", "m"])
    per_m, per_b = _per_draw(m, m_draws), _per_draw(b, b_draws)
    n, n_draws, test, difference, lo, hi, p, p_min = draw_permutation_test(m, m_draws, b, b_draws)
    assert (n, n_draws, test) == (16, 13, "permutation-unpaired")
    assert difference == pytest.approx(per_m.mean() - per_b.mean(), abs=1e-12)  # draws, not prompts
    assert difference != pytest.approx(m.mean() - b.mean())
    # two-sided as ours is: |difference| at least the observed one (scipy's "two-sided" doubles the
    # smaller one-sided p instead, which differs when the groups' sizes differ)
    exact = scipy_stats.permutation_test(
        (per_m, per_b), lambda x, y, axis: np.abs(np.mean(x, axis=axis) - np.mean(y, axis=axis)),
        permutation_type="independent", n_resamples=np.inf, alternative="greater", vectorized=True).pvalue
    assert p == pytest.approx(exact, abs=0.015) and p_min == pytest.approx(1 / 10_001)
    # the interval, by the book: each model's draws resampled on their own, seeded
    boot = np.random.default_rng(1)
    spread = (per_m[boot.integers(0, len(per_m), size=(2000, len(per_m)))].mean(axis=1)
              - per_b[boot.integers(0, len(per_b), size=(2000, len(per_b)))].mean(axis=1))
    assert (lo, hi) == pytest.approx((np.quantile(spread, 0.025), np.quantile(spread, 0.975)))
    assert lo < difference < hi
    assert draw_permutation_test(m, m_draws, b, b_draws) == (n, n_draws, test, difference, lo, hi, p, p_min)  # seeded
    swapped = draw_permutation_test(b, b_draws, m, m_draws)  # the other way round: mirrored, p unchanged
    assert swapped[3] == pytest.approx(-difference) and swapped[6] == pytest.approx(p, abs=0.015)


def test_unpaired_tests_run_per_length_both_ran_and_adjust_each_models_lengths_by_holm():
    """Models that saw other prompts against the baseline: one unpaired test per length both ran
    (a length only one of them ran is skipped), on that length's rows alone, its p Holm-adjusted
    over that model's lengths only."""
    rng = np.random.default_rng(7)
    frames = []
    for label, lengths, hit in [("base", (256, 512, 1024, 2048), 0.9), ("x", (512, 1024), 0.5),
                                ("y", (512, 1024, 4096), 0.7)]:
        for length in lengths:
            draws = [f"{label}-{length}-{i}" for i in range(8)]
            frames.append(pd.DataFrame({"_label": label, "length": length, "_draw": np.repeat(draws, 2),
                                        "score": (rng.random(16) < hit).astype(float)}))
    rows = pd.concat(frames, ignore_index=True)
    rows = rows.iloc[rng.permutation(len(rows))]  # rows come in any order from the store
    results = unpaired_tests(rows, ["x", "y"], "base")
    assert [(r.model, r.baseline, r.length) for r in results] == [("x", "base", 512), ("x", "base", 1024),
                                                                  ("y", "base", 512), ("y", "base", 1024)]
    for r in results:
        part = rows[rows["length"] == r.length]
        m, b = part[part["_label"] == r.model], part[part["_label"] == "base"]
        expected = draw_permutation_test(m["score"].to_numpy(), m["_draw"].to_numpy(), b["score"].to_numpy(),
                                         b["_draw"].to_numpy())
        assert (r.n, r.n_draws, r.test, r.difference, r.lo, r.hi, r.p, r.p_min) == expected
    for model in ("x", "y"):
        own = [r for r in results if r.model == model]
        assert [r.p_holm for r in own] == pytest.approx(holm([r.p for r in own]))
    assert unpaired_tests(rows, ["x"], "nobody") == []


def test_the_unpaired_interval_of_continuous_values_is_by_the_book():
    """Answer log-probabilities: the interval resamples each model's draw means on its own, from the
    generator seeded one past the test's seed (the shuffles use the seed itself)."""
    rng = np.random.default_rng(2)
    m, b = rng.normal(-0.5, 0.4, 24), rng.normal(-1.0, 0.6, 20)
    m_draws, b_draws = np.repeat([f"m{i}" for i in range(12)], 2), np.repeat([f"b{i}" for i in range(10)], 2)
    per_m, per_b = _per_draw(m, m_draws), _per_draw(b, b_draws)
    boot = np.random.default_rng(1)
    spread = (per_m[boot.integers(0, 12, size=(2000, 12))].mean(axis=1)
              - per_b[boot.integers(0, 10, size=(2000, 10))].mean(axis=1))
    lo, hi = draw_permutation_test(m, m_draws, b, b_draws)[4:6]
    assert (lo, hi) == pytest.approx((np.quantile(spread, 0.025), np.quantile(spread, 0.975)), rel=1e-12)


def test_the_unpaired_test_sees_no_difference_between_equal_samples():
    scores, draws = np.array([1, 0, 1, 1, 0, 1]), np.array(["a", "b", "c", "d", "e", "f"])
    _, _, _, difference, lo, hi, p, _ = draw_permutation_test(scores, draws, scores, np.array(list("ghijkl")))
    assert difference == 0 and p == 1.0 and lo <= 0 <= hi


def test_a_continuous_values_interval_resamples_draws_not_prompts():
    """An answer's log-probability, cell by cell: draws resampled, each the mean of its prompts,
    by the same seeded bootstrap as the paired tests (restated here: ``bootstrap_interval`` over
    the per-draw means); NaN values are left out, and one draw has no spread."""
    values = np.array([-0.1, -0.3, -2.5, -0.2, np.nan, -0.05, -1.0, -0.4])
    draws = np.array(["a", "a", "a", "b", "b", "c", "d", "d"])
    per_draw = np.array([np.mean([-0.1, -0.3, -2.5]), -0.2, -0.05, np.mean([-1.0, -0.4])])
    assert mean_interval_over_draws(values, draws) == pytest.approx(bootstrap_interval(per_draw, 0, 2000))
    assert mean_interval_over_draws(values, draws, seed=5, resamples=300) == pytest.approx(bootstrap_interval(per_draw, 5, 300))
    lo, hi = mean_interval_over_draws(values, draws)
    assert lo < per_draw.mean() < hi and not math.isnan(lo)
    # rows come in any order from the store: the interval must not depend on it (15 draws of two
    # prompts, so that another order of the draws would move the seeded quantiles)
    many = np.random.default_rng(3).normal(-1.0, 0.5, 30)
    named = np.repeat([f"draw{i:02d}" for i in range(15)], 2)
    order = np.random.default_rng(4).permutation(30)
    assert mean_interval_over_draws(many[order], named[order]) == mean_interval_over_draws(many, named)
    listed = [-0.1, -0.3, -2.5, -0.2, None, -0.05, -1.0, -0.4]  # a list with a missing value: left out as NaN is
    assert mean_interval_over_draws(listed, draws) == mean_interval_over_draws(values, draws)
    assert all(math.isnan(x) for x in mean_interval_over_draws(np.array([-0.1, -0.3]), np.array(["a", "a"])))
    assert all(math.isnan(x) for x in mean_interval_over_draws(np.array([-0.1, np.nan]), np.array(["a", "b"])))
    assert not math.isnan(mean_interval_over_draws(np.array([-0.1, -0.2]), np.array(["a", "b"]))[0])


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
    assert (result.n, result.n_draws) == (12, 4) and result.difference == pytest.approx(d.mean())
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
    assert (result.n, result.n_draws) == (5, 5) and result.difference == pytest.approx(d.mean())
    assert result.p == pytest.approx(expected)


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


@pytest.mark.parametrize("threshold", [0.1, 0.2, 0.21, 0.5, 0.8, 0.9, 0.95, 0.99])
def test_min_certifiable_n_is_the_first_n_whose_all_correct_wilson_bound_reaches_the_threshold(threshold):
    def lower(n):
        return scipy_stats.binomtest(n, n).proportion_ci(method="wilson").low

    n = min_certifiable_n(threshold)
    assert lower(n) >= threshold and (n == 1 or lower(n - 1) < threshold)


@pytest.mark.parametrize("z", [1.0, 1.959963984540054, 2.5758293035489004])
def test_a_threshold_that_is_exactly_n_keys_bound_needs_n_keys_and_one_just_past_it_needs_more(z):
    """The search's start, t z^2 / (1 - t), solves n / (n + z^2) = t exactly, but floats put it past n for
    about half the thresholds that are a bound themselves (t = the bound of n of n keys): n keys
    reach such a t, "at or above", and are the fewest that do."""
    for n in range(1, 400):
        bound = wilson_interval(n, n, z)[0]
        assert min_certifiable_n(bound, z) == n
        past = math.nextafter(bound, 1.0)
        assert min_certifiable_n(past, z) == next(m for m in range(n, n + 3) if wilson_interval(m, m, z)[0] >= past)


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


def test_the_certified_row_says_how_many_keys_certification_needs():
    from bamctl.results.render import effective_rows

    (small,) = summarize(_all_correct(10))  # one depth: each prompt is its own key
    assert pd.isna(small.effective.loc["tiny-bam", "certified"])
    assert small.effective.loc["tiny-bam", "needs_draws"] == 35
    assert dict(effective_rows(small))["certified effective length"] == ["needs ≥ 35 keys per cell"]
    (large,) = summarize(_all_correct(40))
    assert large.effective.loc["tiny-bam", "certified"] == 512 and pd.isna(large.effective.loc["tiny-bam", "needs_draws"])
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
    assert stats["n"].tolist() == stats["n_draws"].tolist() == [20, 20]  # one depth: every prompt its own key
    code, out, _ = _cli(capsys, "results", "show", "--dir", str(tmp_path), "--baseline", "tiny-rope", "--json")
    paired = json.loads(out)["summaries"][0]["paired"]
    assert [p["model"] for p in paired] == ["tiny-bam", "tiny-bam"] and all(p["p_holm"] < 0.05 for p in paired)
    code, out, _ = _cli(capsys, "results", "show", "--dir", str(tmp_path), "--baseline", "tiny-rope")
    assert "▲" in out and "tiny-rope (baseline)" in out
    code, _, err = _cli(capsys, "results", "export", "--dir", str(tmp_path), "--stats")
    assert code == 2 and "--baseline" in err


# -- draws: prompts that share a key are one unit -------------------------------------------------

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


def _keyed(scores: dict[str, list[list[float]]], lengths=(4096,), seeds=(0, 1), draw=None):
    """Passkey rows: scores[model][key][depth], key = seed * samples + sample, the same key at every
    depth (as passkey_key draws it). ``draw``: how rows name their draw (None: they do not)."""
    rows = []
    for model, per_key in scores.items():
        samples = len(per_key) // len(seeds)
        for length in lengths:
            for key, per_depth in enumerate(per_key):
                seed, sample = seeds[key // samples], key % samples
                for depth, score in zip(DEPTHS, per_depth):
                    extra = {} if draw is None else {"draw": draw(seed, sample)}
                    rows.append(fake_row(model, length=length, depth=depth, seed=seed, sample=sample, score=score, **extra))
    return frame_of(rows)


def _per_key(accuracies: list[float]) -> list[list[float]]:
    """Five depths per key with the given share right (0.4: the first two depths right)."""
    return [[1.0 if d < round(a * 5) else 0.0 for d in range(5)] for a in accuracies]


def test_the_issues_example_is_p_one_half_over_keys_where_prompt_mcnemar_says_0_0078():
    # bam-ssmax at 4k: keys 6 and 7 hold all 8 misses (0 of 5 and 2 of 5 right), the baseline none
    model = _per_key([1, 1, 1, 1, 1, 1, 0, 0.4])
    frame = _keyed({"tiny-bam": model, "tiny-rope": _per_key([1] * 8)})
    (summary,) = summarize(frame, baseline="tiny-rope")
    (result,) = summary.paired
    assert (result.n, result.n_draws, result.test) == (40, 8, "sign-flip")
    # per-key differences 0 × 6, -1, -0.6: the six zeros flip to themselves, and of the 4 signs of
    # the other two, |-1 - 0.6| and |1 + 0.6| reach the observed 1.6: p = 2/4
    assert result.p == 0.5
    # what treating the 40 prompts as 40 pairs said: b = 0, c = 8 discordant prompts, 2 / 2^8
    assert mcnemar_exact(0, 8) == pytest.approx(scipy_stats.binomtest(0, 8, 0.5).pvalue) == pytest.approx(0.0078125)


@pytest.mark.parametrize("draw", [None, lambda seed, sample: f"key-{seed}-{sample}", lambda seed, sample: None],
                         ids=["old rows", "draw column", "null draws"])
def test_forty_prompts_on_eight_keys_are_scipys_exact_paired_permutation_test_on_the_keys(draw):
    model = [[1, 1, 1, 1, 1], [1, 0, 1, 1, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 0],
             [1, 1, 0, 1, 1], [0, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]]
    baseline = [[1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 0, 1, 0, 1], [0, 0, 0, 0, 0],
                [1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]]
    (summary,) = summarize(_keyed({"tiny-bam": model, "tiny-rope": baseline}, draw=draw), baseline="tiny-rope")
    (result,) = summary.paired
    d = np.mean(model, axis=1) - np.mean(baseline, axis=1)  # one difference per key, by construction
    expected = scipy_stats.permutation_test(
        (d,), np.mean, permutation_type="samples", n_resamples=np.inf, alternative="two-sided"
    ).pvalue
    assert (result.n, result.n_draws, result.test) == (40, 8, "sign-flip")
    assert result.difference == pytest.approx(d.mean()) and result.p == pytest.approx(expected)
    # the interval resamples keys, each with its 5 prompts: the percentile bootstrap of the 8 means
    picks = np.random.default_rng(0).integers(0, 8, size=(2000, 8))
    means = d[picks].mean(axis=1)
    assert (result.lo, result.hi) == pytest.approx((np.quantile(means, 0.025), np.quantile(means, 0.975)))
    scipys = scipy_stats.bootstrap((d,), np.mean, method="percentile", n_resamples=20_000, random_state=1).confidence_interval
    assert (result.lo, result.hi) == pytest.approx((scipys.low, scipys.high), abs=0.05)  # Monte-Carlo error of both


def test_with_one_prompt_per_draw_the_sign_flip_test_is_exact_mcnemar():
    rng = np.random.default_rng(3)
    for n in (1, 5, 9, 13):
        m, b = rng.integers(0, 2, n).astype(float), rng.integers(0, 2, n).astype(float)
        right_wrong, wrong_right = int(np.sum((m == 1) & (b == 0))), int(np.sum((m == 0) & (b == 1)))
        assert sign_flip_p(m - b) == pytest.approx(mcnemar_exact(right_wrong, wrong_right))
        test = draw_sign_flip_test(m, b, np.arange(n))
        assert test[2] == "mcnemar" and test[6] == pytest.approx(mcnemar_exact(right_wrong, wrong_right))
        if n > 1:  # all prompts of one draw: a sign-flip test on one difference, not McNemar's
            assert draw_sign_flip_test(m, b, np.zeros(n))[:3] == (n, 1, "sign-flip")


def test_the_mcnemar_interval_holds_the_difference_printed_beside_it_and_mirrors_when_the_models_swap():
    # 8 keys the model finds and the baseline misses, 1 the other way, 31 alike: d = 7/40 = 0.175.
    # The Wald interval is centred on d (half = 1.96 sqrt(9 - 49/40) / 40 = 0.1366), so it holds d
    # and not -d; with the models swapped every figure changes sign and the interval mirrors.
    m = np.array([1.0] * 8 + [0.0] * 1 + [1.0] * 20 + [0.0] * 11)
    b = np.array([0.0] * 8 + [1.0] * 1 + [1.0] * 20 + [0.0] * 11)
    n, k, test, difference, lo, hi, p, _ = draw_sign_flip_test(m, b, np.arange(40))
    assert (n, k, test) == (40, 40, "mcnemar")
    assert difference == pytest.approx(0.175)
    half = 1.959963984540054 * math.sqrt(9 - 49 / 40) / 40
    assert (lo, hi) == pytest.approx((0.175 - half, 0.175 + half))
    assert lo < difference < hi and not lo < -difference < hi
    _, _, _, swapped, swapped_lo, swapped_hi, swapped_p, _ = draw_sign_flip_test(b, m, np.arange(40))
    assert (swapped, swapped_lo, swapped_hi) == pytest.approx((-difference, -hi, -lo))
    assert swapped_p == pytest.approx(p)


def test_the_key_level_interval_is_scipys_wilson_on_the_keys():
    # 8 keys, 6 right at every depth and 2 wrong at every depth: 30 of 40 prompts, 6 of 8 keys
    (summary,) = summarize(_keyed({"tiny-bam": _per_key([1, 1, 1, 0, 1, 1, 0, 1])}))
    cell = summary.table.loc[4096]
    wilson = scipy_stats.binomtest(6, 8).proportion_ci(method="wilson")
    assert (cell[("n", "tiny-bam")], cell[("n_draws", "tiny-bam")], cell[("score", "tiny-bam")]) == (40, 8, 0.75)
    assert (cell[("lo", "tiny-bam")], cell[("hi", "tiny-bam")]) == pytest.approx((wilson.low, wilson.high))
    prompts = scipy_stats.binomtest(30, 40).proportion_ci(method="wilson")
    assert cell[("lo", "tiny-bam")] < prompts.low - 0.1  # 40 prompts would claim far more


def test_certification_counts_keys_not_prompts():
    from bamctl.results.render import effective_rows

    # 7 keys × 5 depths = 35 prompts, all right: 35/35 prompts would certify 0.9, 7/7 keys do not
    (summary,) = summarize(_keyed({"tiny-bam": _per_key([1] * 7)}, lengths=(128, 256), seeds=(0,)))
    assert scipy_stats.binomtest(35, 35).proportion_ci(method="wilson").low > 0.9
    assert pd.isna(summary.effective.loc["tiny-bam", "certified"]) and summary.effective.loc["tiny-bam", "needs_draws"] == 35
    assert dict(effective_rows(summary))["certified effective length"] == ["needs ≥ 35 keys per cell"]


def test_draws_needed_is_the_first_k_whose_smallest_holm_p_is_below_alpha():
    # one length: 2/2^5 = 0.0625, 2/2^6 = 0.031; seven: 7 × 2/2^8 = 0.0547, 7 × 2/2^9 = 0.0273
    assert (draws_needed(1), draws_needed(7)) == (6, 9)
    assert smallest_p(8, exact=True) == 2 / 256 and smallest_p(20, exact=False) == 1 / 10_001


def test_eight_keys_over_seven_lengths_cannot_be_significant_and_the_caption_says_how_many_would():
    from bamctl.results.render import caption

    lengths = tuple(512 * 2**i for i in range(7))
    worst = {"tiny-bam": _per_key([0] * 8), "tiny-rope": _per_key([1] * 8)}  # every key as far apart as can be
    (summary,) = summarize(_keyed(worst, lengths=lengths), baseline="tiny-rope")
    assert all(r.p == 2 / 256 and r.p_holm == pytest.approx(7 * 2 / 256) and not r.significant for r in summary.paired)
    (reach,) = summary.out_of_reach
    assert (reach.lengths, reach.n_draws, reach.draws_needed) == (7, 8, 9)
    text = caption(summary)
    assert "40 prompts, 8 keys per cell" in text and "exact sign-flip permutation test over keys" in text
    assert "no difference of tiny-bam from tiny-rope can reach p < 0.05" in text and "≥ 9 keys per cell" in text
    assert summary.mark(4096, "tiny-bam") == ""
    # 9 keys (3 seeds × 3 samples): 7 × 2/512 = 0.027, every length ▼ and no such line
    nine = {"tiny-bam": _per_key([0] * 9), "tiny-rope": _per_key([1] * 9)}
    (summary,) = summarize(_keyed(nine, lengths=lengths, seeds=(0, 1, 2)), baseline="tiny-rope")
    assert all(r.p_holm == pytest.approx(7 * 2 / 512) for r in summary.paired) and summary.out_of_reach == []
    assert summary.mark(4096, "tiny-bam") == "▼" and "can reach" not in caption(summary)


def test_ruler_samples_share_their_draw_across_depths_as_passkey_keys_do():
    from bamctl.results.render import caption

    rows = [fake_row("tiny-rope", task="niah_single_1", protocol="ruler", scoring="generate", depth=depth, seed=seed,
                     sample=sample, score=float(sample == 0))
            for seed in (0, 1) for depth in (0.0, 0.5, 1.0) for sample in range(2)]
    (summary,) = summarize(frame_of(rows))
    assert summary.unit == "draws" and "12 prompts, 4 draws per cell" in caption(summary)
    wilson = scipy_stats.binomtest(2, 4).proportion_ci(method="wilson")  # 2 of 4 draws right at every depth
    assert summary.table.loc[1024, ("lo", "tiny-rope")] == pytest.approx(wilson.low)


def test_cells_of_different_sizes_give_their_counts_in_the_cell():
    from bamctl.results.render import caption, format_cell

    frame = pd.concat([_keyed({"tiny-bam": _per_key([1] * 8)}, lengths=(1024,)),
                       _keyed({"tiny-bam": _per_key([1] * 4)}, lengths=(2048,))], ignore_index=True)
    (summary,) = summarize(frame)
    assert format_cell(summary, 2048, "tiny-bam").endswith("(20 prompts, 4 keys)")
    assert format_cell(summary, 1024, "tiny-bam").endswith("(40 prompts, 8 keys)")
    assert caption(summary).startswith("cells differ in size")


# -- perplexity: the document is the unit ---------------------------------------------------------


def _seeded_documents(nll: dict[str, dict[str, float]], picks: dict[int, list[str]], draw: bool = True):
    """One row per (model, seed, document picked by that seed): two seeds may pick one document."""
    rows = []
    for model, per_document in nll.items():
        for seed, documents in picks.items():
            for sample, document in enumerate(documents):
                v = per_document[document]
                extra = {"draw": document} if draw else {}
                rows.append(fake_row(model, task="ppl", protocol="buckets", scoring="nll", length=256, depth=None,
                                     seed=seed, sample=sample, score=v, nll=v * 100, n_scored=100, **extra))
    return frame_of(rows)


def test_a_document_two_seeds_picked_counts_once():
    from bamctl.results.render import caption

    nll = {"tiny-rope": {"a@256": 2.0, "b@256": 2.4, "c@256": 1.8, "d@256": 2.6},
           "tiny-bam": {"a@256": 1.5, "b@256": 2.5, "c@256": 1.2, "d@256": 2.0}}
    picks = {0: ["a@256", "b@256", "c@256"], 1: ["c@256", "d@256", "a@256"]}  # a and c picked twice
    (summary,) = summarize(_seeded_documents(nll, picks), baseline="tiny-rope")
    cell = summary.table.loc[256]
    assert (cell[("n", "tiny-rope")], cell[("n_draws", "tiny-rope")], cell[("n_scored", "tiny-rope")]) == (4, 4, 400)
    assert cell[("ppl", "tiny-rope")] == pytest.approx(math.exp((2.0 + 2.4 + 1.8 + 2.6) / 4))  # each once
    assert "4 buckets, 4 documents per cell" in caption(summary)
    (result,) = summary.paired
    d = np.array([nll["tiny-bam"][k] - nll["tiny-rope"][k] for k in sorted(nll["tiny-rope"])])
    expected = scipy_stats.permutation_test(
        (d,), np.mean, permutation_type="samples", n_resamples=np.inf, alternative="two-sided"
    ).pvalue
    assert (result.n_draws, result.difference) == (4, pytest.approx(d.mean())) and result.p == pytest.approx(expected)
    assert result.n == 4  # buckets paired: the copies a second seed picked are not paired again


def test_old_perplexity_rows_of_two_seeds_are_the_same_documents():
    # rows without `draw`: every generator that wrote them chose document `sample` whatever the seed
    nll = {"tiny-rope": {"0": 2.0, "1": 3.0}, "tiny-bam": {"0": 1.0, "1": 2.5}}
    (summary,) = summarize(_seeded_documents(nll, {0: ["0", "1"], 1: ["0", "1"]}, draw=False), baseline="tiny-rope")
    assert summary.table.loc[256, ("n_draws", "tiny-rope")] == 2 and summary.table.loc[256, ("n", "tiny-rope")] == 2
    assert summary.paired[0].n_draws == 2


def test_the_reach_caption_adds_up_and_counts_one_key_as_one_key():
    """The caption's arithmetic is printed to three figures, so it adds up as written (at .2g,
    "2/2^4 = 0.12 … 5 × 0.12 = 0.62" did not); a cell of one key says "1 key"."""
    from bamctl.results.render import caption

    lengths = tuple(512 * 2**i for i in range(5))
    worst = {"tiny-bam": _per_key([0] * 4), "tiny-rope": _per_key([1] * 4)}
    (summary,) = summarize(_keyed(worst, lengths=lengths), baseline="tiny-rope")
    text = caption(summary)
    assert "the smallest p is 2/2^4 = 0.125" in text and "makes it 5 × 0.125 = 0.625" in text
    one = {"tiny-bam": _per_key([0]), "tiny-rope": _per_key([1])}
    text = caption(summarize(_keyed(one, lengths=lengths[:2], seeds=(0,)), baseline="tiny-rope")[0])
    assert "with 1 key per cell" in text and "1 keys" not in text
    assert "makes it 2 × 1 = 2, a p of 1 once capped;" in text  # a p-value above 1 is said to be one


# -- edges the mutation run (scripts/mutation.sh) found untested -------------------------------


def test_json_writes_an_unadjusted_p_as_null_and_an_out_of_reach_comparison_as_its_fields():
    from bamctl.results.stats import OutOfReach, PairedResult

    result = PairedResult("m", "b", 1024, 8, 8, "mcnemar", 0.25, -0.1, 0.6, 0.5, 0.0078)
    assert result.to_dict()["p_holm"] is None and result.to_dict()["p"] == 0.5
    reach = OutOfReach("m", "b", 7, 8, 6, 2 / 64, 7 * 2 / 64, 9)
    assert reach.to_dict() == {"model": "m", "baseline": "b", "lengths": 7, "n_draws": 8, "n_draws_fewest": 6,
                               "p_min": 2 / 64, "p_holm_floor": 7 * 2 / 64, "draws_needed": 9}


def test_a_paired_interval_with_every_pair_alike_or_one_way_has_no_width():
    # b + c - (b - c)^2 / n is 0 when no pair differs and when every pair differs the same way
    assert paired_difference_interval(0, 0, 20) == (0.0, 0.0)
    assert paired_difference_interval(20, 0, 20) == (1.0, 1.0)
    assert paired_difference_interval(0, 20, 20) == (-1.0, -1.0)


def test_sign_flips_are_enumerated_up_to_and_including_the_resample_budget():
    assert sign_flips_are_enumerated(3, 8) and not sign_flips_are_enumerated(4, 8)
    # with a budget below 2^5, five differences take random flips: p is a multiple of 1 / (8 + 1)
    d = np.array([0.5, 0.25, 1.0, -0.25, 0.75])
    p = sign_flip_p(d, resamples=8)
    assert p * 9 == pytest.approx(round(p * 9)) and p != pytest.approx(sign_flip_p(d))


def test_draws_needed_stops_at_the_first_k_strictly_below_alpha():
    assert draws_needed(1, alpha=1.5) == 1  # one draw: 2 / 2 = 1 < 1.5
    assert draws_needed(4, alpha=0.25) == 6  # k = 5 gives 4 × 2 / 32 = 0.25, not below
    assert draws_needed(1, alpha=0.3) == 3  # 2 / 8 = 0.25 < 0.3 <= 2 / 4


def test_a_document_is_one_per_length_not_one_per_sweep():
    rows = pd.DataFrame({"_label": ["m", "m", "m"], "length": [256, 512, 256], "_draw": ["doc0"] * 3,
                         "position": [1, 1, 1], "seed": [0, 0, 1], "sample": [0, 0, 0]})
    kept = one_copy_per_document(rows)
    assert kept.index.tolist() == [0, 1]  # both lengths; at 256 the copy of seed 0


def test_documents_one_model_lacks_do_not_make_two_models_score_differently():
    rows = pd.DataFrame({"length": [256] * 3, "_draw": ["doc0", "doc1", "doc0"], "_label": ["a", "a", "b"],
                         "n_scored": [100, 80, 100]})
    assert scored_alike(rows)
    assert not scored_alike(rows.assign(n_scored=[100, 80, 99]))


def _perplexity_pairs(documents: int, tokens_b: int = 100):
    rows = []
    for model, shift, tokens in (("m", -0.1, 100), ("b", 0.0, tokens_b)):
        for doc in range(documents):
            rows.append({"_label": model, "length": 256, "_draw": f"doc{doc}", "nll": (2.0 + shift + doc / 50) * tokens,
                         "n_scored": tokens})
    return pd.DataFrame(rows)


def test_perplexity_names_its_test_and_smallest_p_by_how_many_documents_it_pairs():
    (few,) = paired_tests(_perplexity_pairs(3), ["m", "b"], "b", "perplexity")
    assert (few.test, few.p_min, few.n_draws) == ("sign-flip", 2 / 8, 3)
    assert few.difference == pytest.approx(-0.1)
    (many,) = paired_tests(_perplexity_pairs(14), ["m", "b"], "b", "perplexity")
    assert (many.test, many.p_min) == ("sign-flip-random", 1 / 10_001)


def test_perplexity_is_not_paired_when_the_models_scored_different_tokens():
    assert paired_tests(_perplexity_pairs(3, tokens_b=90), ["m", "b"], "b", "perplexity") == []


def test_a_rows_draw_is_its_own_else_seed_and_sample_else_its_document():
    rows = pd.DataFrame({"seed": [3, 3, 4, 3], "sample": [0, 1, 0, 7], "draw": ["3/0", None, None, None],
                         "nll": [None, None, None, 2.5]})
    assert draw_ids(rows).tolist() == ["3/0", "3/1", "4/0", "doc7"]
    assert draw_ids(rows.drop(columns=["draw", "nll"])).tolist() == ["3/0", "3/1", "4/0", "3/7"]


def test_the_smallest_p_of_no_draw_is_one():
    assert smallest_p(0, True) == smallest_p(0, False) == 1.0
    assert smallest_p(1, True) == 1.0 and smallest_p(5, True) == 2 / 32 and smallest_p(20, False) == 1 / 10_001


def test_the_paired_test_names_what_it_ran_and_the_smallest_p_it_can_give():
    one_each = draw_sign_flip_test(np.array([1, 1, 0, 1, 1]), np.array([0, 1, 0, 0, 1]), np.array(list("abcde")))
    assert one_each[2] == MCNEMAR and one_each[7] == 2 / 32  # McNemar over 5 keys: exact, 2 / 2^5
    many = 20
    drawn = draw_sign_flip_test(np.tile([1.0, 0.0], many), np.tile([0.0, 0.0], many), np.repeat(np.arange(many), 2))
    assert drawn[2] == SIGN_FLIP_RANDOM and drawn[7] == 1 / 10_001  # 2^20 patterns: drawn


def test_the_paired_test_does_not_depend_on_the_rows_order():
    rng = np.random.default_rng(5)
    m, b = rng.random(40).round(2), rng.random(40).round(2)
    draws = np.repeat([f"k{i:02d}" for i in range(20)], 2)
    order = rng.permutation(40)
    assert draw_sign_flip_test(m[order], b[order], draws[order]) == draw_sign_flip_test(m, b, draws)


def _paired_rows(lengths, labels):
    rng = np.random.default_rng(11)
    frames = []
    for length in lengths:
        for label in labels:
            frames.append(pd.DataFrame({"_label": label, "length": length, "seed": 0, "sample": range(12),
                                        "_draw": [f"0/{i}" for i in range(12)], "score": (rng.random(12) < 0.6).astype(float)}))
    return pd.concat(frames, ignore_index=True)


def test_paired_tests_cover_every_model_in_length_order_whatever_the_rows_order():
    rows = _paired_rows((2048, 512, 1024), ("base", "x", "y"))
    results = paired_tests(rows, ["base", "x", "y"], "base", "accuracy")
    assert [(r.model, r.length) for r in results] == [(m, n) for m in ("x", "y") for n in (512, 1024, 2048)]


def test_an_out_of_reach_comparison_carries_its_baseline_and_its_floor_at_most_one():
    def result(model, length, draws, p_min):
        return PairedResult(model, "base", length, draws, draws, MCNEMAR, 0.0, -0.1, 0.1, 1.0, p_min)

    results = [result("x", n, 2, 0.5) for n in (512, 1024, 2048)] + [result("y", 512, 30, 2 / 2**30)]
    (reach,) = out_of_reach(results)
    assert (reach.model, reach.baseline, reach.lengths, reach.p_min, reach.p_holm_floor) == ("x", "base", 3, 0.5, 1.0)


def test_a_mark_is_the_significant_result_of_its_own_length_and_lower_is_better_for_perplexity():
    import dataclasses

    from results_fakes import passkey_grid, perplexity_rows

    def result(length, difference, p_holm):
        return PairedResult("tiny-bam", "tiny-rope", length, 8, 8, MCNEMAR, difference, difference - 0.1,
                            difference + 0.1, p_holm, 0.01, p_holm)

    accuracy, = summarize(frame_of(passkey_grid()))
    marked = dataclasses.replace(accuracy, paired=(result(1024, 0.3, 0.01), result(2048, -0.3, 0.01), result(4096, 0.5, 0.2)))
    assert [marked.mark(n, "tiny-bam") for n in (512, 1024, 2048, 4096)] == ["", "▲", "▼", ""]  # 4k: not significant
    assert marked.mark(1024, "tiny-rope") == ""
    perplexity, = summarize(frame_of(perplexity_rows()))
    # a difference of mean NLL per token: below 0 is better, and a small rise is still worse
    marked = dataclasses.replace(perplexity, paired=(result(512, -0.2, 0.01), result(1024, 0.5, 0.01)))
    assert [marked.mark(n, "tiny-bam") for n in (512, 1024)] == ["▲", "▼"]


def test_answer_logprob_comparisons_pair_each_keys_answer_logprob_not_its_score():
    """--metric answer_logprob --baseline: the paired test runs on the answer log-probabilities (both
    models here score 0 on every key, so a test on scores would find no difference); rows without
    one are left out."""
    values = {"tiny-rope": [-6.0, -5.0, -7.0, -6.5, -5.5, -6.2], "tiny-bam": [-2.0, -1.5, -2.5, -1.0, -2.2, -1.8]}
    rows = [fake_row(model, sample=i, score=0.0, answer_logprob=v) for model, vs in values.items() for i, v in enumerate(vs)]
    rows.append(fake_row("tiny-bam", sample=6, score=0.0, answer_logprob=None))  # a generated row asked without it
    rows.append(fake_row("tiny-rope", sample=6, score=0.0, answer_logprob=-6.0))  # so key 6 has no pair
    (summary,) = summarize(frame_of(rows), metric="answer_logprob", baseline="tiny-rope")
    (result,) = summary.paired
    d = np.array(values["tiny-bam"]) - np.array(values["tiny-rope"])
    assert (result.n, result.n_draws) == (6, 6) and result.difference == pytest.approx(d.mean())
    assert result.p == pytest.approx(2 / 2**6)  # every key better: the two extreme sign patterns of 64


def test_the_threshold_asked_is_the_one_effective_lengths_use():
    rows = [fake_row("tiny-rope", length=n, sample=i, score=1.0 if i < right else 0.0)
            for n, right in ((512, 10), (1024, 7), (2048, 4)) for i in range(10)]
    assert summarize(frame_of(rows))[0].effective.loc["tiny-rope", "length"] == 512
    assert summarize(frame_of(rows), threshold=0.7)[0].effective.loc["tiny-rope", "length"] == 1024


def test_a_perplexity_comparison_weighs_a_documents_windows_by_their_tokens():
    """Sliding windows of one document score unequal numbers of tokens (the first window scores
    all but one of its tokens, later ones only the stride): a document's mean NLL per token is
    Σ nll / Σ tokens over its windows, not the mean of its windows' means."""
    windows = {"tiny-rope": [(2.0, 3.0), (2.2, 2.6), (1.8, 3.4), (2.4, 2.0)], "tiny-bam": [(1.5, 3.5), (2.1, 3.0), (1.6, 2.2), (2.0, 3.1)]}
    tokens = (90, 10)  # per window of every document
    rows = [fake_row(model, task="ppl", protocol="sliding", scoring="nll", length=256, depth=None, sample=doc,
                     score=v, nll=v * n, n_scored=n, draw=f"doc@{doc}") | {"position": position}
            for model, docs in windows.items() for doc, values in enumerate(docs)
            for position, (v, n) in enumerate(zip(values, tokens))]
    (summary,) = summarize(frame_of(rows), baseline="tiny-rope")
    (result,) = summary.paired

    def per_token(model):
        return np.array([sum(v * n for v, n in zip(values, tokens)) / sum(tokens) for values in windows[model]])

    d = per_token("tiny-bam") - per_token("tiny-rope")
    assert (result.n, result.n_draws) == (8, 4) and result.difference == pytest.approx(d.mean())
    unweighted = np.mean([np.mean(b) - np.mean(r) for b, r in zip(windows["tiny-bam"], windows["tiny-rope"])])
    assert abs(result.difference - unweighted) > 0.05  # what a mean of window means would have said


def test_a_model_of_other_prompts_is_tested_unpaired_beside_the_paired_ones():
    """A model whose prompts another tokenizer built (another fingerprint, the same seeds and lengths)
    shares the table and is tested against the baseline by the unpaired test; the others, paired."""
    from bamctl.results.stats import UNPAIRED

    rows = [fake_row(model, length=n, sample=i, score=float(i % 2 or model != "tiny-rope"))
            for model in ("tiny-rope", "tiny-alibi", "tiny-bam") for n in (512, 1024) for i in range(6)]
    rows = [row | {"fingerprint": "fp-other-tokenizer"} if row["model"] == "tiny-bam" else row for row in rows]
    (summary,) = summarize(frame_of(rows), baseline="tiny-rope")
    assert summary.other_prompts == ("tiny-bam",)
    tests = {(r.model, r.length): r.test for r in summary.paired}
    assert tests[("tiny-bam", 512)] == tests[("tiny-bam", 1024)] == UNPAIRED
    assert tests[("tiny-alibi", 512)] != UNPAIRED and len(tests) == 4
    unpaired = [r for r in summary.paired if r.model == "tiny-bam"]
    assert all(r.baseline == "tiny-rope" and r.difference == pytest.approx(0.5) for r in unpaired)  # 1 against 1/2


def test_perplexity_of_other_prompts_is_never_tested_against_the_baseline():
    """Another tokenizer's documents are other tokens: their NLLs are not compared, paired or not."""
    rows = [fake_row(model, task="ppl", protocol="sliding", scoring="nll", length=256, depth=None, sample=doc,
                     score=v, nll=v * 100, n_scored=100)
            for model, v in (("tiny-rope", 2.0), ("tiny-alibi", 1.8), ("tiny-bam", 1.5)) for doc in range(4)]
    rows = [row | {"fingerprint": "fp-other-tokenizer"} if row["model"] == "tiny-bam" else row for row in rows]
    (summary,) = summarize(frame_of(rows), baseline="tiny-rope")
    assert summary.other_prompts == ("tiny-bam",)
    assert [r.model for r in summary.paired] == ["tiny-alibi"]
