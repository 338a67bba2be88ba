"""Evaluation runs: samples from a task, answers from a back-end, result rows into a store.

Tasks and back-ends never see each other. A task plans ``SampleSlot``\\ s and builds each
``Sample``; the sample's ``scoring`` picks one of three request kinds (``bamctl.answers``),
the back-end answers it, and the sample's metric scores the answer.

Samples are asked in batches (``--batch-size``): samples of one request and one length,
as many as the back-end takes at once (``Backend.batch_limit``) or as asked. A batch's rows
are appended to the result store as one part file as soon as it finishes, so an
interrupted run keeps everything finished and loses at most the batch in flight. Batching
changes neither what a row is keyed on nor its numbers: a batch's answers are those of its
requests asked alone. A rerun reuses a stored row only for what was computed: the
same resume key (model, back-end, prompt fingerprint, dtype, slot), the same request
(``request_digest``: the very ids fed and scored) and the same compute version (the code
and libraries that computed it; ``reuse=True`` takes rows of other versions too). A slot
with no stored row is run without being built twice; one with a stored row is built and
its request compared.
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

from bamctl.answers import ANSWER_TOKENS, ANSWERS, answer_length, expected_answer_ids, request_digest, score_generated_answers
from bamctl.backends import Backend
from bamctl.backends.base import UNBOUNDED
from bamctl.code_version import compute_version
from bamctl.errors import BamctlError
from bamctl.fingerprints import digest
from bamctl.results.provenance import provenance
from bamctl.results.schema import row_key
from bamctl.results.store import ResultStore
from bamctl.tasks import Sample, SampleSlot, TaskPlan, plan_samples


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
    skipped: int = 0  # rows reused: stored for the same request and compute version
    reused_other_code: int = 0  # of those, rows of another compute version (``reuse=True``)
    other_code: int = 0  # rows stored by another compute version, computed again
    other_request: int = 0  # rows stored for another request under the same key (a prompt changed), computed again
    dropped_tokens: int = 0  # prompt tokens the back-end left out to fit its maximum length, over the rows written
    dropped_rows: int = 0
    bos_left_out: int = 0  # rows fed without the BOS the back-end puts before its other requests of that kind
    unread_rows: int = 0  # rows whose prompt a server read at another length than sent (not scored)
    unread_again: int = 0  # stored rows a server had read at another length, asked again
    rows: list[dict] = field(default_factory=list)


def run_compute_version(backend: Backend) -> str:
    """The compute version of a row: the back-end's (its code, bamctl's below it, its libraries)
    and the code that turns its answer into the row's number (``bamctl.answers``)."""
    return digest([backend.compute_version, compute_version(["bamctl.answers"])])


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
    if device.startswith("cuda") and torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


