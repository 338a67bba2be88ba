"""Asking a back-end about samples: the three request kinds, what a request is, and its digest.

A sample's ``scoring`` picks one entry of ``ANSWERS``, which asks the back-end about a batch
of samples of that kind at once (one request each, answered in order: ``Backend``'s batch
methods), and the sample's metric (``bamctl.tasks.metrics``) scores each answer:

- ``teacher_forced``: argmax at the answer positions (passkey), and the answer's summed
  log-probability and first token's rank (``answer_scores``);
- ``generate``: greedy continuation scored by a string metric (RULER, Landmark passkey);
- ``nll``: per-token negative log-likelihood of the spans the sample says are scored
  (perplexity), one row per span.

No entry knows which task it serves. The code here and what it imports is part of every
row's compute version (``bamctl.code_version``): it turns a back-end's answer into the
row's number.
"""

from __future__ import annotations

import hashlib
import math
from array import array
from typing import Callable, Iterable, Sequence

import torch

from bamctl.backends.base import Backend, ContinuationScore, decode_known
from bamctl.tasks.metrics import score
from bamctl.tasks.sample import Sample

# Tokens a request kind feeds after the prompt, at most (a passkey key's digits, with room).
ANSWER_TOKENS = {"teacher_forced": 16, "nll": 0}
DIGEST_LENGTH = 16  # hex digits, as every fingerprint


def request_digest(sample: Sample, feeding: str, stop_ids: Iterable[int] = (), forced: Sequence[int] = ()) -> str:
    """The digest of what a sample asks of a model: the ids fed, what is scored (the answer fed
    after the prompt and its scored targets, or the scored spans), the generation settings (the
    budget and, for a generation, the ids that stop it), the request kind and metric, and what
    the back-end puts around it (``feeding``: BOS, chat template). Two samples with one digest
    ask exactly the same; any change to a prompt gives another, whatever made it (a generator,
    a depth grid, a corpus). ``forced``: the expected answer a generation's row also teacher-forces
    (``--answer-logprob``): a row without its log-probability is not reused for one asked with."""
    stops = sorted(stop_ids) if sample.scoring == "generate" else []
    sha = hashlib.sha256()
    for part in (feeding, sample.scoring, sample.metric, str(sample.max_new_tokens), ",".join(map(str, stops))):
        sha.update(part.encode() + b"\x1f")
    for ids in (sample.input_ids, sample.answer_ids, sample.target_ids):  # each prefixed by its length
        sha.update(len(ids).to_bytes(8, "little") + array("q", ids).tobytes())
    for span in sample.scored:
        sha.update(f"{span.start}:{span.stop}:{span.position}".encode() + b"\x1f")
    sha.update("\x1f".join(sample.answers).encode())
    if forced:  # absent otherwise: rows asked without it keep the digests they had
        sha.update(b"forced\x1f" + array("q", forced).tobytes())
    return sha.hexdigest()[:DIGEST_LENGTH]


def answer_length(sample: Sample) -> int:
    """Tokens fed (teacher forcing) or generated after the prompt."""
    return len(sample.answer_ids) if sample.scoring == "teacher_forced" else sample.max_new_tokens if sample.scoring == "generate" else 0


def _decode(backend: Backend, ids: list[int]) -> str:
    return decode_known(backend.tokenizer, ids)  # without -1 (outside a subset) or a padded vocabulary's rows


def answer_teacher_forced(backend: Backend, sample: Sample) -> list[dict]:
    """Feed the prompt and the answer; read the argmax where each scored answer token is predicted."""
    return _teacher_forced_rows(backend, sample, backend.score_continuation(sample.input_ids, sample.answer_ids))


def answer_teacher_forced_batch(backend: Backend, samples: list[Sample]) -> list[list[dict]]:
    results = backend.score_continuations([(sample.input_ids, sample.answer_ids) for sample in samples])
    return [_teacher_forced_rows(backend, sample, result) for sample, result in zip(samples, results, strict=True)]


def _teacher_forced_rows(backend: Backend, sample: Sample, result) -> list[dict]:
    first = len(sample.answer_ids) - len(sample.target_ids)  # the first scored answer token
    predicted = result.predicted_ids[first:]
    value = score(sample.metric, predicted, sample)
    return [{
        "expected": _decode(backend, sample.target_ids).strip(),
        "predicted": _decode(backend, predicted).strip(),
        "correct": value == 1.0,
        "score": value,
        **answer_scores(result, first),
    }]


