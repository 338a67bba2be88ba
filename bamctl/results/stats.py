"""Paired statistics over independent draws: is one model really better than another on the same prompts?

**Draws.** The unit of every statistic is the *draw*, not the prompt. Prompts of one cell
(one model at one length) that share their random content are one draw: the 5 depths of one
passkey index carry the same key, so a cell of 2 seeds × 5 depths × 4 samples holds 40 prompts
but only 8 independent keys. A row names its draw in the column ``draw``; rows without it
(files written before it) fall back to ``"{seed}/{sample}"``, which is what the generators seed
on: passkey's key (``bamctl/tasks/passkey.py:passkey_key``, seeded on seed, task, length and
index) and every RULER task's draws (``bamctl/tasks/ruler.py:_identity`` is (task, task, length,
index) for the NIAH keys, values, needle order and placement; ``variable_tracking.py``,
``common_words.py`` and ``frequent_words.py`` seed on (task, length, index)): none of them has
the depth, so a sample index is one draw at every depth, for RULER as for passkey. Perplexity's
draw is the document: perplexity rows without ``draw`` fall back to ``"doc{sample}"``, because
every generator that wrote them (``bamctl/tasks/perplexity.py:ppl_document``) chose the document
by its index alone, the same for every seed. A document met under two seeds is one document:
one copy of its rows is kept per (model, length, draw, position) (``one_copy_per_document``).

**The tests.** For each model against a baseline, at each length, the two models' prompts are
paired on the same rows (length, depth, seed, sample, position, draw); each draw's paired
prompts give one difference, the mean of the model's scores on them minus the baseline's
(perplexity: the document's mean NLL per scored token, model minus baseline; nats, negative:
the model is better; models that scored different tokens of a document, other vocabularies,
are not paired at all). On those per-draw differences:

- the exact paired sign-flip permutation test of their mean (Fisher, *The Design of
  Experiments*, 1935, ch. III; Good, *Permutation, Parametric and Bootstrap Tests of
  Hypotheses*, 2005): each draw's difference keeps or flips its sign, which is what "no
  difference" allows; two-sided p = the share of the 2^k sign patterns whose |mean| reaches the
  observed one, all of them enumerated while 2^k <= PERMUTATIONS, else PERMUTATIONS seeded
  random patterns with p = (1 + hits) / (PERMUTATIONS + 1)
  (``test`` "sign-flip" or "sign-flip-random"). When every draw is one prompt scored 0/1,
  the differences are -1, 0, 1 and the sign-flip test *is* the exact McNemar test (the
  two-sided binomial test on the b + c discordant pairs): p = min(1, 2 · P[Binomial(b + c, 1/2)
  <= min(b, c)]), computed in that closed form for any n (``test`` "mcnemar"), with the 95% Wald
  interval for paired proportions, d ± 1.96 · sqrt(b + c - (b - c)² / n) / n;
- otherwise the 95% percentile interval of the mean difference by a paired cluster bootstrap:
  draws resampled with replacement, each carrying all its prompts (Field & Welsh 2007,
  "Bootstrapping clustered data", JRSS B 69:369-390), seeded.

The smallest p a test can give is ``p_min``: 2 / 2^k with k draws (every draw differing one
way: only that pattern and its mirror reach it), or 1 / (PERMUTATIONS + 1) with random flips.
p-values are adjusted across the lengths of one comparison with Holm's step-down method (Holm
1979); under it every adjusted p is at least m × the smallest raw p over the m lengths, so a
comparison whose m × min(p_min) is ≥ ALPHA cannot show a difference whatever the models do
(``out_of_reach``), and it would take the smallest k with m × 2 / 2^k < ALPHA draws per cell
(``draws_needed``). Everything is a pure function of the rows and ``SEED``.
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

# Columns that name one prompt: rows of two models with these equal were asked the same.
PAIR_COLUMNS = ("length", "depth", "seed", "sample", "position")

# PairedResult.test: what the p-value is.
MCNEMAR = "mcnemar"  # every draw one 0/1 prompt: the exact McNemar test (closed form)
SIGN_FLIP = "sign-flip"  # exact sign-flip test over draws, every pattern enumerated
SIGN_FLIP_RANDOM = "sign-flip-random"  # the same test on PERMUTATIONS seeded random patterns
UNPAIRED = "permutation-unpaired"  # models that saw other prompts: their draws' labels permuted (``unpaired_tests``)


@dataclass(frozen=True)
class PairedResult:
    """One model against the baseline at one length."""

    model: str
    baseline: str
    length: int
    n: int  # paired prompts (rows; windows or buckets for perplexity)
    n_draws: int  # paired draws (keys, RULER draws, documents): the units the test counts
    test: str  # MCNEMAR, SIGN_FLIP or SIGN_FLIP_RANDOM
    difference: float  # model - baseline: mean over draws of their mean score, or of their mean NLL per token
    lo: float  # 95% interval of the difference
    hi: float
    p: float
    p_min: float  # the smallest p this test can give with these draws
    p_holm: float = math.nan  # adjusted across the lengths of this comparison

    @property
    def significant(self) -> bool:
        return self.p_holm < ALPHA

    def to_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}


# -- draws ---------------------------------------------------------------------------------


def draw_ids(rows: pd.DataFrame) -> pd.Series:
    """The draw each row belongs to: its ``draw``, else ``"{seed}/{sample}"``, or ``"doc{sample}"``
    for a perplexity row (one carrying ``nll``; see the module docstring for why)."""
    sample = rows["sample"].astype(str)
    fallback = rows["seed"].astype(str) + "/" + sample
    if "nll" in rows:
        fallback = fallback.where(rows["nll"].isna(), "doc" + sample)
    if "draw" not in rows:
        return fallback.astype(object)
    draw = rows["draw"].astype(object)
    return draw.where(draw.notna(), fallback)


def one_copy_per_document(rows: pd.DataFrame) -> pd.DataFrame:
    """Perplexity rows (with ``_label`` and ``_draw``) keeping one row per (model, length, document,
    position): a document two seeds picked is scored the same way twice and counts once. The copy
    of the lowest seed is kept, so the choice does not depend on row order."""
    keys = [c for c in ("_label", "length", "_draw", "position") if c in rows]
    return rows.sort_values(["seed", "sample"], kind="stable").drop_duplicates(keys).sort_index()


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


def sign_flips_are_enumerated(n: int, resamples: int = PERMUTATIONS) -> bool:
    """Whether ``sign_flip_p`` enumerates all 2^n patterns (exact) rather than drawing ``resamples``."""
    return 2**n <= resamples


def sign_flip_p(differences: np.ndarray, seed: int = SEED, resamples: int = PERMUTATIONS) -> float:
    """Two-sided paired permutation p-value of the mean difference: each pair's sign flipped at
    random (all 2^n flips when that is at most ``resamples``)."""
    d = np.asarray(differences, dtype=float)
    n = len(d)
    if n == 0:
        return math.nan
    observed = abs(d.mean())
    if sign_flips_are_enumerated(n, resamples):
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))
        means = np.abs(signs @ d / n)
        return float(np.mean(means >= observed - 1e-12))
    signs = np.random.default_rng(seed).choice((1.0, -1.0), size=(resamples, n))
    means = np.abs(signs @ d / n)
    return float((1 + np.sum(means >= observed - 1e-12)) / (resamples + 1))


def smallest_p(n_draws: int, exact: bool, resamples: int = PERMUTATIONS) -> float:
    """The smallest two-sided p a sign-flip (or McNemar) test over ``n_draws`` draws can give:
    2 / 2^k when it is exact (all k differences one way: that pattern and its mirror), else
    1 / (resamples + 1)."""
    if n_draws == 0:
        return 1.0
    return min(1.0, math.ldexp(2.0, -n_draws)) if exact else 1 / (resamples + 1)


def draws_needed(lengths: int, alpha: float = ALPHA) -> int:
    """The fewest draws per cell with which a difference can reach Holm-adjusted p < ``alpha`` over
    ``lengths`` lengths: the smallest k with lengths × 2 / 2^k < alpha (the first-ranked test)."""
    k = 1
    while lengths * math.ldexp(2.0, -k) >= alpha:
        k += 1
    return k


def bootstrap_interval(differences: np.ndarray, seed: int = SEED, resamples: int = BOOTSTRAPS) -> tuple[float, float]:
    """95% percentile interval of the mean of paired differences, resampling pairs (here: draws)."""
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


def draw_sign_flip_test(m: np.ndarray, b: np.ndarray, draws: np.ndarray) -> tuple:
    """The paired test of prompts ``m`` (model) against ``b`` (baseline), prompt i belonging to draw
    ``draws[i]``: (n, n_draws, test, difference, lo, hi, p, p_min), as the module docstring says."""
    frame = pd.DataFrame({"m": np.asarray(m, dtype=float), "b": np.asarray(b, dtype=float), "draw": draws})
    per_draw = frame.groupby("draw", sort=True)[["m", "b"]].mean()
    n, k = len(frame), len(per_draw)
    d = (per_draw["m"] - per_draw["b"]).to_numpy()
    binary = np.isin(frame[["m", "b"]].to_numpy(), (0.0, 1.0)).all()
    if k == n and binary:  # one 0/1 prompt per draw: the sign-flip test is McNemar's, exact in closed form
        right_wrong, wrong_right = int(np.sum(d == 1)), int(np.sum(d == -1))
        lo, hi = paired_difference_interval(right_wrong, wrong_right, n)
        return (n, k, MCNEMAR, float(d.mean()), lo, hi, mcnemar_exact(right_wrong, wrong_right), smallest_p(k, True))
    exact = sign_flips_are_enumerated(k)
    lo, hi = bootstrap_interval(d)
    return (n, k, SIGN_FLIP if exact else SIGN_FLIP_RANDOM, float(d.mean()), lo, hi, sign_flip_p(d), smallest_p(k, exact))


# -- rows to tests ----------------------------------------------------------------------------


def _pairs(rows: pd.DataFrame, model: str, baseline: str) -> pd.DataFrame:
    """The two models' scores side by side (``m``, ``b``) on the prompts both ran, with their draw."""
    keys = [c for c in PAIR_COLUMNS if c in rows] + ["_draw"]
    sides = [rows[rows["_label"] == name].set_index(keys)["score"].astype(float).rename(suffix)
             for name, suffix in ((model, "m"), (baseline, "b"))]
    return pd.concat(sides, axis=1, join="inner").dropna().reset_index()


