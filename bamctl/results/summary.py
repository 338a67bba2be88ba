"""Pure statistics over result rows: Wilson intervals, accuracy and perplexity tables, effective length.

Tables are wide: index = length (ascending), columns = MultiIndex (field, model), so
`table["score"]` is the length × model grid and `table["hi"]` its upper bounds. Every field
is repeated per model, including `train_length` (constant down a column), so a table
carries all that `effective_length` and the renderers need.

A cell counts its prompts (`n`) and its independent draws (`n_draws`: passkey keys, RULER
draws, perplexity documents; `bamctl.results.stats.draw_ids`). The prompts of one draw share
their random content, so they are not independent trials: the interval is a **Wilson score
interval at the draw level** (Wilson 1927, "Probable inference, the law of succession, and
statistical inference", JASA 22:209-212), the cluster-level analysis of Donner & Klar 2000
(*Design and Analysis of Cluster Randomization Trials in Health Research*, Arnold): each draw
contributes its mean score, k = Σ per-draw mean scores, n = number of draws. With one prompt
per draw it is the usual Wilson interval on the prompts. The cell's `score` stays the mean over
its prompts, which is the mean of the per-draw means whenever every draw has as many prompts
(as every plan gives: depths × one draw). The certified effective length uses the interval's
lower bound, and `min_certifiable_n` counts draws.

Two views beside accuracy: `answer_logprob_table`, the mean answer log-probability per cell with a
bootstrap interval over draws (`--metric answer_logprob`), and `relative_effective_length`, the
effective length against each model's own score at a base length (`--relative`, NoLiMa's rule).

A column is one model identity, (model_hash, backend) (`model_labels`): an hf and a vLLM run
of one checkpoint are two models. A summary records the `compute_version`s of its rows, so
rows computed by other code are never pooled without its caption saying so.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from bamctl.errors import BamctlError
from bamctl.results.stats import (
    Z_95, draw_ids, mean_interval_over_draws, one_copy_per_document, out_of_reach, paired_tests, scored_alike,
    unpaired_tests,
)

# Rows are pooled only within one (task, protocol, setting), one fingerprint and one dtype: rows
# made from other prompts (another tokenizer, corpus, task version) or computed in another
# precision are never averaged together. Device and attention path do not split a table.
GROUP_COLUMNS = ("task", "protocol", "setting", "fingerprint", "dtype")
NO_FINGERPRINT = "none"  # how rows written before fingerprints are labelled
ACCURACY_FIELDS = ("score", "k", "n", "n_draws", "lo", "hi", "train_length")
PERPLEXITY_FIELDS = ("ppl", "nll", "n_scored", "n", "n_draws", "train_length")
ANSWER_LOGPROB_FIELDS = ("answer_logprob", "n", "n_draws", "lo", "hi", "train_length")
# What the cells of a passkey or RULER table hold (`--metric`): the task's score (accuracy), or the
# mean of the rows' `answer_logprob`, which moves where a 0/1 score does not.
CELL_METRICS = ("score", "answer_logprob")
NO_BACKEND = ""  # rows that do not say which back-end computed them: one back-end
UNRECORDED = "unrecorded"  # how a null compute_version is named in captions


def wilson_interval(k: float, n: float, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval for k successes out of n (95% by default); (nan, nan) when n == 0.

    Unlike the normal approximation it stays inside [0, 1] and is sensible at k = 0 or k = n,
    which is where long-context accuracy lives. A fractional k is accepted: the sum of per-draw
    mean scores (`accuracy_table`), or of partial scores such as RULER's string_match_all, each
    draw's mean then standing for one trial's outcome, as a cluster-level analysis does.
    """
    if n <= 0:
        return (math.nan, math.nan)
    p = k / n
    z2 = z * z
    denominator = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denominator
    lo = 0.0 if k <= 0 else max(0.0, centre - half)  # exact at the edges, not 1e-17 off
    hi = 1.0 if k >= n else min(1.0, centre + half)
    return (lo, hi)


def backends(frame: pd.DataFrame) -> pd.Series:
    """The back-end of each row (native, authors, hf, vllm); NO_BACKEND where rows do not say."""
    if "backend" not in frame:
        return pd.Series(NO_BACKEND, index=frame.index, dtype=object)
    column = frame["backend"].astype(object)
    return column.where(column.notna(), NO_BACKEND)