class Evaluation:
    """One back-end over one task request, writing rows into a store."""

    def __init__(self, backend: Backend, request: TaskRequest, store: ResultStore, *, model_name: str, run_id: str | None = None,
                 answer_logprob: bool = False):
        self.backend, self.request, self.store = backend, request, store
        # generated rows also teacher-force their expected answer (one more pass over the prompt)
        self.answer_logprob = answer_logprob
        self.plan = request.plan(backend.tokenizer, scored_tokens=backend.scored_tokens, bos_for=backend.bos_for)
        info = backend.info
        self.compute_version = run_compute_version(backend)
        self._batch_sizes: dict[int, int] = {}  # --batch-size auto, per length
        self.common = {
            "run_id": run_id or new_run_id(),
            "model": model_name,
            "model_hash": info.model_hash,
            "backend": backend.kind,
            "compute_version": self.compute_version,
            "pe": info.pe,
            "ssmax": info.ssmax,
            "train_length": info.train_length,
            "rope_scaling": info.rope_scaling,
            "model_revision": info.model_revision,
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

    def slots_of(self, shard: tuple[int, int] = (0, 1)) -> list[SampleSlot]:
        """The slots this shard visits, in the order it visits them (the progress display prices them)."""
        return self._mine(shard)

    def _mine(self, shard: tuple[int, int]) -> list[SampleSlot]:
        """The slots of shard ``(i, n)`` (slots i, i + n, i + 2n, … of the plan), in the plan's
        order: a length's slots together (``plan_samples`` orders them so), so batches are as
        large as ``batch_sizes`` announces."""
        index, count = shard
        return self.plan.slots[index::count]

    def run(
        self, *, force: bool = False, reuse: bool = False, on_row: Callable[[dict], None] | None = None,
        shard: tuple[int, int] = (0, 1), checked: bool = False, batch_size: int | None = None,
    ) -> RunStats:
        """Evaluate every sample of this shard not yet in the store (``checked``: ``preflight`` already ran).

        ``force`` recomputes everything; ``reuse`` also takes stored rows of another compute
        version (never of another request). ``batch_size``: samples asked at once (None: the
        back-end's own limit for each length, ``--batch-size auto``)."""
        if not checked:
            self.preflight(batch_size)
        stored = {} if force else self.store.done_requests()
        stats = RunStats()
        parts = []  # one per batch while running, so a kill loses at most the batch in flight
        try:
            for number, batch in enumerate(self._batches(self._pending(shard, stored, reuse, stats), batch_size)):
                if number == 0:
                    self.backend.prepare()  # outside the first batch's timing (vLLM starts its engine)
                rows = self._answer(batch)
                with _interrupts_deferred():  # a Ctrl-C here would leave a written part unrecorded
                    parts.append(self.store.append(rows))
                for row in rows:
                    stats.written += 1
                    stats.dropped_tokens += row["dropped_tokens"]
                    stats.dropped_rows += row["dropped_tokens"] > 0
                    stats.bos_left_out += not row["bos"] and self.backend.bos_for(row["scoring"])
                    stats.unread_rows += bool(row["served_token_gap"])
                    stats.rows.append(row)
                    if on_row:
                        on_row(row)
        finally:  # also on Ctrl-C: one file per run keeps later reads fast, each sample stored once
            merged = self.store.merge(parts)
            if merged is not None:
                self.store.supersede(merged)
        return stats

    def _pending(self, shard: tuple[int, int], stored: dict, reuse: bool, stats: RunStats):
        """(slot, rows to compute, its sample if it was built to tell) for each slot of the shard with work left."""
        for slot in self._mine(shard):
            rows = [self._identity(slot, position) for position in slot.rows]
            todo, sample = self._still_to_do(slot, rows, stored, reuse, stats)
            if todo:
                yield slot, todo, sample

    def _batches(self, pending, batch_size: int | None):
        """Runs of consecutive pending slots of one length (one cell), each of at most the batch size
        for that length, in the plan's order (a length's slots together). A slot's
        sample is built when its batch is due."""
        batch, cell = [], None
        for item in pending:
            slot = item[0]
            limit = batch_size or self.batch_size(slot.length)
            here = 0 if limit >= UNBOUNDED else slot.length  # unbounded: the whole request at once
            if batch and here != cell:
                yield [self._built(queued) for queued in batch]
                batch = []
            batch.append(item)
            cell = here
            if len(batch) >= limit:
                yield [self._built(queued) for queued in batch]
                batch = []
        if batch:
            yield [self._built(queued) for queued in batch]

    def _built(self, item) -> tuple[Sample, list[dict]]:
        slot, todo, sample = item
        return sample or self.plan.build(slot), todo

    def _sizes(self, length: int) -> tuple[int, int]:
        """(prompt, answer) tokens of a request of this length: a generation budget lies inside the
        length (RULER); teacher-forced answers are fed after it."""
        spec = self.plan.spec
        answer = spec.max_new_tokens if spec.scoring == "generate" else ANSWER_TOKENS.get(spec.scoring, 0)
        return (length - answer if spec.scoring == "generate" else length), answer

    def batch_size(self, length: int) -> int:
        """``--batch-size auto`` at this length: what the back-end takes at once (memory included)."""
        if length not in self._batch_sizes:
            self._batch_sizes[length] = max(1, self.backend.batch_limit(*self._sizes(length)))
        return self._batch_sizes[length]

    def whole_request(self, batch_size: int | None = None) -> bool:
        """Whether every sample of the request goes to the back-end at once (``UNBOUNDED``: vLLM)."""
        return batch_size is None and all(self.batch_size(length) >= UNBOUNDED for length in {s.length for s in self.plan.slots})

    def batch_sizes(self, batch_size: int | None = None) -> dict[int, int]:
        """The batch each length of this request runs in: at most its samples in this shard."""
        per_length: dict[int, int] = {}
        for slot in self.plan.slots:
            per_length[slot.length] = per_length.get(slot.length, 0) + 1
        return {length: min(count, batch_size or self.batch_size(length)) for length, count in sorted(per_length.items())}

    def _still_to_do(self, slot: SampleSlot, rows: list[dict], stored: dict, reuse: bool, stats: RunStats):
        """The rows of a slot that must be computed, and the slot's sample if building it was needed to tell."""
        found = [stored.get(row_key(row)) for row in rows]
        stats.unread_again += sum(s is not None and s.unread for s in found)
        found = [None if s is not None and s.unread else s for s in found]  # never scored: nothing to reuse
        current = [s is not None and s.compute_version == self.compute_version for s in found]
        stats.other_code += sum(s is not None and not ok and not reuse for s, ok in zip(found, current))
        candidates = [s if s is not None and (ok or reuse) else None for s, ok in zip(found, current)]
        if not any(candidates):
            return rows, None
        sample = self.plan.build(slot)
        asked = self._digest(sample)
        todo = []
        for row, candidate, ok in zip(rows, candidates, current):
            if candidate is not None and candidate.request_digest == asked:
                stats.skipped += 1
                stats.reused_other_code += not ok
            else:
                stats.other_request += candidate is not None
                todo.append(row)
        return todo, sample

    def preflight(self, batch_size: int | None = None) -> None:
        """Let the back-end refuse the longest request now, and the task a length too short for it with
        this model's tokenizer, before any sample, rather than after hours of work; and a
        ``batch_size`` it cannot hold at that length (``auto`` sizes to fit)."""
        self.plan.check_lengths()
        prompt, answer = self._sizes(max(slot.length for slot in self.plan.slots))
        self.backend.check_fits(prompt, answer)
        if batch_size is not None and batch_size > 1:
            self.backend.check_batch_fits(prompt, answer, batch_size)

    def _forces_answers(self, sample: Sample) -> bool:
        return self.answer_logprob and sample.scoring == "generate"

    def _digest(self, sample: Sample) -> str:
        """The sample's request digest, the answer it teacher-forces after a generation included."""
        forced = expected_answer_ids(self.backend, sample) if self._forces_answers(sample) else ()
        return request_digest(sample, self.backend.feeding, self.backend.stop_ids, forced)

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

    def _answer(self, batch: list[tuple[Sample, list[dict]]]) -> list[dict]:
        """The rows of each sample's ``todo`` (by position) with its answers; one batch of one kind, timed as one.

        A batch's wall time is shared among the rows it computed: ``seconds`` is the batch's time over
        its rows, ``tokens_per_s`` the batch's tokens over its time (docs/SCHEMA.md)."""
        if self.backend.device.startswith("cuda") and torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        samples = [sample for sample, _ in batch]
        self.backend.token_gaps()  # whatever an earlier call left (the model's probes)
        start = time.perf_counter()
        answered = ANSWERS[samples[0].scoring](self.backend, samples)
        if self._forces_answers(samples[0]):
            score_generated_answers(self.backend, samples, answered)
        elapsed = time.perf_counter() - start
        seconds = elapsed / sum(len(results) for results in answered)
        tokens_per_s = sum(sample.n_tokens for sample in samples) / elapsed if elapsed > 0 else 0.0
        finished = datetime.now(timezone.utc)
        peak = _peak_memory_bytes(self.backend.device)
        blocks = self.backend.block_counts()
        if blocks is None or len(blocks) != len(samples):  # not counted, or not one count per sample
            blocks = [None] * len(samples)
        gaps = self.backend.token_gaps()
        if gaps is None or len(gaps) != len(samples):  # a model run here: nothing a server could miscount
            gaps = [None] * len(samples)
        rows = []
        for (sample, todo), results, counted, gap in zip(batch, answered, blocks, gaps, strict=True):
            by_position = {result.get("position"): result for result in results}
            fitting = self.backend.fitting(sample.scoring, sample.n_tokens, answer_length(sample))
            request = self._digest(sample)
            rows += [
                {
                    **row,
                    **by_position[row["position"]],
                    "request_digest": request,
                    "draw": sample.draw,
                    "document_start": sample.meta.get("start") if sample.scoring == "nll" else None,
                    "n_tokens": sample.n_tokens,
                    "dropped_tokens": fitting.dropped,
                    "needle_depth": sample.needle_depth,
                    "bos": fitting.bos,
                    "served_token_gap": gap,
                    "seconds": seconds,
                    "tokens_per_s": tokens_per_s,
                    "peak_mem_bytes": peak,
                    "skipped_blocks": None if counted is None else counted[0],
                    "key_blocks": None if counted is None else counted[1],
                    "created_at": finished,
                }
                for row in todo
            ]
        return rows


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
