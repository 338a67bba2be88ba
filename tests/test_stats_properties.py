"""Properties the statistics must keep on every input, not only on the tables worked by hand in
test_stats.py: Hypothesis draws the counts, scores and p-values.

Most properties are stated without a reference (an interval holds its estimate, a swap mirrors
it, an adjustment never lowers a p-value); McNemar's p is compared against scipy's binomial test,
an implementation independent of ours.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis not installed (a dev extra: pip install hypothesis)")
from hypothesis import Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from bamctl.results.stats import draw_sign_flip_test, holm, mcnemar_exact, paired_difference_interval  # noqa: E402
from bamctl.results.summary import accuracy_table, effective_length, wilson_interval  # noqa: E402

from results_fakes import fake_row, frame_of  # noqa: E402

scipy_stats = pytest.importorskip("scipy.stats", reason="scipy not installed (a test extra: pip install scipy)")

# Modest and without a deadline: the default suite stays fast, and a loaded machine does not flake.
SETTINGS = settings(max_examples=60, deadline=None)
# scripts/mutation.sh runs these once per mutant, where a failure counts as found and shrinking it
# to the smallest example would only spend the run's time.
settings.register_profile("mutation", phases=[Phase.explicit, Phase.reuse, Phase.generate])
if os.environ.get("BAMCTL_HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["BAMCTL_HYPOTHESIS_PROFILE"])
TOLERANCE = 1e-9  # float rounding between a mean and the same mean resampled


@st.composite
def successes(draw, max_n=400):
    n = draw(st.integers(1, max_n))
    return draw(st.integers(0, n)), n


@SETTINGS
@given(successes())
def test_the_wilson_interval_holds_k_over_n_inside_zero_one(counts):
    k, n = counts
    lo, hi = wilson_interval(k, n)
    assert 0.0 <= lo <= k / n <= hi <= 1.0
    assert (lo == 0.0) == (k == 0) and (hi == 1.0) == (k == n)


@SETTINGS
@given(successes(max_n=200), st.integers(2, 10))
def test_the_wilson_interval_narrows_as_n_grows_at_the_same_proportion(counts, times):
    k, n = counts
    lo, hi = wilson_interval(k, n)
    wider_lo, wider_hi = wilson_interval(k * times, n * times)
    assert wider_hi - wider_lo < hi - lo


@st.composite
def discordant(draw):
    n = draw(st.integers(1, 300))
    b = draw(st.integers(0, n))
    return b, draw(st.integers(0, n - b)), n


@SETTINGS
@given(discordant())
def test_the_paired_proportion_interval_holds_its_difference_and_mirrors(counts):
    b, c, n = counts
    lo, hi = paired_difference_interval(b, c, n)
    assert -1.0 <= lo <= (b - c) / n <= hi <= 1.0
    assert paired_difference_interval(c, b, n) == pytest.approx((-hi, -lo), abs=1e-15)


@st.composite
def paired_prompts(draw):
    """Two models' scores on the same prompts, each prompt in a draw: 0/1 scores one prompt per
    draw (McNemar's branch), or several prompts per draw and partial scores (the bootstrap's)."""
    n = draw(st.integers(1, 24))
    binary = draw(st.booleans())
    score = st.sampled_from([0.0, 1.0]) if binary else st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0])
    m = np.array(draw(st.lists(score, min_size=n, max_size=n)))
    b = np.array(draw(st.lists(score, min_size=n, max_size=n)))
    draws = np.arange(n) if draw(st.booleans()) else np.array(draw(st.lists(st.integers(0, 5), min_size=n, max_size=n)))
    return m, b, draws


@SETTINGS
@given(paired_prompts())
def test_a_paired_test_holds_the_difference_it_prints_and_mirrors_when_the_models_swap(prompts):
    m, b, draws = prompts
    n, k, test, difference, lo, hi, p, p_min = draw_sign_flip_test(m, b, draws)
    assert lo - TOLERANCE <= difference <= hi + TOLERANCE
    swapped = draw_sign_flip_test(b, m, draws)
    assert swapped[:3] == (n, k, test)
    assert swapped[3:6] == pytest.approx((-difference, -hi, -lo), abs=TOLERANCE)
    assert swapped[6:] == pytest.approx((p, p_min))
    assert p_min <= p <= 1.0 + TOLERANCE


@SETTINGS
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=12))
def test_holm_is_monotone_and_never_below_the_raw_p(p_values):
    adjusted = holm(p_values)
    m = len(p_values)
    for raw, adj in zip(p_values, adjusted):
        assert raw <= adj <= min(1.0, m * raw)
    for i in range(m):
        for j in range(m):
            if p_values[i] <= p_values[j]:
                assert adjusted[i] <= adjusted[j]


@SETTINGS
@given(st.integers(0, 80), st.integers(0, 80))
def test_mcnemar_is_scipys_binomial_test_on_the_discordant_pairs(b, c):
    expected = 1.0 if b + c == 0 else scipy_stats.binomtest(b, b + c, 0.5).pvalue
    assert mcnemar_exact(b, c) == pytest.approx(expected, rel=1e-9, abs=1e-300)


LENGTHS = (1024, 2048, 4096, 8192)


@st.composite
def cells(draw):
    """Per length, one model's 0/1 score on each of its keys (one prompt per key)."""
    keys = draw(st.integers(1, 40))
    return [draw(st.lists(st.booleans(), min_size=keys, max_size=keys)) for _ in LENGTHS]


def _effective(scores: list[list[bool]], threshold: float):
    rows = [fake_row("tiny-bam", length=length, sample=i, score=float(hit), depth=0.5)
            for length, hits in zip(LENGTHS, scores) for i, hit in enumerate(hits)]
    row = effective_length(accuracy_table(frame_of(rows)), threshold).loc["tiny-bam"]
    return tuple(0 if pd.isna(row[field]) else int(row[field]) for field in ("length", "certified"))  # 0: none passes


@settings(max_examples=40, deadline=None)
@given(cells(), st.data(), st.sampled_from([0.5, 0.8, 0.9]))
def test_effective_lengths_never_grow_when_a_cells_score_falls(scores, data, threshold):
    hit_at = [(cell, key) for cell, hits in enumerate(scores) for key, hit in enumerate(hits) if hit]
    if not hit_at:
        return
    cell, key = data.draw(st.sampled_from(hit_at))
    fallen = [list(hits) for hits in scores]
    fallen[cell][key] = False
    before, after = _effective(scores, threshold), _effective(fallen, threshold)
    assert after[0] <= before[0] and after[1] <= before[1]
    assert after[1] <= after[0]  # the certified length is never past the mean's
