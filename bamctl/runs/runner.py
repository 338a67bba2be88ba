"""A run: models evaluated on task requests, every check before any work, rows into one store.

The command line's run commands and ``bamctl.evaluate`` both call ``run_models``; they
differ only in how they ask (option groups, keyword arguments) and what they do with the
``RunOutcome`` (a printed table, a DataFrame). What a run tells as it goes (the batches it
chose, notes, warnings, a line per finished cell) goes to ``console`` (rich, stderr by
default), with a progress bar when that is a terminal and ``quiet`` is off.

Order of work:

1. everything that needs no model: options, seeds, shard, model references and their
   back-ends, task names and protocols, the plans of every task with each one's shortest
   length built (GPT-2's tokenizer; again with each model's own before its first sample);
2. the sweep entered (a sharded run refuses one that disagrees with an unfinished other);
3. models opened one at a time, each checking its longest request (memory,
   ``--beyond-max``) before its first sample, and released before the next.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from bamctl.errors import BamctlError
from bamctl.runs import checks

# The reference a run evaluates when no model is named: the one the paper's claims are about.
FLAGSHIP = {"passkey": "bam-ssmax", "ruler": "bam-ssmax", "ppl": "lm-bam"}


@dataclass
class RunOutcome:
    """What a run covered: the resume keys of every row it asked for, the model identities
    (model hash, back-end) with the names they were asked under, and the compute versions."""

    store: object  # bamctl.results.store.ResultStore
    names: list[str]
    covered: set = field(default_factory=set)
    names_by_identity: dict[tuple, list[str]] = field(default_factory=dict)
    versions: set = field(default_factory=set)
    submitted: bool = False  # a shard of `bamctl submit`: the table is submit's to print

    def rows(self):
        """The stored rows of exactly this run's request, each under the name it was asked by."""
        return covered_rows(self.store.read(), self.covered, self.names_by_identity)


def covered_rows(frame, covered: set, names_by_identity: dict[tuple, list[str]]):
    """Rows whose key is ``covered``, found by model identity and shown under each name that
    identity was asked by: a checkpoint folder renamed since still finds its rows, and two
    references to one model show the same rows, each under its own name."""
    import pandas as pd

    from bamctl.results.schema import row_key

    if not len(frame):
        return frame
    frame = frame[[row_key(row) in covered for row in frame.to_dict("records")]]
    if not len(frame):
        return frame.reset_index(drop=True)
    identity = list(zip(frame["model_hash"], frame["backend"]))
    return pd.concat(
        [frame[[i == key for i in identity]].assign(model=name) for key, same in names_by_identity.items() for name in same],
        ignore_index=True,
    )


def model_or_flagship(model, command: str, say) -> object:
    """The model asked for, or the flagship reference of the command's kind of task
    (``passkey``, ``ruler``, ``ppl``), named in one line."""
    if model is not None:
        return model
    say(f"no model named: evaluating the shipped reference {FLAGSHIP[command]} "
        f"(name one first: bamctl {command} MODEL ...)")
    return FLAGSHIP[command]


def command_of(task: str) -> str:
    """The run command a task belongs to: passkey, ppl, or ruler for every RULER task."""
    return task if task in FLAGSHIP else "ruler"


def model_names(models: list) -> list[str]:
    """The names rows and tables give models: a reference's last path part (the whole reference
    where two share it), a model in memory its own name."""
    names = [m.name if not isinstance(m, str) else m.rstrip("/").split("/")[-1] for m in models]
    return [m if isinstance(m, str) and names.count(n) > 1 else n for n, m in zip(names, models)]


def checked_names(names: list[str], models: list) -> list[str]:
    """``names``, one per model and each once: a table, a plot and the rows' ``model`` column
    key on the name, so one given twice would merge two columns (two names for one model are
    two columns of the same rows: the runner says so)."""
    if len(names) != len(models):
        raise BamctlError(f"{len(names)} names given for {len(models)} models")
    twice = next((name for i, name in enumerate(names) if name in names[:i]), None)
    if twice is not None:
        raise BamctlError(f"{twice} is named twice: name each model once (a table has one column per name)")
    return names


AUTO_BATCH = "auto"


def parse_batch_size(value, flag: str = "--batch-size") -> int | None:
    """A batch size as asked (``--batch-size``, the API's ``batch_size``): None for auto, else a
    positive number of samples; ``flag`` is how the error names it."""
    if isinstance(value, str) and value.strip().lower() == AUTO_BATCH:
        return None
    try:
        size = int(value)
    except (TypeError, ValueError):
        size = 0
    if size < 1:
        shown = "auto" if flag.startswith("--") else "'auto'"
        raise BamctlError(f"{flag} must be {shown} or a positive number of samples, not {value!r}")
    return size


