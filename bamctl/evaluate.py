"""Evaluation runs: samples from a task, answers from a back-end, result rows into a store.

Tasks and back-ends never see each other. A task plans ``SampleSlot``\\ s and builds each
``Sample``; the sample's ``scoring`` picks one of three request kinds, the back-end
answers it, and the sample's metric (``bamctl.tasks.metrics``) scores the answer:

- ``teacher_forced``: argmax at the answer positions (passkey);
- ``generate``: greedy continuation scored by a string metric (RULER, Landmark passkey);
- ``nll``: per-token negative log-likelihood of the spans the sample says are scored
  (perplexity), one row per span.

Rows are appended to the result store as each sample finishes, so an interrupted run
keeps everything finished and a rerun skips it (same resume key), before building it.
"""

from __future__ import annotations

import resource
import signal
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

import torch

from bamctl.backends import Backend
from bamctl.errors import BamctlError
from bamctl.fingerprints import digest
from bamctl.results.provenance import provenance
from bamctl.results.schema import row_key
from bamctl.results.store import ResultStore
from bamctl.tasks import Sample, SampleSlot, TaskPlan, plan_samples, score


@dataclass(frozen=True)
class TaskRequest:
    """What to evaluate: one protocol of a task over lengths, depths, samples and seeds."""

    task: str
    lengths: list[int]
    samples: int
    seeds: list[int]
    depths: list[float] | None = None
    protocol: str | None = None  # None: the task's default protocol
    options: dict = field(default_factory=dict)  # generator options: corpus_path, stride, bucket, doc_tokens

    def plan(self, tokenizer, *, check_tokenizer: bool = True, scored_tokens: str | None = None, bos_for=None) -> TaskPlan:
        return plan_samples(
            self.task, self.lengths, self.samples, self.seeds, tokenizer, self.depths, protocol=self.protocol,
            check_tokenizer=check_tokenizer, scored_tokens=scored_tokens, bos_for=bos_for, **self.options,
        )


@dataclass
class RunStats:
    written: int = 0
    skipped: int = 0
    rows: list[dict] = field(default_factory=list)


# -- answering one sample: the request kinds ----------------------------------------------


def _decode(backend: Backend, ids: list[int]) -> str:
    return backend.tokenizer.decode([i for i in ids if i >= 0])  # -1: a token outside the model's vocabulary


def answer_teacher_forced(backend: Backend, sample: Sample) -> list[dict]:
    """Feed the prompt and the answer; read the argmax where each scored answer token is predicted."""
    result = backend.score_continuation(sample.input_ids, sample.answer_ids)
    predicted = result.predicted_ids[len(sample.answer_ids) - len(sample.target_ids):]
    value = score(sample.metric, predicted, sample)
    return [{
        "expected": _decode(backend, sample.target_ids).strip(),
        "predicted": _decode(backend, predicted).strip(),
        "correct": value == 1.0,
        "score": value,
    }]


def answer_generate(backend: Backend, sample: Sample) -> list[dict]:
    text = _decode(backend, backend.generate(sample.input_ids, sample.max_new_tokens))
    value = score(sample.metric, text, sample)
    return [{"expected": " | ".join(sample.answers), "predicted": text, "correct": value == 1.0, "score": value}]


def answer_nll(backend: Backend, sample: Sample) -> list[dict]:
    """One pass from the first scored token on; a row per scored span. A token the model has no
    vocabulary row for comes back as NaN and is left out of the sum and of ``n_scored``."""
    first = min(span.start for span in sample.scored)
    nll = backend.token_nll(sample.input_ids, first)  # nll[t - first] is the loss of token t
    rows = []
    for span in sample.scored:
        values = nll[span.start - first : span.stop - first]
        known = ~torch.isnan(values)
        total, count = float(values[known].double().sum()), int(known.sum())
        rows.append({"position": span.position, "nll": total, "n_scored": count,
                     "score": score(sample.metric, (total, count), sample)})
    return rows


# Tokens a request kind feeds after the prompt, at most (a passkey key's digits, with room).
ANSWER_TOKENS = {"teacher_forced": 16, "nll": 0}

ANSWERS: dict[str, Callable[[Backend, Sample], list[dict]]] = {
    "teacher_forced": answer_teacher_forced,
    "generate": answer_generate,
    "nll": answer_nll,
}