def model_labels(frame: pd.DataFrame) -> pd.Series:
    """Column label per row, one per model identity (model_hash, backend): the model name;
    `name@hash8` when one name covers several hashes; `name[backend]` (`name@hash8[backend]`)
    when one name and hash ran on several back-ends, as an hf and a vLLM run of one checkpoint
    (`[?]` for rows that do not say)."""
    ids = pd.DataFrame({"model": frame["model"], "hash": frame["model_hash"], "backend": backends(frame)})
    hashes_per_name = ids.groupby("model")["hash"].nunique()
    backends_per_hash = ids.groupby(["model", "hash"])["backend"].nunique()

    def label(model: str, model_hash: str, backend: str) -> str:
        text = f"{model}@{model_hash[:8]}" if hashes_per_name[model] > 1 else model
        return f"{text}[{backend or '?'}]" if backends_per_hash[(model, model_hash)] > 1 else text

    return pd.Series([label(*row) for row in ids.itertuples(index=False)], index=frame.index, dtype=object)


def is_perplexity(frame: pd.DataFrame) -> bool:
    """Rows are perplexity rows when every one carries `nll` and `n_scored`."""
    return len(frame) > 0 and bool(frame["nll"].notna().all() and frame["n_scored"].notna().all())


def accuracy_table(frame: pd.DataFrame, models: Sequence[str] | None = None) -> pd.DataFrame:
    """Mean score per (length, model) over its prompts, with k = sum of scores, n = prompts,
    n_draws = distinct draws and the draw-level Wilson 95% interval (module docstring).

    Rows must come from one (task, protocol, setting); `summarize` splits mixed rows.
    `models` orders the columns (labels as in `model_labels`); by default, sorted by name.
    """
    _require_one_group(frame)
    rows = frame.assign(_label=model_labels(frame), _score=frame["score"].astype(float), _draw=draw_ids(frame))
    cells = rows.groupby(["length", "_label"]).agg(score=("_score", "mean"), k=("_score", "sum"), n=("_score", "size"))
    per_draw = rows.groupby(["length", "_label", "_draw"])["_score"].mean().groupby(["length", "_label"])
    cells["n_draws"] = per_draw.size()
    bounds = [wilson_interval(k, n) for k, n in zip(per_draw.sum().reindex(cells.index), cells["n_draws"])]
    cells["lo"] = [lo for lo, _ in bounds]
    cells["hi"] = [hi for _, hi in bounds]
    return _widen(cells, rows, ACCURACY_FIELDS, models)


def perplexity_table(frame: pd.DataFrame, models: Sequence[str] | None = None) -> pd.DataFrame:
    """Perplexity per (length, model): exp(sum(nll) / sum(n_scored)), weighting every token equally.

    `nll` holds each sample's SUM of token NLLs, so long and short samples count by their
    tokens, not once each; a mean of per-sample perplexities would over-weight short ones.
    A document two seeds picked counts once (`one_copy_per_document`); n = its rows (windows
    or buckets) kept, n_draws = distinct documents.
    """
    _require_one_group(frame)
    rows = one_copy_per_document(frame.assign(_label=model_labels(frame), _draw=draw_ids(frame)))
    rows = rows.assign(_nll=rows["nll"].astype(float), _scored=rows["n_scored"].astype(float))
    cells = rows.groupby(["length", "_label"]).agg(
        nll=("_nll", "sum"), n_scored=("_scored", "sum"), n=("_nll", "size"), n_draws=("_draw", "nunique"))
    with np.errstate(divide="ignore", invalid="ignore"):
        cells["ppl"] = np.exp(cells["nll"] / cells["n_scored"])
    return _widen(cells, rows, PERPLEXITY_FIELDS, models)


