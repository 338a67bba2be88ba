"""The sweep every shard must agree on, recorded beside the rows it writes.

A sweep is what decides which rows a command makes and what they hold: the models as
given, each task request (task, protocol, lengths, samples, seeds, depths, generator
options) with, per model, the fingerprint of the prompts that model runs (its protocol
resolved with its tokenizer, ``bamctl.runs.plans``), and the engine options asked for. Its id is the
fingerprint of that description; how many shards run it is not part of it.

A sharded run (``--shard I/N`` with N > 1, ``--shard auto``, or a shard of ``bamctl
submit``) records its sweep in the results directory, ``OUT/_sweeps/ID.json``
(hidden from every Parquet reader by its ``_``), and marks each shard that finished,
``OUT/_sweeps/ID/done-I-of-N``. Under ``bamctl submit`` the same folder holds the jobs
submitted (``jobs-of-N.json``: id and log of each shard's job, for a rerun to attach to and
for ``bamctl submit --status``) and what each shard covered (``report-I-of-N.json``), from
which ``submit`` prints the sweep's one table. Before anything is written it refuses:

- a sweep other than the one ``bamctl submit`` gave it (the job's environment differs:
  another checkout, another corpus file, other options);
- a results directory holding an unfinished different sweep whose rows share keys with
  this one (a model, a task with its protocol, options and fingerprint, a seed and a
  length in common): its shards would split the samples otherwise, leaving gaps and
  doubles.

Two different sweeps starting in the same instant may both pass; the check is meant for
the shards of one sweep started over minutes or hours, and for a rerun with other options.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bamctl.errors import BamctlError
from bamctl.files import atomic_write
from bamctl.fingerprints import digest

SWEEPS_DIR = "_sweeps"

_given: contextvars.ContextVar[str | None] = contextvars.ContextVar("given_sweep", default=None)
_planning: contextvars.ContextVar[bool] = contextvars.ContextVar("planning_sweep", default=False)


class SweepPlanned(Exception):
    """Raised instead of running, inside :func:`planning`: the command's sweep, checked and described."""

    def __init__(self, description: dict, out: Path, report: dict | None = None):
        super().__init__("sweep planned")
        self.description, self.out, self.report = description, out, report or {}


def describe(models: Sequence[str], requests: Sequence[Any], plans: Sequence[Sequence[dict]], engine: dict,
             code: dict | None = None) -> dict:
    """The description of a sweep, from what ``run_models`` checked (JSON-able). ``plans[r][m]``
    maps each protocol model ``m`` may run for request ``r`` to that plan's fingerprint; ``code``
    maps a ``py:`` model to the digest of the file its shards import, so a file edited between
    ``submit`` and a shard's start is another sweep, refused by name."""
    described = {
        "models": list(models),
        "requests": [{**asdict(request), "plans": dict(zip(models, per_model))} for request, per_model in zip(requests, plans)],
        "engine": dict(sorted(engine.items())),
    }
    if code:  # absent otherwise, so sweeps without py: models keep their ids
        described["code"] = dict(sorted(code.items()))
    return described


def sweep_id(description: dict) -> str:
    return digest(description)


def _normalised(description: dict) -> dict:
    """As JSON gives it back (tuples become lists), so a written description compares equal."""
    return json.loads(json.dumps(description, default=str))


def differences(given: dict, here: dict, prefix: str = "") -> list[str]:
    """Each field where two descriptions differ, as ``path: given -> here``."""
    if isinstance(given, dict) and isinstance(here, dict):
        return [d for key in sorted(set(given) | set(here), key=str)
                for d in differences(given.get(key), here.get(key), f"{prefix}.{key}" if prefix else str(key))]
    if isinstance(given, list) and isinstance(here, list) and len(given) == len(here) and given and isinstance(given[0], dict):
        return [d for i, (a, b) in enumerate(zip(given, here)) for d in differences(a, b, f"{prefix}[{i}]")]
    return [] if given == here else [f"{prefix}: {given!r} -> {here!r}"]


def _plans(request: dict, model: str) -> set[tuple[str, str]]:
    """(protocol, fingerprint) pairs ``model`` may run for ``request``; a manifest written before
    per-model plans holds one fingerprint for all models."""
    if "plans" in request:
        return set(request["plans"].get(model, {}).items())
    return {(request["protocol"], request["fingerprint"])}


def _requests_share_keys(a: dict, b: dict, models: set[str]) -> bool:
    same = a["task"] == b["task"] and a["options"] == b["options"] and any(_plans(a, m) & _plans(b, m) for m in models)
    depths_apart = a["depths"] is not None and b["depths"] is not None and not set(a["depths"]) & set(b["depths"])
    return same and not depths_apart and bool(set(a["seeds"]) & set(b["seeds"])) and bool(set(a["lengths"]) & set(b["lengths"]))


def share_keys(a: dict, b: dict) -> bool:
    """Whether two sweeps would write rows under the same resume keys."""
    models = set(a["models"]) & set(b["models"])
    return bool(models) and any(_requests_share_keys(ra, rb, models) for ra in a["requests"] for rb in b["requests"])