@contextmanager
def _interrupts_deferred():
    """Ctrl-C waits until the block ends (the run's merge must see every part it wrote), then is raised."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = signal.signal(signal.SIGINT, lambda *_: received.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        raise KeyboardInterrupt


def _peak_memory_bytes(device: str) -> int:
    if device.startswith("cuda"):
        return int(torch.cuda.max_memory_allocated())
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


class Evaluation:
    """One back-end over one task request, writing rows into a store."""

    def __init__(self, backend: Backend, request: TaskRequest, store: ResultStore, *, model_name: str, run_id: str | None = None):
        self.backend, self.request, self.store = backend, request, store
        self.plan = request.plan(backend.tokenizer, scored_tokens=backend.scored_tokens, bos_for=backend.bos_for)
        info = backend.info
        self.common = {
            "run_id": run_id or new_run_id(),
            "model": model_name,
            "model_hash": info.model_hash,
            "pe": info.pe,
            "ssmax": info.ssmax,
            "train_length": info.train_length,
            "rope_scaling": info.rope_scaling,
            "device": backend.device,
            "dtype": backend.dtype,
            "attention": backend.attention,
            "setting": self.plan.setting,
            "fingerprint": digest([self.plan.fingerprint, backend.feeding]),
            **provenance(),
        }

    def keys(self) -> set:
        """The resume keys of every row the request asks of this model (all shards)."""
        return {row_key(self._identity(slot, position)) for slot in self.plan.slots for position in slot.rows}

    def count(self, shard: tuple[int, int] = (0, 1)) -> int:
        """Rows this shard of the request produces (before skipping): the progress bar's total."""
        return sum(len(slot.rows) for slot in self._mine(shard))

    def _mine(self, shard: tuple[int, int]) -> list[SampleSlot]:
        """The slots of shard ``(i, n)``: slots i, i + n, i + 2n, …"""
        index, count = shard
        return self.plan.slots[index::count]

    def run(
        self, *, force: bool = False, on_row: Callable[[dict], None] | None = None, shard: tuple[int, int] = (0, 1),
        checked: bool = False,
    ) -> RunStats:
        """Evaluate every sample of this shard not yet in the store (``checked``: ``preflight`` already ran)."""
        if not checked:
            self.preflight()
        done = set() if force else self.store.done_keys()
        stats = RunStats()
        parts = []  # one per row while running, so a kill loses at most the sample in flight
        try:
            for slot in self._mine(shard):
                rows = [self._identity(slot, position) for position in slot.rows]
                todo = [row for row in rows if row_key(row) not in done]
                stats.skipped += len(rows) - len(todo)
                if not todo:
                    continue
                for row in self._answer(self.plan.build(slot), todo):
                    with _interrupts_deferred():  # a Ctrl-C here would leave a written part unrecorded
                        parts.append(self.store.append([row]))
                    stats.written += 1
                    stats.rows.append(row)
                    if on_row:
                        on_row(row)
        finally:  # also on Ctrl-C: one file per run keeps later reads fast
            self.store.merge(parts)
        return stats

    def preflight(self) -> None:
        """Let the back-end refuse the longest request now, before any sample, rather than after hours of work."""
        spec = self.plan.spec
        longest = max(slot.length for slot in self.plan.slots)
        # A generation budget lies inside the length (RULER); teacher-forced answers are fed after it.
        answer = spec.max_new_tokens if spec.scoring == "generate" else ANSWER_TOKENS.get(spec.scoring, 0)
        prompt = longest - answer if spec.scoring == "generate" else longest
        self.backend.check_fits(prompt, answer)

    def _identity(self, slot: SampleSlot, position: int | None) -> dict:
        return {
            **self.common,
            "task": slot.task,
            "protocol": slot.protocol,
            "scoring": slot.scoring,
            "seed": slot.seed,
            "sample": slot.index,
            "length": slot.length,
            "depth": slot.depth,
            "position": position,
        }

    def _answer(self, sample: Sample, todo: list[dict]) -> list[dict]:
        """The rows of ``todo`` (by position) with the sample's answers, timed."""
        if self.backend.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        results = {result.get("position"): result for result in ANSWERS[sample.scoring](self.backend, sample)}
        seconds = (time.perf_counter() - start) / len(results)
        finished = datetime.now(timezone.utc)
        return [
            {
                **row,
                **results[row["position"]],
                "n_tokens": sample.n_tokens,
                "needle_depth": sample.needle_depth,
                "bos": self.backend.bos_for(sample.scoring),
                "seconds": seconds,
                "tokens_per_s": sample.n_tokens / (seconds * len(results)) if seconds > 0 else 0.0,
                "peak_mem_bytes": _peak_memory_bytes(self.backend.device),
                "created_at": finished,
            }
            for row in todo
        ]


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ-") + uuid.uuid4().hex[:8]


def default_lengths(train_lengths: list[int], max_ratio: int = 64) -> list[int]:
    """1x to ``max_ratio`` x the training length, doubling (the shortest training length sets 1x)."""
    if not train_lengths:
        raise BamctlError("no model to take a training length from; pass --lengths")
    base, top = min(train_lengths), max(train_lengths) * max_ratio
    lengths = []
    n = base
    while n <= top:
        lengths.append(n)
        n *= 2
    return lengths