def answer_logprob_table(frame: pd.DataFrame, models: Sequence[str] | None = None) -> pd.DataFrame:
    """Mean ``answer_logprob`` per (length, model) over the prompts that have one (nats: the log-
    probability of the answer's scored tokens, summed), n = those prompts, n_draws = their distinct
    draws, and the 95% interval of the mean by a cluster bootstrap over the draws
    (``stats.mean_interval_over_draws``; NaN with one draw). Rows without one (generate rows asked
    without it, rows before schema 9: a null ``answer_logprob``) are left out; some row must hold one
    (``summarize`` says why when none does)."""
    _require_one_group(frame)
    rows = frame.assign(_label=model_labels(frame), _draw=draw_ids(frame))
    rows = rows[rows["answer_logprob"].notna()]
    rows = rows.assign(_logprob=rows["answer_logprob"].astype(float))
    grouped = rows.groupby(["length", "_label"])
    cells = grouped.agg(answer_logprob=("_logprob", "mean"), n=("_logprob", "size"), n_draws=("_draw", "nunique"))
    bounds = {key: mean_interval_over_draws(g["_logprob"].to_numpy(), g["_draw"].to_numpy()) for key, g in grouped}
    cells["lo"] = [bounds[key][0] for key in cells.index]
    cells["hi"] = [bounds[key][1] for key in cells.index]
    return _widen(cells, rows, ANSWER_LOGPROB_FIELDS, models)


def min_certifiable_n(threshold: float, z: float = Z_95) -> int | None:
    """The fewest draws per cell whose draw-level Wilson lower bound can reach ``threshold`` (every
    prompt of every draw correct: n/n has the bound n / (n + z²)); None when no n can (a threshold of 1)."""
    if threshold >= 1:
        return None
    n = max(1, math.ceil(threshold * z * z / (1 - threshold)))  # the closed form, which floats may put one off
    while n > 1 and wilson_interval(n - 1, n - 1, z)[0] >= threshold:  # a threshold that is exactly a bound
        n -= 1
    while wilson_interval(n, n, z)[0] < threshold:
        n += 1
    return n


def _passing_prefix(values: pd.Series, threshold: float):
    """The longest length up to which every tested length reaches ``threshold``; None when the shortest fails."""
    values = values.dropna().sort_index()
    failing = values.index[(values < threshold).to_numpy()]
    passing = values.index[values.index < failing.min()] if len(failing) else values.index
    return passing.max() if len(passing) else None


def effective_length(table: pd.DataFrame, threshold: float = 0.9) -> pd.DataFrame:
    """Per model: the effective length, the longest length up to which every tested length has a mean
    score at or above ``threshold`` (a dip stops it: a recovery beyond does not count), and that
    length ÷ train_length; and the *certified* effective length, the same with the draw-level Wilson
    95% lower bound in place of the mean (what the independent draws support, not just the mean).

    Returns index = model, columns `length` (nullable Int64; <NA> when the shortest length fails),
    `train_length`, `ratio` (NaN when none passes), `certified`, `certified_ratio` and `needs_draws`:
    the draws per cell certification would need, where the shortest length's cell has too few for
    any score to certify it (<NA> otherwise). Tables without `n_draws` count `n`.
    """
    scores = table["score"]
    train = table["train_length"]
    counts = next((table[f] for f in ("n_draws", "n") if f in table), None)
    needed = min_certifiable_n(threshold)
    out = []
    for model in scores.columns:
        best = _passing_prefix(scores[model], threshold)
        certified = _passing_prefix(table["lo"][model], threshold) if "lo" in table else None
        train_length = train[model].dropna().max()
        shortest_n = counts[model].dropna().sort_index().iloc[0] if counts is not None and counts[model].notna().any() else None
        too_few = certified is None and shortest_n is not None and (needed is None or shortest_n < needed)
        out.append(
            {
                "model": model,
                "length": best,
                "train_length": train_length,
                "ratio": best / train_length if best is not None and train_length else math.nan,
                "certified": certified,
                "certified_ratio": certified / train_length if certified is not None and train_length else math.nan,
                "needs_draws": needed if too_few else None,
            }
        )
    columns = ["model", "length", "train_length", "ratio", "certified", "certified_ratio", "needs_draws"]
    result = pd.DataFrame(out, columns=columns).set_index("model")
    for column in ("length", "certified", "train_length", "needs_draws"):
        result[column] = result[column].astype("Int64")
    for column in ("ratio", "certified_ratio"):
        result[column] = result[column].astype(float)
    return result


def _from(values: pd.Series, length: int) -> pd.Series:
    """The values at ``length`` and longer: a relative effective length starts at its base."""
    return values[values.index >= length]


