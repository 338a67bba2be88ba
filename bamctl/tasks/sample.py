"""The unit every task yields and every back-end answers: one prompt, its tokens, its answers."""

from __future__ import annotations

import hashlib
import random
from dataclasses import asdict, dataclass, field

# How a back-end turns a sample into a prediction; the engine answers exactly these.
SCORING_KINDS = ("teacher_forced", "generate", "nll")


@dataclass(frozen=True)
class Sample:
    """One prompt at one target length, with everything needed to score it.

    ``prompt == tokenizer.decode(input_ids)`` always holds: the ids are what the
    model is fed, the text is for people and for string metrics.
    """

    task: str  # "passkey", "niah_single_1", ..., "ppl"
    variant: str  # passkey protocol ("authors", "landmark"); RULER variant name; ppl corpus
    length: int  # requested target length in tokens
    n_tokens: int  # == len(input_ids)
    depth: float | None  # where the (first) needle sits, as a fraction of the haystack
    seed: int
    index: int
    prompt: str
    input_ids: list[int]
    answers: list[str]
    needle_positions: list[int]  # token index where each needle starts, ascending
    scoring: str  # one of SCORING_KINDS
    target_ids: list[int] = field(default_factory=list)  # teacher_forced: tokens whose argmax must match
    max_new_tokens: int = 0  # generate: the budget counted inside `length`
    metric: str = ""  # name in bamctl.tasks.metrics.METRICS
    meta: dict = field(default_factory=dict)  # key, answer_prefix, haystack size, repetitions, ...

    def to_json(self) -> dict:
        """A JSON-ready dict, fields in declaration order (JSONL rows are byte-stable)."""
        return asdict(self)


def sample_rng(seed: int, *identity: object) -> random.Random:
    """A generator seeded by ``seed`` and the sample's identity only.

    Hashing the identity (task, variant, length, index, ...) makes each sample's
    randomness independent of which other samples or lengths were requested, and
    of PYTHONHASHSEED.
    """
    text = "\x1f".join(str(part) for part in (seed, *identity))
    return random.Random(int.from_bytes(hashlib.sha256(text.encode()).digest()[:16], "big"))