def run_options(values: dict):
    """The engine options a run asks (``bamctl.backends.RunOptions``) from values by field name
    (the command line's option groups, the API's keywords); ``--prior-form`` is spelt with a dash."""
    from dataclasses import fields

    from bamctl.backends import RunOptions

    taken = {f.name: values[f.name] for f in fields(RunOptions)}
    if taken["prior_form"] is not None:
        taken["prior_form"] = taken["prior_form"].replace("-", "_")
    return RunOptions(**taken)


def model_label(model) -> str:
    """How messages and a sweep's record name a model: its reference, or a model in memory's label."""
    return model if isinstance(model, str) else model.label


def run_models(
    models: list, asked, run, *, out: Path, batch_size: int | None = None, force: bool = False, reuse: bool = False,
    shard: str | None = None, quiet: bool = False, names: list[str] | None = None, report: dict | None = None,
    console: Console | None = None, answer_logprob: bool = False,
) -> RunOutcome:
    """Evaluate every model on the requests ``asked`` (``bamctl.runs.requests.AskedRequests``)
    with the engine options ``run`` (``bamctl.backends.RunOptions``), rows into ``out``.

    ``models``: references (catalog names, folders, ``PREFIX:PATH``) or models in memory
    (``bamctl.backends.in_memory``); ``names``: what rows call them (default ``model_names``);
    ``batch_size``: None for auto; ``shard``: 'I/N' or 'auto'; ``report``: what a shard of
    ``bamctl submit`` records for the table submit prints; ``answer_logprob``: generated rows also
    teacher-force their expected answer (``--answer-logprob``).
    """
    from bamctl.backends import open_backend, peek_backend
    from bamctl.cluster import sweep
    from bamctl.cluster.shards import shard_option
    from bamctl.evaluation import Evaluation, new_run_id
    from bamctl.results.store import ResultStore
    from bamctl.runs.plans import model_plans
    from bamctl.runs.progress import progress_display
    from bamctl.runs.training_kind import mismatch_warnings
    from bamctl.tasks.registry import SCORED_OVER_TOKENS
    from bamctl.tokenizer import get_tokenizer

    console = console or Console(stderr=True, highlight=False)

    def say(line: str) -> None:
        console.print(line, soft_wrap=True)

    def tell(line: str) -> None:  # what the run does, as planned: left out by --quiet (notes on the numbers are not)
        if not quiet:
            say(line)

    shard_of = shard_option(shard, os.environ, say=say)
    if shard_of != (0, 1) and any(not isinstance(m, str) for m in models):
        raise BamctlError("a model in memory cannot be sharded: its shards would run in other processes; "
                          "save it (bamctl.checkpoint.save_checkpoint, save_pretrained) and shard the folder")
    if run.device is not None:
        from bamctl.devices import resolve_device

        resolve_device(run.device)
    names = checked_names(names or model_names(models), models)
    taken = _options_per_model(models, run, say)
    peeks = [peek_backend(model, options) for model, options in zip(models, taken)]
    requests = asked.for_models([p.train_length for p in peeks])
    # Options, protocols and plans checked now; what depends on each model's tokenizer, when it loads.
    plans = [request.plan(get_tokenizer(checks.PLANNING_TOKENIZER), check_tokenizer=False) for request in requests]
    if asked.lengths is None and all(peek.tokenizer == checks.PLANNING_TOKENIZER for peek in peeks):
        requests, plans = checks.start_where_each_task_builds(requests, plans, say)
    if any(peek.tokenizer == checks.PLANNING_TOKENIZER for peek in peeks):
        for plan in plans:  # every task's shortest length built, so none is found too short mid-run
            plan.check_lengths()  # (a model of another tokenizer: in its pre-flight, with its own)
    labels = [model_label(model) for model in models]
    for request in requests:
        checks.refuse_beyond_max(request, labels, peeks, run)
    if any(plan.spec.scoring in SCORED_OVER_TOKENS for plan in plans):
        checks.refuse_mixed_vocabularies(names, peeks)
    if asked.lengths is None:
        tell(checks.planned_lengths_line(requests, plans, peeks))
    code = {label: peek.source_digest for label, peek in zip(labels, peeks) if peek.source_digest}
    # what the rows hold is part of the sweep: a shard with --answer-logprob beside one without would
    # leave half the generated rows without the figure a summary averages (left out when off, so
    # sweeps recorded before it keep their ids)
    engine = {**run.asked(), **({"answer_logprob": True} if answer_logprob else {})}
    shard_run = sweep.enter(out, sweep.describe(labels, requests, model_plans(requests, peeks), engine, code), shard_of,
                            report=report or {})
    store = ResultStore(out)
    store.ensure_writable()
    for line in mismatch_warnings(models, names, [request.task for request in requests]):  # checks passed: the run goes on
        say(line)
    if quiet:
        quiet_external_libraries()
    run_id = new_run_id()
    outcome = RunOutcome(store=store, names=names)
    prompts, notes = {}, set()
    with progress_display(console, quiet) as progress:
        for position, (model, name, options) in enumerate(zip(models, names, taken)):
            backend = open_backend(model, options)
            identity = (backend.info.model_hash, backend.kind)
            same = outcome.names_by_identity.setdefault(identity, [])
            same.append(name)
            if len(same) > 1:  # its rows are the first one's: computed once, shown under both names
                say(f"note: {name} is the same model as {same[0]} (model hash {identity[0]}, back-end "
                    f"{identity[1]}): its column shows the same rows")
                del backend
                continue
            evaluations = [Evaluation(backend, request, store, model_name=name, run_id=run_id, answer_logprob=answer_logprob)
                           for request in requests]
            outcome.versions.update(evaluation.compute_version for evaluation in evaluations)
            steps = _ModelRun(evaluations, name, progress, say, prompts, notes, out=out, shard_of=shard_of,
                              batch_size=batch_size, force=force, reuse=reuse, quiet=quiet)
            try:
                outcome.covered |= steps.run()
            finally:
                backend.close()  # vLLM's engine processes end here, not whenever it is collected
            del backend, evaluations, steps  # one model in memory at a time
            if position < len(models) - 1:  # freed before the next loads; after the last, the caller's to keep or free
                gc.collect()
    if shard_run.submitted:  # `bamctl submit` prints the whole sweep's table: no partial table or plot here
        from bamctl.runs import shard_report

        shard_run.save_report(shard_report.to_json(outcome.covered, outcome.names_by_identity, outcome.versions))
        outcome.submitted = True
    shard_run.finish()
    return outcome


