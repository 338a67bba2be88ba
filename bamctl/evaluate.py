"""Evaluation runs: samples from a task, answers from a back-end, one result row per sample.

Tasks and back-ends never see each other. A task yields ``Sample``s; each sample's
``scoring`` picks one of three request kinds, and the back-end answers it:

- ``teacher_forced``: argmax at the answer positions (passkey, the authors' protocol);
- ``generate``: greedy continuation scored by a string metric (RULER, Landmark passkey);
- ``nll``: per-token negative log-likelihood over planned spans (perplexity).

Rows are appended to the result store as each sample finishes, so an interrupted run
keeps everything finished and a rerun skips it (same resume key).
"""

from __future__ import annotations

import resource
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Iterator

import torch

from bamctl.backends import Backend
from bamctl.errors import BamctlError
from bamctl.lengths import parse_depths
from bamctl.results.provenance import provenance
from bamctl.results.schema import row_key
from bamctl.results.store import ResultStore
from bamctl.tasks import Sample, generate_samples, get_task, position_buckets, score, sliding_windows


@dataclass(frozen=True)
class TaskRequest:
    """What to evaluate: one task variant over lengths, depths, samples and seeds."""

    task: str
    lengths: list[int]
    samples: int
    seeds: list[int]
    depths: list[float] | None = None
    variant: str | None = None
    options: dict = field(default_factory=dict)  # generator options, e.g. corpus_path
    ppl_mode: str = "sliding"  # perplexity only: "sliding" or "buckets"
    stride: int | None = None  # sliding: tokens advanced per window (default: the window)
    bucket: int = 1024  # buckets: positions per bucket
    doc_tokens: int | None = None  # sliding: document length (default: the largest window)

    @property
    def spec(self):
        return get_task(self.task, self.variant)


@dataclass
class RunStats:
    written: int = 0
    skipped: int = 0
    rows: list[dict] = field(default_factory=list)


# -- answering one sample ----------------------------------------------------------------


def _decode(backend: Backend, ids: list[int]) -> str:
    return backend.tokenizer.decode([i for i in ids if i >= 0])  # -1: a token outside the model's vocabulary


def answer_teacher_forced(backend: Backend, sample: Sample) -> dict:
    result = backend.score_continuation(sample.input_ids, sample.target_ids)
    value = score(sample.metric, result.predicted_ids, sample)
    return {
        "expected": _decode(backend, sample.target_ids).strip(),
        "predicted": _decode(backend, result.predicted_ids).strip(),
        "correct": value == 1.0,
        "score": value,
    }


def answer_generate(backend: Backend, sample: Sample) -> dict:
    text = _decode(backend, backend.generate(sample.input_ids, sample.max_new_tokens))
    value = score(sample.metric, text, sample)
    return {"expected": " | ".join(sample.answers), "predicted": text, "correct": value == 1.0, "score": value}


ANSWERS: dict[str, Callable[[Backend, Sample], dict]] = {
    "teacher_forced": answer_teacher_forced,
    "generate": answer_generate,
}


# -- perplexity: spans of a document --------------------------------------------------------


@dataclass(frozen=True)
class Span:
    """Feed ``ids[begin:end]`` and sum the NLL of tokens ``[score_from, end)``."""

    begin: int
    end: int
    score_from: int


def sliding_spans(n_tokens: int, window: int, stride: int) -> list[Span]:
    return [Span(w.begin, w.end, w.score_from) for w in sliding_windows(n_tokens, window, stride)]


def _peak_memory_bytes(device: str) -> int:
    if device.startswith("cuda"):
        return int(torch.cuda.max_memory_allocated())
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