def relative_effective_length(table: pd.DataFrame, relative: float, base_length: int | None = None) -> pd.DataFrame:
    """Per model: the effective length against the model's own short-context score (NoLiMa's, Modarressi
    et al. 2025), fairer to a weak small model than a fixed threshold. The base is the model's mean
    score at ``base_length`` (default: the shortest length it was tested at); the relative effective
    length is the longest length from the base up to which every tested length has a mean score at
    or above ``relative`` × that base score (a dip stops it, as for ``effective_length``). Its
    *certified* form asks every tested length's draw-level Wilson 95% lower bound to reach
    ``relative`` × the base's Wilson upper bound: what the draws support whatever the base's true
    score within its interval, the base cell included (n of n keys certify it from
    ``min_certifiable_n(relative)`` keys on).

    Returns index = model, columns `length`, `ratio` (÷ train_length), `certified`,
    `certified_ratio`, `needs_draws` (as ``effective_length``'s, the base cell's count), `base_length`
    and `base_score`. A model without a cell at the base, or whose base score is 0 (nothing to be a
    share of), has no relative effective length.
    """
    check_relative(relative, base_length)
    scores, train = table["score"], table["train_length"]
    counts = next((table[f] for f in ("n_draws", "n") if f in table), None)
    tested = [int(n) for n in table.index]
    if base_length is not None and base_length not in tested:
        raise BamctlError(f"--base-length {base_length} is not a tested length; the table's lengths are "
                          f"{', '.join(map(str, tested))}")
    needed = min_certifiable_n(relative)
    out = []
    for model in scores.columns:
        present = scores[model].dropna()
        base = base_length if base_length is not None else (int(present.index.min()) if len(present) else None)
        base_score = float(present.get(base, math.nan)) if base is not None else math.nan
        best = certified = shortest_n = None
        if not math.isnan(base_score) and base_score > 0:
            best = _passing_prefix(_from(scores[model], base), relative * base_score)
            if "lo" in table:
                certified = _passing_prefix(_from(table["lo"][model], base), relative * float(table["hi"][model].get(base)))
            if counts is not None and not pd.isna(counts[model].get(base)):
                shortest_n = counts[model].get(base)
        train_length = train[model].dropna().max()
        too_few = certified is None and shortest_n is not None and (needed is None or shortest_n < needed)
        out.append({
            "model": model,
            "length": best,
            "ratio": best / train_length if best is not None and train_length else math.nan,
            "certified": certified,
            "certified_ratio": certified / train_length if certified is not None and train_length else math.nan,
            "needs_draws": needed if too_few else None,
            "base_length": base,
            "base_score": base_score,
        })
    columns = ["model", "length", "ratio", "certified", "certified_ratio", "needs_draws", "base_length", "base_score"]
    result = pd.DataFrame(out, columns=columns).set_index("model")
    for column in ("length", "certified", "needs_draws", "base_length"):
        result[column] = result[column].astype("Int64")
    for column in ("ratio", "certified_ratio", "base_score"):
        result[column] = result[column].astype(float)
    return result


def best_models(table: pd.DataFrame, metric: Literal["accuracy", "perplexity", "answer_logprob"]) -> dict[int, set[str]]:
    """Per length, the model(s) with the best value (highest score or answer log-probability, lowest
    perplexity); ties share it.

    Lengths where fewer than two models have a value, or all of them tie, get no winner.
    """
    values = table[{"accuracy": "score", "perplexity": "ppl"}.get(metric, metric)]
    winners: dict[int, set[str]] = {}
    for length, row in values.iterrows():
        row = row.dropna()
        if len(row) < 2:
            continue
        best = row.min() if metric == "perplexity" else row.max()
        tied = {str(m) for m in row.index[np.isclose(row.to_numpy(dtype=float), best)]}
        if len(tied) < len(row):  # when every model ties, nothing stands out
            winners[int(length)] = tied
    return winners


