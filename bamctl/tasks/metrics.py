"""Metrics by name: pure functions from a prediction and its sample to a score in [0, 1].

A task variant names its metric in ``bamctl/data/tasks/*.toml``; back-ends never choose one.
RULER's own corpus-level functions are here too, verbatim in behaviour
(``scripts/eval/synthetic/constants.py``): mean over samples, times 100, rounded
to 2 decimals. Our per-sample scores are the same quantities before the mean,
unrounded: RULER rounds only the aggregate, and so only what is displayed is.
"""

from __future__ import annotations

import math
import re
from typing import Callable, Sequence

from bamctl.errors import BamctlError, did_you_mean
from bamctl.tasks.passkey import passkey_digit_hits
from bamctl.tasks.sample import Sample


def found_all(prediction: str, references: Sequence[str]) -> float:
    """RULER's ``string_match_all`` for one sample: the fraction of references found (case-insensitive substring)."""
    return sum(1.0 if ref.lower() in prediction.lower() else 0.0 for ref in references) / len(references)


def found_any(prediction: str, references: Sequence[str]) -> float:
    """RULER's ``string_match_part`` for one sample: 1 if any reference is found (case-insensitive substring)."""
    return max(1.0 if ref.lower() in prediction.lower() else 0.0 for ref in references)


def string_match_all(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """RULER's corpus score: the mean of ``found_all`` x 100, rounded to 2 decimals."""
    return round(sum(map(found_all, predictions, references)) / len(predictions) * 100, 2)


def string_match_part(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """RULER's corpus score: the mean of ``found_any`` x 100, rounded to 2 decimals."""
    return round(sum(map(found_any, predictions, references)) / len(predictions) * 100, 2)


def _match_all(prediction: str, sample: Sample) -> float:
    """The fraction of the sample's answers found in the generation (case-insensitive), in [0, 1]: RULER's string_match_all for one sample."""
    return found_all(prediction, sample.answers)


def _match_part(prediction: str, sample: Sample) -> float:
    """1.0 when any of the sample's answers is found in the generation (case-insensitive), else 0.0: RULER's string_match_part for one sample."""
    return found_any(prediction, sample.answers)


def _passkey_exact(predicted_ids: Sequence[int], sample: Sample) -> float:
    """1.0 when, fed the answer after the prompt, the model's argmax at every key digit is that digit, else 0.0."""
    exact, _ = passkey_digit_hits(list(predicted_ids), sample)
    return float(exact)


def _passkey_digits(predicted_ids: Sequence[int], sample: Sample) -> float:
    """The fraction of key digits the model's argmax gets right, fed the answer after the prompt, in [0, 1]."""
    _, hits = passkey_digit_hits(list(predicted_ids), sample)
    return sum(hits) / len(hits) if hits else 0.0


def _answer_exact(predicted_ids: Sequence[int], sample: Sample) -> float:
    """1.0 when, fed the answer after the prompt, the model's argmax at every answer token is that token, else 0.0."""
    targets = list(sample.target_ids)
    return float(bool(targets) and list(predicted_ids) == targets)


_INTEGER = re.compile(r"\d+")


def first_integer(text: str) -> str | None:
    match = _INTEGER.search(text)
    return match.group(0) if match else None


def _first_integer_match(prediction: str, sample: Sample) -> float:
    """1.0 when the first integer in the generation is the key (Landmark Attention's check), else 0.0."""
    return float(first_integer(prediction) == sample.answers[0])


def _mean_nll(nll: tuple[float, int], sample: Sample) -> float:
    """The mean negative log-likelihood of the span's scored tokens, in nats (`nll / n_scored`; 0 is perfect, no upper bound): not an accuracy. A cell's perplexity is exp(sum of `nll` / sum of `n_scored`)."""
    total, count = nll
    return total / count if count else math.nan


METRICS: dict[str, Callable] = {
    "string_match_all": _match_all,
    "string_match_part": _match_part,
    "passkey_exact": _passkey_exact,
    "passkey_digits": _passkey_digits,
    "answer_exact": _answer_exact,
    "first_integer_match": _first_integer_match,
    "mean_nll": _mean_nll,
}


def score(metric: str, prediction, sample: Sample) -> float:
    """Score one prediction; the prediction's type is the one the sample's scoring produces.

    ``teacher_forced``: the argmax token ids at the answer positions; ``generate``:
    the generated text; ``nll``: (sum of the span's token NLLs, number of tokens).
    """
    try:
        function = METRICS[metric]
    except KeyError:
        raise BamctlError(f"unknown metric {metric!r}{did_you_mean(metric, METRICS)}") from None
    return function(prediction, sample)
