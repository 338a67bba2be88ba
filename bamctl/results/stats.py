"""Paired statistics: is one model really better than another on the same prompts?

bamctl runs every model on identical samples (same fingerprint, same keys), so two
models can be compared sample by sample, which is far more sensitive than comparing
two separate intervals. For each model against a baseline, at each length:

- 0/1 scores (passkey, exact match): the exact McNemar test on the discordant pairs
  (b = model right and baseline wrong, c = the reverse): two-sided p =
  min(1, 2 · P[Binomial(b + c, 1/2) <= min(b, c)]); the difference of accuracies
  (b - c) / n with its 95% Wald interval for paired proportions,
  d ± 1.96 · sqrt(b + c - (b - c)² / n) / n;
- fractional scores (RULER's string_match_all) and perplexity: a paired sign-flip
  permutation test (exact when 2^n <= PERMUTATIONS, else that many seeded random
  flips) and a seeded paired bootstrap percentile interval of the mean difference.
  Perplexity pairs documents, not windows: per document, the model's mean NLL per
  scored token minus the baseline's over the same tokens, each document counting
  once (nats; negative: the model is better). Models that scored different tokens
  of a document (other vocabularies) are not paired at all.

p-values are adjusted across the lengths of one comparison with Holm's step-down
method. Everything is a pure function of the rows and ``SEED``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

SEED = 0  # every resampling is seeded: the same rows give the same figures
PERMUTATIONS = 10_000  # random sign flips (or all of them when there are fewer)
BOOTSTRAPS = 2_000
Z_95 = 1.959963984540054  # two-sided 95% normal quantile
ALPHA = 0.05

# Columns that name one sample: rows of two models with these equal were asked the same.
PAIR_COLUMNS = ("length", "depth", "seed", "sample", "position")


@dataclass(frozen=True)
class PairedResult:
    """One model against the baseline at one length."""

    model: str
    baseline: str
    length: int
    n: int  # pairs (samples, or documents for perplexity)
    test: str  # "mcnemar" or "permutation"
    difference: float  # model - baseline: accuracy, or the mean over documents of their mean NLL per token
    lo: float  # 95% interval of the difference
    hi: float
    p: float
    p_holm: float = math.nan  # adjusted across the lengths of this comparison

    @property
    def significant(self) -> bool:
        return self.p_holm < ALPHA

    def to_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}


# -- the tests, on plain arrays ------------------------------------------------------------


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired_difference_interval(b: int, c: int, n: int) -> tuple[float, float]:
    """95% Wald interval of the difference of two paired proportions, (b - c) / n, clipped to [-1, 1]."""
    if n == 0:
        return (math.nan, math.nan)
    d = (b - c) / n
    half = Z_95 * math.sqrt(max(b + c - (b - c) ** 2 / n, 0.0)) / n
    return (max(-1.0, d - half), min(1.0, d + half))


def sign_flip_p(differences: np.ndarray, seed: int = SEED, resamples: int = PERMUTATIONS) -> float:
    """Two-sided paired permutation p-value of the mean difference: each pair's sign flipped at
    random (all 2^n flips when that is at most ``resamples``)."""
    d = np.asarray(differences, dtype=float)
    n = len(d)
    if n == 0:
        return math.nan
    observed = abs(d.mean())
    if 2**n <= resamples:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))
        means = np.abs(signs @ d / n)
        return float(np.mean(means >= observed - 1e-12))
    signs = np.random.default_rng(seed).choice((1.0, -1.0), size=(resamples, n))
    means = np.abs(signs @ d / n)
    return float((1 + np.sum(means >= observed - 1e-12)) / (resamples + 1))


def bootstrap_interval(differences: np.ndarray, seed: int = SEED, resamples: int = BOOTSTRAPS) -> tuple[float, float]:
    """95% percentile interval of the mean of paired differences, resampling pairs."""
    d = np.asarray(differences, dtype=float)
    if len(d) == 0:
        return (math.nan, math.nan)
    picks = np.random.default_rng(seed).integers(0, len(d), size=(resamples, len(d)))
    means = d[picks].mean(axis=1)
    return (float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975)))


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment: sorted ascending, p_(i) · (m - i), running maximum, at most 1."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [math.nan] * len(p_values), 0.0
    m = len(p_values)
    for rank, i in enumerate(order):
        running = max(running, min(1.0, p_values[i] * (m - rank)))
        adjusted[i] = running
    return adjusted


# -- rows to tests ----------------------------------------------------------------------------


def _pairs(rows: pd.DataFrame, model: str, baseline: str, value) -> pd.DataFrame:
    """The two models' values side by side on the samples both ran (``value`` computes it per group)."""
    keys = [c for c in PAIR_COLUMNS if c in rows]
    sides = []
    for name, suffix in ((model, "m"), (baseline, "b")):
        own = rows[rows["_label"] == name]
        sides.append(value(own, keys).rename(suffix))
    return pd.concat(sides, axis=1, join="inner").dropna()