@dataclass(frozen=True)
class Summary:
    """The summary of one (task, protocol, setting, fingerprint): a wide table and, for accuracy,
    effective lengths (``metric`` "answer_logprob": its cells hold the mean answer log-probability).
    ``distinct`` marks a summary that shares its (task, protocol, setting) with another of other
    prompts, so its title names its fingerprint."""

    task: str
    protocol: str
    setting: str
    metric: Literal["accuracy", "perplexity", "answer_logprob"]
    table: pd.DataFrame
    effective: pd.DataFrame | None
    threshold: float
    fingerprint: str = NO_FINGERPRINT
    distinct: bool = False
    baseline: str | None = None  # the model every other is tested against (bamctl.results.stats)
    paired: tuple = ()  # PairedResult per (model, length), when there is a baseline
    dtype: str = ""  # the precision every row of the table ran in
    dtype_distinct: bool = False  # another summary of this (task, protocol, setting) ran in another dtype
    scored_alike: bool = True  # perplexity: every model scored the same tokens (one vocabulary)
    compute_versions: tuple = ()  # distinct compute_version of the rows, sorted; None: rows that do not say
    reused_versions: tuple | None = None  # of those, the ones the current run did not compute with (None: not asked)
    other_dtypes: tuple = ()  # (dtype, models) of this (task, protocol, setting) in other dtypes: in tables of their own
    relative: float | None = None  # --relative: the share of each model's own base score that counts (None: not asked)
    relative_effective: pd.DataFrame | None = None  # relative_effective_length's, for accuracy tables when asked
    other_prompts: tuple = ()  # models that saw other prompts than the table's (another tokenizer): tested unpaired
    unread: tuple = ()  # (model, rows) left out: a server read their prompts at another length (``served_token_gap``)

    @property
    def unit(self) -> str:
        """What a draw is called in this summary: keys (passkey), documents (perplexity), draws (RULER)."""
        return draw_unit(self.task, self.metric)

    @property
    def out_of_reach(self) -> list:
        """The comparisons whose cells are too few for any difference to be significant (stats.out_of_reach)."""
        return out_of_reach(self.paired)

    @property
    def title(self) -> str:
        parts = [self.task] + [p for p in (self.protocol, self.setting) if p]
        suffix = f" (prompts {self.fingerprint})" if self.distinct else ""
        return " / ".join(parts) + suffix + (f" [{self.dtype}]" if self.dtype_distinct else "")

    @property
    def models(self) -> list[str]:
        return list(self.table["n"].columns)

    @property
    def lengths(self) -> list[int]:
        return [int(x) for x in self.table.index]

    @property
    def best(self) -> dict[int, set[str]]:
        return best_models(self.table, self.metric)

    def mark(self, length: int, model: str) -> str:
        """▲ significantly better than the baseline at this length, ▼ worse, "" otherwise."""
        for result in self.paired:
            if result.model == model and result.length == length and result.significant:
                better = result.difference < 0 if self.metric == "perplexity" else result.difference > 0
                return "▲" if better else "▼"
        return ""


def draw_unit(task: str, metric: str) -> str:
    """One rule names the independent unit: "documents" for perplexity, "keys" for passkey (one key
    per seed and sample index, at every depth), "draws" for every other task (RULER's)."""
    if metric == "perplexity":
        return "documents"
    return "keys" if task == "passkey" else "draws"


def compute_versions(rows: pd.DataFrame) -> tuple:
    """The distinct `compute_version`s of the rows, sorted, None (rows that do not say) last."""
    if "compute_version" not in rows:
        return ()
    values = set(rows["compute_version"].astype(object).where(rows["compute_version"].notna(), None))
    return tuple(sorted(v for v in values if v is not None)) + ((None,) if None in values else ())