class Evaluation:
    """One back-end over one task request, writing rows into a store."""

    def __init__(self, backend: Backend, request: TaskRequest, store: ResultStore, *, model_name: str, run_id: str | None = None):
        self.backend, self.request, self.store = backend, request, store
        self._shard, self._unit = (0, 1), -1
        info = backend.info
        self.common = {
            "run_id": run_id or new_run_id(),
            "model": model_name,
            "model_hash": info.model_hash,
            "pe": info.pe,
            "ssmax": info.ssmax,
            "train_length": info.train_length,
            "device": backend.device,
            "dtype": backend.dtype,
            "attention": backend.attention,
            **provenance(),
        }

    def samples(self, seed: int) -> Iterator[Sample]:
        r = self.request
        lengths = r.lengths
        if r.spec.scoring == "nll" and r.ppl_mode == "sliding":
            lengths = [r.doc_tokens or max(r.lengths)]  # one document, tiled by every window
        return generate_samples(r.task, lengths, r.samples, seed, self.backend.tokenizer, r.depths, variant=r.variant, **r.options)

    def count(self) -> int:
        """Rows this request produces (before skipping): the progress bar's total."""
        r = self.request
        if r.spec.scoring != "nll":
            depths = r.depths if r.depths is not None else parse_depths(r.spec.default_depths or "1")
            return len(r.lengths) * len(depths) * r.samples * len(r.seeds)
        if r.ppl_mode == "sliding":
            n = r.doc_tokens or max(r.lengths)
            return sum(len(sliding_windows(n, L, r.stride or L)) for L in r.lengths) * r.samples * len(r.seeds)
        return sum(len(position_buckets(L, r.bucket)) for L in r.lengths) * r.samples * len(r.seeds)

    def run(
        self, *, force: bool = False, on_row: Callable[[dict], None] | None = None, shard: tuple[int, int] = (0, 1)
    ) -> RunStats:
        """Evaluate every sample not yet in the store; ``shard=(i, n)`` keeps samples i, i+n, i+2n, …"""
        self.preflight()
        done = set() if force else self.store.done_keys()
        stats = RunStats()
        self._shard, self._unit = shard, -1
        parts = []  # one per row while running, so a kill loses at most the row in flight
        try:
            for seed in self.request.seeds:
                for sample in self.samples(seed):
                    for row in self._rows(sample, done, stats):
                        parts.append(self.store.append([row]))
                        stats.written += 1
                        stats.rows.append(row)
                        if on_row:
                            on_row(row)
        finally:  # also on Ctrl-C: one file per run keeps later reads fast
            self.store.merge(parts)
        return stats

    def preflight(self) -> None:
        """Let the back-end refuse the longest context now rather than after hours of work."""
        spec = self.request.spec
        longest = max(self.request.lengths) + (spec.max_new_tokens or 0) + 16  # 16: teacher-forced answer tokens
        for hook in ("check_fits", "reserve"):  # native engine: memory estimate; vLLM: size the engine once
            method = getattr(self.backend, hook, None)
            if method is not None:
                method(longest)

    # -- rows --------------------------------------------------------------------------------
    def _mine(self) -> bool:
        """Whether the next unit of work (a sample, or a sliding window) belongs to this shard."""
        self._unit += 1
        index, count = self._shard
        return self._unit % count == index

    def _base(self, sample: Sample) -> dict:
        return {
            **self.common,
            "task": sample.task,
            "variant": sample.variant,
            "seed": sample.seed,
            "sample": sample.index,
            "depth": sample.depth,
        }

    def _rows(self, sample: Sample, done: set, stats: RunStats) -> Iterator[dict]:
        if sample.scoring == "nll" and self.request.ppl_mode == "sliding":
            yield from self._perplexity_rows(sample, done, stats)  # shards split its windows
            return
        if not self._mine():
            return
        if sample.scoring == "nll":
            yield from self._perplexity_rows(sample, done, stats)
            return
        row = {**self._base(sample), "protocol": sample.scoring, "length": sample.length, "n_tokens": sample.n_tokens}
        if row_key(row) in done:
            stats.skipped += 1
            return
        yield self._timed(row, lambda: ANSWERS[sample.scoring](self.backend, sample), sample.n_tokens)

    def _timed(self, row: dict, answer: Callable[[], dict], n_tokens: int) -> dict:
        if self.backend.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        result = answer()
        seconds = time.perf_counter() - start
        return {
            **row,
            **result,
            "seconds": seconds,
            "tokens_per_s": n_tokens / seconds if seconds > 0 else 0.0,
            "peak_mem_bytes": _peak_memory_bytes(self.backend.device),
            "created_at": datetime.now(timezone.utc),
        }

    def _perplexity_rows(self, document: Sample, done: set, stats: RunStats) -> Iterator[dict]:
        r = self.request
        ids = document.input_ids
        if r.ppl_mode == "sliding":
            for window in r.lengths:
                stride = r.stride or window
                protocol = "sliding" if r.stride is None else f"sliding:stride={r.stride}"
                for span in sliding_spans(len(ids), window, stride):
                    if not self._mine():
                        continue
                    row = {**self._base(document), "protocol": protocol, "length": window,
                           "n_tokens": span.end - span.begin, "position": span.score_from, "depth": None}
                    if row_key(row) in done:
                        stats.skipped += 1
                        continue
                    yield self._timed(row, lambda s=span: self._span_nll(ids, s), span.end - span.begin)
            return
        # buckets: one streamed pass per document, one row per bucket of absolute positions
        buckets = position_buckets(len(ids), r.bucket)
        protocol = f"buckets:{r.bucket}"
        pending = []
        for b in buckets:
            row = {**self._base(document), "protocol": protocol, "length": document.length,
                   "n_tokens": document.n_tokens, "position": b.start, "depth": None}
            if row_key(row) in done:
                stats.skipped += 1
            else:
                pending.append((b, row))
        if not pending:
            return
        start = time.perf_counter()
        nll = self.backend.token_nll(ids, 1)  # nll[t] is the loss predicting token t + 1
        seconds = (time.perf_counter() - start) / len(buckets)
        for b, row in pending:
            total = float(nll[b.start : b.end].double().sum())
            yield {**row, "nll": total, "n_scored": b.n_scored, "score": total / b.n_scored,
                   "seconds": seconds, "tokens_per_s": document.n_tokens / (seconds * len(buckets)),
                   "peak_mem_bytes": _peak_memory_bytes(self.backend.device), "created_at": datetime.now(timezone.utc)}

    def _span_nll(self, ids: list[int], span: Span) -> dict:
        window = ids[span.begin : span.end]
        nll = self.backend.token_nll(window, span.score_from - span.begin)
        total = float(nll.double().sum())
        return {"nll": total, "n_scored": int(nll.numel()), "score": total / max(int(nll.numel()), 1)}


def parse_shard(text: str | None) -> tuple[int, int]:
    """``"I/N"`` -> (I, N): this process takes every N-th sample starting at I (0-based)."""
    if text is None:
        return (0, 1)
    index, sep, count = text.partition("/")
    try:
        shard = (int(index), int(count))
    except ValueError:
        shard = None
    if not sep or shard is None or not 0 <= shard[0] < shard[1]:
        raise BamctlError(f"--shard takes I/N with 0 <= I < N, e.g. 0/4 (got {text!r})")
    return shard


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