@dataclass(frozen=True)
class SweepRecord:
    """One sweep's manifest and finish marks in a results directory."""

    out: Path
    id: str

    @property
    def manifest(self) -> Path:
        return self.out / SWEEPS_DIR / f"{self.id}.json"

    def description(self) -> dict:
        return json.loads(self.manifest.read_text(encoding="utf-8"))["sweep"]

    def write(self, description: dict) -> None:
        if self.manifest.exists():
            return
        self.manifest.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"id": self.id, "sweep": description}, indent=2, default=str)
        atomic_write(self.manifest, lambda path: Path(path).write_text(text + "\n", encoding="utf-8"))

    def _mark(self, index: int, count: int) -> Path:
        return self.out / SWEEPS_DIR / self.id / f"done-{index}-of-{count}"

    def finish(self, shard: tuple[int, int]) -> None:
        self._mark(*shard).parent.mkdir(parents=True, exist_ok=True)
        self._mark(*shard).touch()

    def finished_shards(self, count: int) -> set[int]:
        return {i for i in range(count) if self._mark(i, count).exists()}

    @property
    def folder(self) -> Path:
        return self.out / SWEEPS_DIR / self.id

    def _jobs_file(self, count: int) -> Path:
        return self.folder / f"jobs-of-{count}.json"

    def record_jobs(self, count: int, jobs: dict[int, dict]) -> None:
        """Add the jobs just submitted (shard index -> {"job": id, "log": path}) to those recorded."""
        merged = {**self.recorded_jobs(count), **jobs}
        self.folder.mkdir(parents=True, exist_ok=True)
        text = json.dumps({str(index): entry for index, entry in sorted(merged.items())}, indent=2)
        atomic_write(self._jobs_file(count), lambda path: Path(path).write_text(text + "\n", encoding="utf-8"))

    def recorded_jobs(self, count: int) -> dict[int, dict]:
        try:
            return {int(index): entry for index, entry in json.loads(self._jobs_file(count).read_text(encoding="utf-8")).items()}
        except (OSError, ValueError):
            return {}

    def split_counts(self) -> list[int]:
        """The shard counts this sweep was submitted or run with."""
        names = [p.name for p in self.folder.iterdir()] if self.folder.is_dir() else []
        counts = {int(n.rpartition("-of-")[2].removesuffix(".json")) for n in names if "-of-" in n}
        return sorted(counts)

    def save_report(self, shard: tuple[int, int], report: dict) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        text = json.dumps(report, default=str)
        atomic_write(self.folder / f"report-{shard[0]}-of-{shard[1]}.json", lambda path: Path(path).write_text(text, encoding="utf-8"))

    def reports(self, count: int) -> list[dict]:
        """What each finished shard of an ``count``-way split covered, as its ``save_report`` wrote it."""
        return [json.loads((self.folder / f"report-{i}-of-{count}.json").read_text(encoding="utf-8"))
                for i in sorted(self.finished_shards(count)) if (self.folder / f"report-{i}-of-{count}.json").exists()]

    def finished(self) -> bool:
        """Every shard of some split of this sweep has finished."""
        folder = self.out / SWEEPS_DIR / self.id
        counts = {int(p.name.rpartition("-of-")[2]) for p in folder.glob("done-*-of-*")} if folder.is_dir() else set()
        return any(len(self.finished_shards(n)) == n for n in counts)


def records(out: Path) -> list[SweepRecord]:
    folder = Path(out) / SWEEPS_DIR
    return [SweepRecord(Path(out), p.stem) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []


def check_claim(out: Path, description: dict) -> SweepRecord:
    """The record ``description`` would have in ``out``; refused where an unfinished other sweep
    there shares its keys. Writes nothing."""
    description = _normalised(description)
    record = SweepRecord(Path(out), sweep_id(description))
    for other in records(out):
        if other.id == record.id or other.finished():
            continue
        theirs = other.description()
        if share_keys(theirs, description):
            raise BamctlError(
                f"{out} holds rows of an unfinished other sweep under the same keys ({other.manifest}); "
                f"differences: {'; '.join(differences(theirs, description)) or 'none'}. Run it with the same "
                f"options, use another --dir, or delete {other.manifest} if that sweep is abandoned"
            )
    return record


def claim(out: Path, description: dict) -> SweepRecord:
    """Record ``description`` in ``out`` unless an unfinished other sweep there shares its keys."""
    record = check_claim(out, description)
    record.write(_normalised(description))
    return record


@dataclass(frozen=True)
class ShardRun:
    """What ``run_models`` holds between its checks and its end: the record to mark, if any."""

    record: SweepRecord | None
    shard: tuple[int, int]
    submitted: bool = False  # a shard of `bamctl submit`, which prints the sweep's table itself

    def finish(self) -> None:
        if self.record is not None:
            self.record.finish(self.shard)

    def save_report(self, report: dict) -> None:
        """What this shard covered, for ``submit``'s table; written before the finish mark."""
        if self.record is not None:
            self.record.save_report(self.shard, report)


def enter(out: Path, description: dict, shard: tuple[int, int], *, report: dict | None = None) -> ShardRun:
    """Check this run against the sweep it was given and the results directory, before any work.
    ``report``: how the command prints its table (names, --json, --plot ...), for ``submit``."""
    if _planning.get():
        raise SweepPlanned(_normalised(description), Path(out), report)
    given, here = _given.get(), sweep_id(_normalised(description))
    if given is not None and given != here:
        record = SweepRecord(Path(out), given)
        why = "; ".join(differences(record.description(), _normalised(description))) if record.manifest.exists() else "its manifest is gone"
        raise BamctlError(f"shard {shard[0]}/{shard[1]} runs another sweep than the one submitted ({given}): {why}; nothing written")
    if given is None and shard[1] == 1:
        return ShardRun(None, shard)
    return ShardRun(claim(out, description), shard, submitted=given is not None)


@contextmanager
def planning() -> Iterator[None]:
    """Inside, an evaluation command checks its options and raises :class:`SweepPlanned` instead of running."""
    token = _planning.set(True)
    try:
        yield
    finally:
        _planning.reset(token)


@contextmanager
def expecting(sweep: str) -> Iterator[None]:
    """Inside, an evaluation command refuses to run any sweep but ``sweep``."""
    token = _given.set(sweep)
    try:
        yield
    finally:
        _given.reset(token)