def summarize(
    frame: pd.DataFrame, threshold: float = 0.9, models: Sequence[str] | None = None, baseline: str | None = None,
    current_versions: Iterable[str] | None = None, metric: str = "score", relative: float | None = None,
    base_length: int | None = None,
) -> list[Summary]:
    """One Summary per (task, protocol, setting, fingerprint) in the rows, in sorted order; with a
    ``baseline`` (a model label), each other model is tested against it on the samples both ran.
    ``current_versions``: the compute versions this run computed with; a summary then names the
    versions of its rows that are not among them (rows reused from earlier runs). ``metric``
    (``CELL_METRICS``): what passkey and RULER cells hold, their score or the mean
    ``answer_logprob`` (then tested against the baseline per draw as scores are). ``relative``:
    accuracy tables also give each model's effective length relative to its own score at
    ``base_length`` (default: its shortest), ``relative_effective_length``."""
    check_metric(metric)
    check_relative(relative, base_length)
    current = None if current_versions is None else set(current_versions)
    summaries = []
    frame = with_fingerprint_labels(frame)
    frame, unread = without_unread(frame)
    groups = list(table_groups(frame))
    keys = [key for key, _, _ in groups]
    shared = pd.Series([key[:3] for key in {key[:4] for key in keys}]).value_counts()  # tables of other prompts per triple
    dtypes = pd.Series([key[:3] for key in {key[:3] + key[4:] for key in keys}]).value_counts()
    # (task, protocol, setting) -> dtype -> models, labelled over the whole triple: one checkpoint run by
    # hf: and by vllm: in two dtypes is then named with its back-end in each table's caption
    models_by_dtype: dict[tuple, dict[str, set[str]]] = {}
    for triple, rows in frame.groupby(list(GROUP_COLUMNS[:3]), sort=True):
        labels = model_labels(rows)
        models_by_dtype[triple] = {str(d): set(labels[rows["dtype"] == d]) for d in rows["dtype"].unique()}
    for (task, protocol, setting, fingerprint, dtype), rows, other_prompts in groups:
        if metric == "answer_logprob":
            _require_answer_logprobs(rows, task)
        if is_perplexity(rows):
            table, kind, effective = perplexity_table(rows, models), "perplexity", None
        elif metric == "answer_logprob":
            table, kind, effective = answer_logprob_table(rows, models), "answer_logprob", None
        else:
            table, kind = accuracy_table(rows, models), "accuracy"
            effective = effective_length(table, threshold)
        relative_effective = None
        if relative is not None and kind == "accuracy":
            relative_effective = relative_effective_length(table, relative, base_length)
        distinct = bool(shared[(task, protocol, setting)] > 1)
        labels = list(table["n"].columns)
        labelled = rows.assign(_label=model_labels(rows), _draw=draw_ids(rows))
        if kind == "perplexity":
            labelled = one_copy_per_document(labelled)
        if kind == "answer_logprob":  # the paired test of scores, on each prompt's answer log-probability
            labelled = labelled[labelled["answer_logprob"].notna()].assign(score=labelled["answer_logprob"])
        alike = kind != "perplexity" or scored_alike(labelled)
        paired = ()
        if baseline is not None and baseline in labels and len(labels) > 1 and alike:
            alike_labels = [label for label in labels if label not in other_prompts]
            paired = tuple(paired_tests(labelled, alike_labels, baseline, "perplexity" if kind == "perplexity" else "accuracy"))
            if kind != "perplexity":  # another vocabulary's NLLs are of other tokens: nothing to test
                paired += tuple(unpaired_tests(labelled, [label for label in labels if label in other_prompts], baseline))
        versions = compute_versions(rows)
        summaries.append(Summary(
            str(task), str(protocol), str(setting), kind, table, effective, threshold, str(fingerprint), distinct,
            baseline if paired else None, paired, str(dtype), bool(dtypes[(task, protocol, setting)] > 1), alike,
            compute_versions=versions,
            reused_versions=None if current is None else tuple(v for v in versions if v not in current),
            other_dtypes=tuple((other, tuple(sorted(names))) for other, names in sorted(models_by_dtype[(task, protocol, setting)].items())
                               if other != str(dtype)),
            relative=relative if relative_effective is not None else None, relative_effective=relative_effective,
            other_prompts=tuple(label for label in labels if label in other_prompts),
            unread=unread.get((task, protocol, setting, dtype), ()),
        ))
    return summaries


