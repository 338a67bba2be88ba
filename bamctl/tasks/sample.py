"""The unit every task yields and every back-end answers: one prompt, its tokens, its answers.

A task's plan lists :class:`SampleSlot`\\ s (cheap: which sample, how it is scored); its
generator turns a slot into a :class:`Sample` (the prompt itself) with ``slot.sample(...)``,
the one place a ``Sample`` is put together.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import asdict, dataclass, field

# How a back-end turns a sample into a prediction; the engine answers exactly these.
SCORING_KINDS = ("teacher_forced", "generate", "nll")


@dataclass(frozen=True)
class ScoredSpan:
    """``nll`` samples: the tokens ``input_ids[start:stop]`` are scored, each given the ones
    before it, and give one result row labelled ``position``."""

    start: int
    stop: int
    position: int  # the row's label: a window's first scored token, or a bucket's start, in its document

    @property
    def n_scored(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Sample:
    """One prompt at one target length, with everything needed to score it.

    ``prompt == tokenizer.decode(input_ids)`` always holds: the ids are what the
    model is fed, the text is for people and for string metrics.
    """

    task: str  # "passkey", "niah_single_1", ..., "ppl"
    protocol: str  # how the task is posed: passkey "authors"/"landmark", RULER "ruler", ppl "sliding"/"buckets"
    length: int  # requested target length in tokens
    n_tokens: int  # == len(input_ids)
    depth: float | None  # the needle depth asked for (a fraction of the haystack); None: the task places it
    seed: int
    index: int
    prompt: str
    input_ids: list[int]
    answers: list[str]
    needle_positions: list[int]  # token index where each needle starts, ascending
    scoring: str  # one of SCORING_KINDS
    needle_depth: float | None = None  # where the (first) needle landed, as a fraction of the haystack
    answer_ids: list[int] = field(default_factory=list)  # teacher_forced: fed after the prompt
    target_ids: list[int] = field(default_factory=list)  # teacher_forced: the last tokens of answer_ids, scored
    max_new_tokens: int = 0  # generate: the budget counted inside `length`
    metric: str = ""  # name in bamctl.tasks.metrics.METRICS
    scored: list[ScoredSpan] = field(default_factory=list)  # nll: the spans scored, one row each
    # The independent draw the sample belongs to: samples of one cell sharing it share their random
    # content (a passkey's key and a RULER sample's needles at every depth; a perplexity document
    # picked by two seeds), so statistics count draws, not samples.
    draw: str = ""
    meta: dict = field(default_factory=dict)  # key, answer_prefix, haystack size, repetitions, ...

    def to_json(self) -> dict:
        """A JSON-ready dict, fields in declaration order (JSONL rows are byte-stable)."""
        return asdict(self)


@dataclass(frozen=True)
class SampleSlot:
    """One sample of a plan, before it is built: which one it is and how it is scored."""

    task: str
    protocol: str
    scoring: str
    metric: str
    max_new_tokens: int
    length: int
    depth: float | None
    seed: int
    index: int
    position: int | None = None  # which part of sample `index`, when one document gives several (sliding windows)
    rows: tuple[int | None, ...] = (None,)  # the `position` of each result row the sample gives
    depth_grid: tuple[int, int] | None = None  # (i, k) when `depth` is the i-th of k evenly spaced depths 0..1

    def sample(self, *, input_ids: list[int], prompt: str, **fields) -> Sample:
        """The built sample: this slot's identity and scoring, plus what the generator made."""
        return Sample(
            task=self.task,
            protocol=self.protocol,
            length=self.length,
            n_tokens=len(input_ids),
            depth=self.depth,
            seed=self.seed,
            index=self.index,
            prompt=prompt,
            input_ids=input_ids,
            scoring=self.scoring,
            max_new_tokens=self.max_new_tokens,
            metric=self.metric,
            **{"answers": [], "needle_positions": [], "draw": self.draw, **fields},
        )

    @property
    def draw(self) -> str:
        """The draw of a sample whose generator seeds its randomness by (seed, length, index), as
        every generator but perplexity's does: ``seed/index`` (one per cell, whatever the depth)."""
        return f"{self.seed}/{self.index}"


def sample_rng(seed: int, *identity: object) -> random.Random:
    """A generator seeded by ``seed`` and the sample's identity only.

    Hashing the identity (task, variant, length, index, ...) makes each sample's
    randomness independent of which other samples or lengths were requested, and
    of PYTHONHASHSEED.
    """
    text = "\x1f".join(str(part) for part in (seed, *identity))
    return random.Random(int.from_bytes(hashlib.sha256(text.encode()).digest()[:16], "big"))