def _document_nll(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (length, document): summed NLL, scored tokens and rows over its windows or buckets."""
    grouped = rows.groupby(["length", "_draw"])
    return pd.DataFrame({
        "nll": grouped["nll"].sum().astype(float),
        "n": grouped["n_scored"].sum().astype(float),
        "rows": grouped.size(),
    })


def scored_alike(rows: pd.DataFrame) -> bool:
    """Whether every model (``_label``) scored as many tokens of each document as every other: false
    when their vocabularies differ, and their perplexities are then not comparable."""
    tokens = rows.groupby(["length", "_draw", "_label"])["n_scored"].sum().unstack("_label")
    return bool((tokens.nunique(axis=1, dropna=True) <= 1).all())


def paired_tests(rows: pd.DataFrame, models: list[str], baseline: str, metric: str) -> list[PairedResult]:
    """Every model but the baseline against it, at each length where both ran the same prompts.

    ``rows`` carry ``_label`` (the table's model names) and ``_draw`` (``draw_ids``), come from
    one (task, protocol, setting, fingerprint, dtype) group, and, for perplexity, hold one copy
    of each document (``one_copy_per_document``).
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


@dataclass(frozen=True)
class OutOfReach:
    """A comparison whose cells are too few for any difference to reach Holm-adjusted p < ALPHA."""

    model: str
    baseline: str
    lengths: int  # m, the lengths Holm adjusts over
    n_draws: int  # the most draws any of its lengths pairs
    n_draws_fewest: int  # the fewest
    p_min: float  # the smallest p any of its lengths can give
    p_holm_floor: float  # m × p_min: no adjusted p can be smaller
    draws_needed: int  # per cell, for the first-ranked length to reach ALPHA

    def to_dict(self) -> dict:
        return asdict(self)


def out_of_reach(results: list[PairedResult] | tuple[PairedResult, ...]) -> list[OutOfReach]:
    """The comparisons (one per model) that cannot show a difference: m × min(p_min) >= ALPHA."""
    out = []
    for model in dict.fromkeys(r.model for r in results):
        own = [r for r in results if r.model == model]
        smallest = min(r.p_min for r in own)
        floor = min(1.0, len(own) * smallest)
        if floor >= ALPHA:
            draws = [r.n_draws for r in own]
            out.append(OutOfReach(model, own[0].baseline, len(own), max(draws), min(draws), smallest, floor,
                                  draws_needed(len(own))))
    return out


def _accuracy_test(group: pd.DataFrame, model: str, baseline: str):
    pairs = _pairs(group, model, baseline)
    if pairs.empty:
        return None
    return draw_sign_flip_test(pairs["m"].to_numpy(), pairs["b"].to_numpy(), pairs["_draw"].to_numpy())


def _perplexity_test(group: pd.DataFrame, model: str, baseline: str):
    sides = [_document_nll(group[group["_label"] == name]).add_suffix(f"_{suffix}") for name, suffix in ((model, "m"), (baseline, "b"))]
    pairs = pd.concat(sides, axis=1, join="inner").dropna()
    if pairs.empty or (pairs["n_m"] != pairs["n_b"]).any():  # not the same tokens: nothing to pair
        return None
    d = ((pairs["nll_m"] - pairs["nll_b"]) / pairs["n_b"]).to_numpy()
    k = len(pairs)
    exact = sign_flips_are_enumerated(k)
    lo, hi = bootstrap_interval(d)
    return (int(pairs["rows_b"].sum()), k, SIGN_FLIP if exact else SIGN_FLIP_RANDOM, float(d.mean()), lo, hi,
            sign_flip_p(d), smallest_p(k, exact))


# -- a continuous value per prompt, over draws ------------------------------------------------


def mean_interval_over_draws(values: np.ndarray, draws: np.ndarray, seed: int = SEED,
                             resamples: int = BOOTSTRAPS) -> tuple[float, float]:
    """95% percentile interval of a cell's mean of a continuous per-prompt value (an answer's
    log-probability) by the cluster bootstrap the paired tests use (Field & Welsh 2007): draws
    resampled with replacement, each standing for the mean of its prompts, seeded; the draw is the
    unit, as accuracy's Wilson interval counts it. (nan, nan) with fewer than two draws: one draw
    says nothing of the spread."""
    frame = pd.DataFrame({"value": np.asarray(values, dtype=float), "draw": draws}).dropna(subset=["value"])
    per_draw = frame.groupby("draw", sort=True)["value"].mean().to_numpy()
    if len(per_draw) < 2:
        return (math.nan, math.nan)
    return bootstrap_interval(per_draw, seed, resamples)


# -- models that saw other prompts: unpaired ---------------------------------------------------


def unpaired_tests(rows: pd.DataFrame, models: list[str], baseline: str) -> list[PairedResult]:
    """Each of ``models`` against the baseline, at each length both ran, where no prompt of one is a
    prompt of the other (another tokenizer built other prompts from the same seeds): the draws of the
    two are independent samples, so the test is unpaired (``draw_permutation_test``), Holm-adjusted
    across lengths as the paired ones are. ``rows`` carry ``_label`` and ``_draw``."""
    results: list[PairedResult] = []
    for model in models:
        own = []
        for length, group in rows.groupby("length", sort=True):
            m, b = group[group["_label"] == model], group[group["_label"] == baseline]
            if m.empty or b.empty:
                continue
            own.append(PairedResult(model, baseline, int(length), *draw_permutation_test(
                m["score"].to_numpy(), m["_draw"].to_numpy(), b["score"].to_numpy(), b["_draw"].to_numpy())))
        adjusted = holm([r.p for r in own])
        results += [PairedResult(**{**asdict(r), "p_holm": p}) for r, p in zip(own, adjusted)]
    return results


def draw_permutation_test(m: np.ndarray, m_draws: np.ndarray, b: np.ndarray, b_draws: np.ndarray,
                          seed: int = SEED, resamples: int = PERMUTATIONS) -> tuple:
    """Two independent samples of draws, each draw the mean of its prompts' scores: the difference of
    their means (model - baseline); two-sided p of the two-sample permutation test (the draws' labels
    shuffled, ``resamples`` seeded shuffles, p = (1 + hits) / (resamples + 1)); the 95% percentile
    interval of the difference by resampling each sample's draws on its own (seeded). Returns
    (n, n_draws, test, difference, lo, hi, p, p_min) as ``draw_sign_flip_test`` does: n the prompts
    and n_draws the draws of both."""
    per_m = pd.Series(np.asarray(m, dtype=float)).groupby(np.asarray(m_draws)).mean().to_numpy()
    per_b = pd.Series(np.asarray(b, dtype=float)).groupby(np.asarray(b_draws)).mean().to_numpy()
    observed = per_m.mean() - per_b.mean()
    pooled, k = np.concatenate([per_m, per_b]), len(per_m)
    rng = np.random.default_rng(seed)
    shuffled = np.array([rng.permutation(pooled) for _ in range(resamples)])
    differences = shuffled[:, :k].mean(axis=1) - shuffled[:, k:].mean(axis=1)
    p = float((1 + np.sum(np.abs(differences) >= abs(observed) - 1e-12)) / (resamples + 1))
    boot = np.random.default_rng(seed + 1)
    means_m = per_m[boot.integers(0, len(per_m), size=(BOOTSTRAPS, len(per_m)))].mean(axis=1)
    means_b = per_b[boot.integers(0, len(per_b), size=(BOOTSTRAPS, len(per_b)))].mean(axis=1)
    spread = means_m - means_b
    return (len(m) + len(b), len(per_m) + len(per_b), UNPAIRED, float(observed), float(np.quantile(spread, 0.025)),
            float(np.quantile(spread, 0.975)), p, 1 / (resamples + 1))