def without_unread(frame: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """The rows a server read at the plan's length, and per table (task, protocol, setting, dtype)
    the (model, rows) of those it read at another (``served_token_gap`` not 0): they are never
    scored, so no cell may count them."""
    if "served_token_gap" not in frame:
        return frame, {}
    gap = frame["served_token_gap"]
    unread = (gap.notna() & (gap != 0)).to_numpy(dtype=bool)
    if not unread.any():
        return frame, {}
    left_out = frame[unread]
    counts = left_out.groupby([*TABLE_COLUMNS, model_labels(left_out).rename("_label")], sort=True).size()
    by_table: dict = {}
    for (*table, label), rows in counts.items():
        by_table.setdefault(tuple(table), []).append((str(label), int(rows)))
    return frame[~unread], {table: tuple(models) for table, models in by_table.items()}


def table_groups(frame: pd.DataFrame):
    """(key, rows, models of other prompts) for each table: one per (task, protocol, setting, dtype).
    Models whose prompts differ (another tokenizer built other prompts from the same seeds and
    lengths) share the table, each named in ``other_prompts``, tested unpaired against the baseline;
    the key's fingerprint is the prompts of most rows. Only where one model's rows hold prompts of two
    fingerprints (rows from before and after a task changed) is the table split by fingerprint, so
    no cell ever pools rows of other prompts."""
    for (task, protocol, setting, dtype), rows in frame.groupby(list(TABLE_COLUMNS), sort=True):
        labels = model_labels(rows)
        per_model = rows["fingerprint"].groupby(labels).nunique()
        if (per_model > 1).any() or rows["fingerprint"].nunique() == 1:
            for fingerprint, part in rows.groupby("fingerprint", sort=True):
                yield (task, protocol, setting, fingerprint, dtype), part, frozenset()
            continue
        main = rows["fingerprint"].value_counts().index[0]
        other = frozenset(labels[rows["fingerprint"] != main])
        yield (task, protocol, setting, main, dtype), rows, other


def check_metric(metric: str) -> None:
    """A ``--metric`` the tables cannot show is one line naming those they can."""
    if metric not in CELL_METRICS:
        raise BamctlError(f"--metric {metric} is not offered; use one of {', '.join(CELL_METRICS)}")


def check_relative(relative: float | None, base_length: int | None) -> None:
    """``--relative`` is a share in (0, 1]; ``--base-length`` means nothing without it."""
    if base_length is not None and relative is None:
        raise BamctlError("--base-length goes with --relative (e.g. --relative 0.85 --base-length 1k)")
    if relative is not None and not 0 < relative <= 1:
        raise BamctlError(f"--relative must be in (0, 1], a share of the model's own score at the base length, not {relative:g}")


def _require_answer_logprobs(rows: pd.DataFrame, task: str) -> None:
    """``--metric answer_logprob`` over rows that hold none is one line saying why they hold none."""
    if is_perplexity(rows):
        raise BamctlError(f"--metric answer_logprob: {task} rows have no answer to score (perplexity); "
                          "it applies to passkey and RULER")
    if "answer_logprob" not in rows or rows["answer_logprob"].isna().all():
        raise BamctlError(f"--metric answer_logprob: no {task} row holds an answer log-probability (generated rows "
                          "hold one only when run with --answer-logprob; rows written before schema 9 hold none)")


def with_fingerprint_labels(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows from before fingerprints get the label ``none``, so grouping keeps them (apart)."""
    if "fingerprint" not in frame:
        return frame.assign(fingerprint=NO_FINGERPRINT)
    return frame.assign(fingerprint=frame["fingerprint"].astype(object).where(frame["fingerprint"].notna(), NO_FINGERPRINT))


TABLE_COLUMNS = ("task", "protocol", "setting", "dtype")  # one table's; its models may differ in prompts (table_groups)


def _require_one_group(frame: pd.DataFrame) -> None:
    """One table's rows: one (task, protocol, setting, dtype), and one fingerprint per model, so no
    cell pools rows of other prompts."""
    frame = with_fingerprint_labels(frame)
    groups = frame[list(TABLE_COLUMNS)].drop_duplicates()
    if len(groups) > 1:
        found = ", ".join("/".join(map(str, g)) for g in groups.itertuples(index=False))
        raise ValueError(f"rows mix several ({', '.join(TABLE_COLUMNS)}): {found}; split them with summarize()")
    if (frame["fingerprint"].groupby(model_labels(frame)).nunique() > 1).any():
        raise ValueError("a model's rows mix prompts of several fingerprints; split them with summarize()")


def _widen(cells: pd.DataFrame, rows: pd.DataFrame, fields: Sequence[str], models: Sequence[str] | None) -> pd.DataFrame:
    """Long (length, label) cells → index length, columns (field, model), models in the asked order."""
    train = rows.groupby("_label")["train_length"].max()
    cells = cells.join(train, on="_label")
    wide = cells.reset_index().pivot(index="length", columns="_label", values=list(fields))
    wide.columns = wide.columns.set_names(["field", "model"])
    wide.index = wide.index.astype("int64")
    present = list(wide["n"].columns)
    order = [m for m in (models or []) if m in present] + sorted(m for m in present if m not in (models or []))
    wide = wide.reindex(columns=pd.MultiIndex.from_product([list(fields), order], names=["field", "model"]))
    for model in order:  # a model property: filled in where that model has no cell at a length
        wide[("train_length", model)] = float(train[model])
    return wide.sort_index().astype(float)