def answer_scores(result: ContinuationScore, first: int) -> dict:
    """The continuous scores of a teacher-forced answer whose scored tokens start at ``first``: the
    summed log-probability of those tokens (``answer_logprob``, nats) and the rank of the first of
    them at its position (``answer_rank``, 1 = the argmax; None where the back-end gives no ranks).
    A 0/1 score says only whether every token was the argmax; these say how far the answer was."""
    scored = result.logprobs[first:]
    if not scored:
        return {"answer_logprob": None, "answer_rank": None}
    return {
        "answer_logprob": math.fsum(scored),
        "answer_rank": None if result.ranks is None else int(result.ranks[first]),
    }


def answer_generate(backend: Backend, sample: Sample) -> list[dict]:
    return _generated_rows(backend, sample, backend.generate(sample.input_ids, sample.max_new_tokens))


def answer_generate_batch(backend: Backend, samples: list[Sample]) -> list[list[dict]]:
    """One call per generation budget (a task's samples share its spec's: one call for the batch)."""
    by_budget: dict[int, list[int]] = {}
    for index, sample in enumerate(samples):
        by_budget.setdefault(sample.max_new_tokens, []).append(index)
    outputs: dict[int, list[int]] = {}
    for budget, indices in by_budget.items():
        outputs.update(zip(indices, backend.generate_many([samples[i].input_ids for i in indices], budget), strict=True))
    return [_generated_rows(backend, sample, outputs[i]) for i, sample in enumerate(samples)]


def _generated_rows(backend: Backend, sample: Sample, ids: list[int]) -> list[dict]:
    text = _decode(backend, ids)
    value = score(sample.metric, text, sample)
    return [{"expected": " | ".join(sample.answers), "predicted": text, "correct": value == 1.0, "score": value}]


def expected_answer_ids(backend: Backend, sample: Sample) -> list[int]:
    """The tokens a generation would be right with, to teacher-force after its prompt: the sample's
    answers in the order the task lists them, joined by ", ", after a space unless the prompt ends in
    one (RULER's answer prefixes end in a word, a colon or a space; the landmark passkey in a word).
    A task that accepts its answers in any order (string_match_all) then gets the log-probability of
    one order: a lower bound on the set's."""
    text = ", ".join(sample.answers)
    return list(backend.tokenizer.encode(text if sample.prompt[-1:].isspace() else " " + text))


def score_generated_answers(backend: Backend, samples: list[Sample], rows: list[list[dict]]) -> None:
    """One more pass over each generated sample's prompt with its expected answer teacher-forced
    (``expected_answer_ids``): each row gains ``answer_logprob`` and ``answer_rank`` (``answer_scores``)."""
    expected = [expected_answer_ids(backend, sample) for sample in samples]
    asked = [i for i, ids in enumerate(expected) if ids]  # a sample with no answer has nothing to force
    results = dict(zip(asked, backend.score_continuations([(samples[i].input_ids, expected[i]) for i in asked]), strict=True))
    for i, sample_rows in enumerate(rows):
        scores = answer_scores(results[i], 0) if i in results else {"answer_logprob": None, "answer_rank": None}
        for row in sample_rows:
            row.update(scores)


def answer_nll(backend: Backend, sample: Sample) -> list[dict]:
    """One pass from the first scored token on; a row per scored span. A token the model has no
    vocabulary row for comes back as NaN and is left out of the sum and of ``n_scored``."""
    first = min(span.start for span in sample.scored)
    return _nll_rows(sample, backend.token_nll(sample.input_ids, first))


def answer_nll_batch(backend: Backend, samples: list[Sample]) -> list[list[dict]]:
    requests = [(sample.input_ids, min(span.start for span in sample.scored)) for sample in samples]
    return [_nll_rows(sample, nll) for sample, nll in zip(samples, backend.token_nlls(requests), strict=True)]


def _nll_rows(sample: Sample, nll) -> list[dict]:
    """A row per scored span; ``nll[t - first]`` is the loss of token t, first the first scored token."""
    first = min(span.start for span in sample.scored)
    rows = []
    for span in sample.scored:
        values = nll[span.start - first : span.stop - first]
        known = ~torch.isnan(values)
        total, count = float(values[known].double().sum()), int(known.sum())
        rows.append({"position": span.position, "nll": total, "n_scored": count,
                     "score": score(sample.metric, (total, count), sample)})
    return rows


# Per request kind: a batch of samples of that kind -> each sample's rows, in order.
ANSWERS: dict[str, Callable[[Backend, list[Sample]], list[list[dict]]]] = {
    "teacher_forced": answer_teacher_forced_batch,
    "generate": answer_generate_batch,
    "nll": answer_nll_batch,
}