def _accuracy_values(rows: pd.DataFrame, keys: list[str]) -> pd.Series:
    return rows.set_index(keys)["score"].astype(float)


def _document_nll(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (length, seed, document): summed NLL and scored tokens over its windows or buckets."""
    grouped = rows.groupby(["length", "seed", "sample"])
    return pd.DataFrame({"nll": grouped["nll"].sum().astype(float), "n": grouped["n_scored"].sum().astype(float)})


def scored_alike(rows: pd.DataFrame) -> bool:
    """Whether every model (``_label``) scored as many tokens of each document as every other: false
    when their vocabularies differ, and their perplexities are then not comparable."""
    tokens = rows.groupby(["length", "seed", "sample", "_label"])["n_scored"].sum().unstack("_label")
    return bool((tokens.nunique(axis=1, dropna=True) <= 1).all())


def paired_tests(rows: pd.DataFrame, models: list[str], baseline: str, metric: str) -> list[PairedResult]:
    """Every model but the baseline against it, at each length where both ran the same samples.

    ``rows`` carry a ``_label`` column (the table's model names) and come from one
    (task, protocol, setting, fingerprint) group.
    """
    results: list[PairedResult] = []
    for model in models:
        if model == baseline:
            continue
        own = []
        for length, group in rows.groupby("length", sort=True):
            result = _perplexity_test(group, model, baseline) if metric == "perplexity" else _accuracy_test(group, model, baseline)
            if result is not None:
                own.append(PairedResult(model, baseline, int(length), *result))
        adjusted = holm([r.p for r in own])
        results += [PairedResult(**{**asdict(r), "p_holm": p}) for r, p in zip(own, adjusted)]
    return results


def _accuracy_test(group: pd.DataFrame, model: str, baseline: str):
    pairs = _pairs(group, model, baseline, _accuracy_values)
    if pairs.empty:
        return None
    m, b = pairs["m"].to_numpy(), pairs["b"].to_numpy()
    n = len(pairs)
    if np.isin(m, (0.0, 1.0)).all() and np.isin(b, (0.0, 1.0)).all():
        right_wrong, wrong_right = int(np.sum((m == 1) & (b == 0))), int(np.sum((m == 0) & (b == 1)))
        lo, hi = paired_difference_interval(right_wrong, wrong_right, n)
        return (n, "mcnemar", (right_wrong - wrong_right) / n, lo, hi, mcnemar_exact(right_wrong, wrong_right))
    d = m - b
    lo, hi = bootstrap_interval(d)
    return (n, "permutation", float(d.mean()), lo, hi, sign_flip_p(d))


def _perplexity_test(group: pd.DataFrame, model: str, baseline: str):
    sides = [_document_nll(group[group["_label"] == name]).add_suffix(f"_{suffix}") for name, suffix in ((model, "m"), (baseline, "b"))]
    pairs = pd.concat(sides, axis=1, join="inner").dropna()
    if pairs.empty or (pairs["n_m"] != pairs["n_b"]).any():  # not the same tokens: nothing to pair
        return None
    d = ((pairs["nll_m"] - pairs["nll_b"]) / pairs["n_b"]).to_numpy()
    lo, hi = bootstrap_interval(d)
    return (len(pairs), "permutation", float(d.mean()), lo, hi, sign_flip_p(d))