class _ModelRun:
    """One model's evaluations: each checked before the first sample, its batches said, then run."""

    def __init__(self, evaluations, name, progress, say, prompts: dict, notes: set, *, out, shard_of, batch_size,
                 force, reuse, quiet):
        self.evaluations, self.name, self.progress, self.say = evaluations, name, progress, say
        self.prompts, self.notes = prompts, notes
        self.out, self.shard_of, self.batch_size = out, shard_of, batch_size
        self.force, self.reuse, self.quiet = force, reuse, quiet

    def run(self) -> set:
        """The resume keys the model's requests cover (all shards)."""
        for evaluation in self.evaluations:
            evaluation.preflight(self.batch_size)
            if not self.quiet:
                self.say(batch_line(evaluation, self.name, self.batch_size))
            self._note_other_prompts(evaluation)
            for note in evaluation.plan.notes:
                if note not in self.notes:
                    self.notes.add(note)
                    self.say(f"note: {note}")
        covered = set()
        for evaluation in self.evaluations:
            covered |= evaluation.keys()
            self._run_one(evaluation)
        return covered

    def _run_one(self, evaluation) -> None:
        from bamctl.runs.progress import RunProgress, format_seconds

        progress = self.progress
        label = f"{evaluation.request.task} {self.name}"
        bar = progress.add_task(label, total=evaluation.count(self.shard_of), rate="", eta="-:--:--")
        without_bar = not self.quiet and progress.disable  # stderr is no terminal: a line per finished cell instead
        tracker = RunProgress(evaluation.slots_of(self.shard_of), label, say=self.say if without_bar else None)
        tokens, seconds = 0, 0.0

        def advance(row):
            nonlocal tokens, seconds
            tokens, seconds = tokens + row["n_tokens"], seconds + row["seconds"]
            tracker.row_written(row)
            left = tracker.eta()
            progress.update(bar, advance=1, rate=f"{tokens / max(seconds, 1e-9):,.0f} tok/s",
                            eta="-:--:--" if left is None else format_seconds(left))

        try:
            stats = evaluation.run(force=self.force, reuse=self.reuse, on_row=advance, shard=self.shard_of, checked=True,
                                   batch_size=self.batch_size)
        except BaseException:  # Ctrl-C or an error: the cell in flight says what it computed, nothing more
            tracker.finish(interrupted=True)
            raise
        tracker.finish()
        progress.update(bar, completed=progress.tasks[bar].total)
        for line in run_notes(stats, self.name, self.out, evaluation.backend, quiet=self.quiet):
            self.say(line)

    def _note_other_prompts(self, evaluation) -> None:
        """Models whose tokenizers differ see other prompts: say so (they share a table, tested unpaired)."""
        key = (evaluation.request.task, evaluation.plan.spec.protocol)
        fingerprint = evaluation.common["fingerprint"]
        first = self.prompts.setdefault(key, (self.name, fingerprint, evaluation.backend.tokenizer.name))
        if first[1] != fingerprint:
            self.say(f"note: {self.name} sees other {key[0]} prompts than {first[0]} (tokenizer "
                     f"{evaluation.backend.tokenizer.name} against {first[2]}): one table, not paired")


def _options_per_model(models: list, run, say) -> list:
    """Each model's options: an option that some of the models take applies to those, and a line
    says which it does not reach (``compare hf:M lm-rope --beyond-max refuse``); one that none takes
    stays, so its back-end refuses it by name."""
    from dataclasses import fields, replace

    from bamctl.backends import options_not_taken
    from bamctl.backends.base import option_flag

    if len(models) < 2:
        return [run] * len(models)
    dropped = [options_not_taken(model, run) for model in models]
    somewhere = {name for names in dropped for name in names if not all(name in other for other in dropped)}
    defaults = {f.name: f.default for f in fields(run)}
    for name in sorted(somewhere):
        left_out = [model_label(m) for m, names in zip(models, dropped) if name in names]
        say(f"note: {option_flag(name)} applies to the models that take it, not to {', '.join(left_out)}")
    return [replace(run, **{name: defaults[name] for name in names if name in somewhere}) for names in dropped]


def batch_line(evaluation, name: str, batch_size: int | None) -> str:
    """``--batch-size`` as it runs: the samples asked at once at each length of the request."""
    from bamctl.results.render import format_length

    asked = "auto" if batch_size is None else str(batch_size)
    if evaluation.whole_request(batch_size):
        return f"{name} {evaluation.request.task}: batches (--batch-size {asked}): all {len(evaluation.plan.slots)} samples at once"
    sizes = evaluation.batch_sizes(batch_size)
    per_length = ", ".join(f"{size} at {format_length(length)}" for length, size in sizes.items())
    return f"{name} {evaluation.request.task}: batches (--batch-size {asked}) of {per_length} samples"


def run_notes(stats, name: str, out: Path, backend, *, quiet: bool = False) -> list[str]:
    """What a user should know of a model's run: rows reused, rows computed again, tokens dropped.
    ``quiet``: without the line on rows reused as asked (the others concern the numbers)."""
    from bamctl.results.render import plural

    lines = []
    if stats.skipped and not (quiet and not stats.reused_other_code):
        reused = f", {stats.reused_other_code} of them computed by another compute version (--reuse)" if stats.reused_other_code else ""
        lines.append(f"{name}: {plural(stats.skipped, 'sample')} already in {out}, skipped{reused} (--force recomputes)")
    if stats.other_code:
        lines.append(f"{name}: {plural(stats.other_code, 'sample')} stored in {out} by another compute version (other bamctl "
                     "code or library versions) computed again (--reuse takes them)")
    if stats.unread_again:
        lines.append(f"{name}: {plural(stats.unread_again, 'sample')} stored in {out} unscored (a server read the prompt "
                     "at another length than sent) asked again")
    if stats.other_request:
        lines.append(f"{name}: {plural(stats.other_request, 'sample')} stored in {out} for other prompts under the same key "
                     "computed again")
    limit = getattr(getattr(backend, "lengths", None), "limit", None)
    at = f" to fit its maximum of {limit:,} positions" if limit else " to fit its maximum length"
    if stats.dropped_tokens:
        lines.append(f"{name}: {stats.dropped_tokens} prompt tokens left out from the start of {stats.dropped_rows} "
                     f"prompts{at} (their rows record it: bamctl results show --dropped)")
    if stats.unread_rows:
        lines.append(f"{name}: {plural(stats.unread_rows, 'prompt')} read by the server at another length than sent: "
                     "not scored, their rows record it (served_token_gap) and no summary counts them")
    if stats.bos_left_out:
        lines.append(f"{name}: {plural(stats.bos_left_out, 'prompt')} fed without the BOS its other prompts get{at}, "
                     "so their numbers are not those of the other lengths (their rows record bos = false: bamctl "
                     "results show --dropped)")
    return lines


def quiet_external_libraries() -> None:
    """--quiet: no progress bars from Hugging Face libraries either (loading shards, downloads)."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    try:
        import transformers
    except ImportError:
        return
    transformers.utils.logging.disable_progress_bar()
