"""Evaluation commands: ``passkey``, ``ruler``, ``ppl`` and ``compare``.

Each turns its options into ``TaskRequest``\\ s, opens the back-ends, runs
``bamctl.evaluate.Evaluation`` with a progress bar on stderr, and prints the summary
of exactly the rows it covers (stdout; ``--json``: one document per invocation).
The options they share are declared once, in ``bamctl.cli.options``, and turned into
requests by ``bamctl.cli.requests``, as ``generate``'s are.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from bamctl.cli import options as opt
from bamctl.cli.app import app
from bamctl.cli.plot_paths import plot_path
from bamctl.cli.requests import AskedRequests, task_names
from bamctl.errors import BamctlError

# Tables to a pipe or file keep their full width instead of being cut at 80 columns.
stdout = Console(highlight=False, width=None if sys.stdout.isatty() else 1000)
stderr = Console(stderr=True, highlight=False)
PLANNING_TOKENIZER = "gpt2"  # plans are checked in it before any model loads: the tokenizer of bamctl's own models


def _run_options(ev, prompt) -> "RunOptions":  # noqa: F821 - bamctl.backends, imported lazily
    from bamctl.backends import RunOptions

    return RunOptions(
        device=ev.device, dtype=ev.dtype, chunk_size=ev.chunk_size, attention=ev.attention, tokenizer=prompt.tokenizer,
        beyond_max=ev.beyond_max, chat_template=prompt.chat_template, tensor_parallel=ev.tensor_parallel,
        bos=ev.bos, prior_form=None if ev.prior_form is None else ev.prior_form.replace("-", "_"),
        rope_scaling=ev.rope_scaling, rope_factor=ev.rope_factor,
    )


def _progress(quiet: bool):
    """The bar on a terminal; elsewhere (a log file) it is off, and each finished cell prints a line."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TextColumn("eta {task.fields[eta]}"),  # priced by length (bamctl.cli.progress), not by sample count
        console=stderr,
        disable=quiet or not sys.stderr.isatty(),
        transient=False,
    )


def run_models(
    models: list[str], asked, ev, prompt, *, threshold: float = 0.9, plot: Path | None = None, baseline: str | None = None
) -> None:
    """Evaluate every model on the requests ``asked`` (``bamctl.cli.requests.AskedRequests``); print one summary.

    Everything is checked before the first model loads: options, seeds, shard, model
    references and their back-ends, task names and protocols, and the plans of every task,
    each one's shortest length built (with GPT-2's tokenizer; again with each model's own
    before its first sample). Models are
    then opened one at a time and released before the next; each back-end checks its
    longest request (memory, ``--beyond-max``) before its first sample.
    """
    import gc
    import os

    from bamctl.backends import open_backend, peek_backend
    from bamctl.cli.training_kind import mismatch_warnings
    from bamctl.cluster import sweep
    from bamctl.cli.sweep_plans import model_plans
    from bamctl.cluster.shards import shard_option
    from bamctl.evaluate import Evaluation, new_run_id
    from bamctl.results.store import ResultStore
    from bamctl.tasks.registry import SCORED_OVER_TOKENS
    from bamctl.tokenizer import get_tokenizer

    shard_of = shard_option(ev.shard, os.environ, say=lambda line: stderr.print(line, soft_wrap=True))
    batch_size = opt.parse_batch_size(ev.batch_size)
    run = _run_options(ev, prompt)
    if run.device is not None:
        from bamctl.devices import resolve_device

        resolve_device(run.device)
    peeks = [peek_backend(model, run) for model in models]
    requests = asked.for_models([p.train_length for p in peeks])
    # Options, protocols and plans checked now; what depends on each model's tokenizer, when it loads.
    plans = [request.plan(get_tokenizer(PLANNING_TOKENIZER), check_tokenizer=False) for request in requests]
    if asked.lengths is None and all(peek.tokenizer == PLANNING_TOKENIZER for peek in peeks):
        requests, plans = _start_where_each_task_builds(requests, plans)
    if any(peek.tokenizer == PLANNING_TOKENIZER for peek in peeks):
        for plan in plans:  # every task's shortest length built, so none is found too short mid-run
            plan.check_lengths()  # (a model of another tokenizer: in its pre-flight, with its own)
    for request in requests:
        _refuse_beyond_max(request, models, peeks, run)
    names = _model_names(models)
    if any(plan.spec.scoring in SCORED_OVER_TOKENS for plan in plans):
        _refuse_mixed_vocabularies(names, peeks)
    if asked.lengths is None:
        _say_planned_lengths(requests, plans, peeks)
    report = {"names": names, "json": ev.json, "threshold": threshold, "plot": plot and str(plot), "baseline": baseline}
    shard_run = sweep.enter(ev.out, sweep.describe(models, requests, model_plans(requests, peeks), run.asked()), shard_of,
                            report=report)
    store = ResultStore(ev.out)
    store.ensure_writable()
    for line in mismatch_warnings(models, names, [request.task for request in requests]):  # checks passed: the run goes on
        stderr.print(line, soft_wrap=True)
    if ev.quiet:
        _quiet_external_libraries()
    run_id = new_run_id()
    covered, names_by_identity, prompts, notes, versions = set(), {}, {}, set(), set()
    with _progress(ev.quiet) as progress:
        for model, name in zip(models, names):
            backend = open_backend(model, run)
            identity = (backend.info.model_hash, backend.kind)
            same = names_by_identity.setdefault(identity, [])
            same.append(name)
            if len(same) > 1:  # its rows are the first one's: computed once, shown under both names
                stderr.print(f"note: {name} is the same model as {same[0]} (model hash {identity[0]}, back-end "
                             f"{identity[1]}): its column shows the same rows", soft_wrap=True)
                del backend
                continue
            evaluations = [Evaluation(backend, request, store, model_name=name, run_id=run_id) for request in requests]
            versions.update(evaluation.compute_version for evaluation in evaluations)
            covered |= _evaluate_model(evaluations, name, progress, ev, shard_of, prompts, notes, batch_size)
            del backend, evaluations  # one model in memory at a time
            gc.collect()
    if shard_run.submitted:  # `bamctl submit` prints the whole sweep's table: no partial table or plot here
        from bamctl.cli import shard_report

        shard_run.save_report(shard_report.to_json(covered, names_by_identity, versions))
        shard_run.finish()
        return
    shard_run.finish()
    _report(store, covered, names_by_identity, names, json_output=ev.json, threshold=threshold, plot=plot,
            baseline=baseline, current_versions=versions)


def _evaluate_model(evaluations, name: str, progress, ev, shard_of, prompts: dict, notes: set, batch_size: int | None) -> set:
    """Check every request of one model before its first sample, say its batches, then run them; the keys they cover."""
    for evaluation in evaluations:
        evaluation.preflight(batch_size)
        stderr.print(_batch_line(evaluation, name, batch_size), soft_wrap=True)
        _note_other_prompts(prompts, evaluation, name)
        for note in evaluation.plan.notes:
            if note not in notes:
                notes.add(note)
                stderr.print(f"note: {note}", soft_wrap=True)
    covered = set()
    for evaluation in evaluations:
        covered |= evaluation.keys()
        _run_one(evaluation, name, progress, ev, shard_of, batch_size)
    return covered


def _batch_line(evaluation, name: str, batch_size: int | None) -> str:
    """``--batch-size`` as it runs: the samples asked at once at each length of the request."""
    from bamctl.results.render import format_length

    asked = "auto" if batch_size is None else str(batch_size)
    if evaluation.whole_request(batch_size):
        return f"{name} {evaluation.request.task}: batches (--batch-size {asked}): all {len(evaluation.plan.slots)} samples at once"
    sizes = evaluation.batch_sizes(batch_size)
    per_length = ", ".join(f"{size} at {format_length(length)}" for length, size in sizes.items())
    return f"{name} {evaluation.request.task}: batches (--batch-size {asked}) of {per_length} samples"


def _run_one(evaluation, name: str, progress, ev, shard_of, batch_size: int | None) -> None:
    from bamctl.cli.progress import RunProgress, format_seconds

    label = f"{evaluation.request.task} {name}"
    bar = progress.add_task(label, total=evaluation.count(shard_of), rate="", eta="-:--:--")
    without_bar = not ev.quiet and progress.disable  # stderr is no terminal: a line per finished cell instead
    say = (lambda line: stderr.print(line, soft_wrap=True)) if without_bar else None
    tracker = RunProgress(evaluation.slots_of(shard_of), label, say=say)
    tokens, seconds = 0, 0.0

    def advance(row):
        nonlocal tokens, seconds
        tokens, seconds = tokens + row["n_tokens"], seconds + row["seconds"]
        tracker.row_written(row)
        left = tracker.eta()
        progress.update(bar, advance=1, rate=f"{tokens / max(seconds, 1e-9):,.0f} tok/s",
                        eta="-:--:--" if left is None else format_seconds(left))

    try:
        stats = evaluation.run(force=ev.force, reuse=ev.reuse, on_row=advance, shard=shard_of, checked=True, batch_size=batch_size)
    finally:
        tracker.finish()
    progress.update(bar, completed=progress.tasks[bar].total)
    for line in _run_notes(stats, name, ev.out, evaluation.backend):
        stderr.print(line, soft_wrap=True)


def _run_notes(stats, name: str, out: Path, backend) -> list[str]:
    """What a user should know of a model's run: rows reused, rows computed again, tokens dropped."""
    lines = []
    if stats.skipped:
        reused = f", {stats.reused_other_code} of them computed by another compute version (--reuse)" if stats.reused_other_code else ""
        lines.append(f"{name}: {stats.skipped} samples already in {out}, skipped{reused} (--force recomputes)")
    if stats.other_code:
        lines.append(f"{name}: {stats.other_code} samples stored in {out} by another compute version (other bamctl "
                     "code or library versions) computed again (--reuse takes them)")
    if stats.other_request:
        lines.append(f"{name}: {stats.other_request} samples stored in {out} for other prompts under the same key "
                     "computed again")
    if stats.dropped_tokens:
        limit = getattr(getattr(backend, "lengths", None), "limit", None)
        at = f" to fit its maximum of {limit:,} positions" if limit else " to fit its maximum length"
        lines.append(f"{name}: {stats.dropped_tokens} prompt tokens left out from the start of {stats.dropped_rows} "
                     f"prompts{at} (their rows record it: bamctl results show --dropped)")
    return lines


def _refuse_beyond_max(request, models, peeks, run) -> None:
    """``--beyond-max refuse``: a length past a model's configured maximum stops the run before any work."""
    if run.beyond_max != "refuse":
        return
    longest = max(request.lengths)
    for model, peek in zip(models, peeks):
        if peek.max_length is not None and longest > peek.max_length:
            raise BamctlError(
                f"--lengths reach {longest:,} tokens, past {model}'s configured maximum of {peek.max_length:,} "
                "positions (--beyond-max refuse); use shorter --lengths or --beyond-max warn"
            )


def _refuse_mixed_vocabularies(names: list[str], peeks) -> None:
    """Perplexities over different sets of scored token ids are not comparable (fewer ids make
    every token easier): models of one tokenizer must score the same ids."""
    by_tokenizer: dict[str, dict] = {}
    for name, peek in zip(names, peeks):
        if peek.tokenizer is not None:
            by_tokenizer.setdefault(peek.tokenizer, {})[name] = peek.token_subset
    for tokenizer, subsets in by_tokenizer.items():
        if len(set(subsets.values())) > 1:
            described = ", ".join(
                f"{name} scores {'all' if ids is None else f'{len(ids):,}'} ids of {tokenizer}" for name, ids in subsets.items()
            )
            raise BamctlError(
                f"perplexities over different vocabularies are not comparable: {described}; "
                "compare models that score the same ids"
            )


def check_baseline(baseline: str, models: list[str]) -> None:
    """``--baseline`` must name one of the models shown; a name several columns share (one name,
    different weights or back-ends: ``name@hash8``, ``name[vllm]``) must say which."""
    from bamctl.errors import did_you_mean

    if baseline in models:
        return
    shared = [m for m in models if m.startswith((f"{baseline}@", f"{baseline}["))]
    if len(shared) > 1:
        raise BamctlError(f"--baseline {baseline} names {len(shared)} models with different weights or back-ends; pass one of {', '.join(shared)}")
    raise BamctlError(f"--baseline {baseline} is not one of the models compared{did_you_mean(baseline, models)}")


def _start_where_each_task_builds(requests, plans):
    """Default lengths (1x the training length and up) may begin below what a task's prompt needs
    (RULER's template alone is longer than 128 tokens): such a task starts at its shortest length
    that builds, and says so. Asked-for lengths are never changed (a too-short one is an error)."""
    import dataclasses

    from bamctl.results.render import format_length
    from bamctl.tokenizer import get_tokenizer

    kept_requests, kept_plans = [], []
    for request, plan in zip(requests, plans):
        first = plan.shortest_buildable_length()
        if first is not None and first > min(request.lengths):
            request = dataclasses.replace(request, lengths=[n for n in request.lengths if n >= first])
            plan = request.plan(get_tokenizer(PLANNING_TOKENIZER), check_tokenizer=False)
            stderr.print(f"{request.task}: the default lengths start at {format_length(first)}, the shortest its "
                         "prompt fits in (--lengths chooses others)", soft_wrap=True)
        kept_requests.append(request)
        kept_plans.append(plan)
    return kept_requests, kept_plans


def _say_planned_lengths(requests, plans, peeks) -> None:
    """Without --lengths, say what the defaults plan before a long run starts."""
    from bamctl.results.render import format_length

    lengths = sorted({length for r in requests for length in r.lengths})
    base = min(p.train_length for p in peeks)
    samples = sum(len(plan.slots) for plan in plans)
    stderr.print(
        f"planning {len(lengths)} lengths, {format_length(lengths[0])} to {format_length(lengths[-1])} "
        f"(1x to {lengths[-1] // base}x the training length {base:,}), {samples:,} samples per model; "
        "--lengths chooses others",
        soft_wrap=True,
    )


def _note_other_prompts(prompts: dict, evaluation, name: str) -> None:
    """Models whose tokenizers differ see other prompts: say so (their rows are summarised apart)."""
    key = (evaluation.request.task, evaluation.plan.spec.protocol)
    fingerprint = evaluation.common["fingerprint"]
    first = prompts.setdefault(key, (name, fingerprint, evaluation.backend.tokenizer.name))
    if first[1] != fingerprint:
        stderr.print(
            f"note: {name} sees other {key[0]} prompts than {first[0]} (tokenizer {evaluation.backend.tokenizer.name} "
            f"against {first[2]}); their results are summarised apart",
            soft_wrap=True,
        )


def _quiet_external_libraries() -> None:
    """--quiet: no progress bars from Hugging Face libraries either (loading shards, downloads)."""
    import os

    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    try:
        import transformers
    except ImportError:
        return
    transformers.utils.logging.disable_progress_bar()


def _model_names(models: list[str]) -> list[str]:
    names = [m.rstrip("/").split("/")[-1] for m in models]
    return [m if names.count(n) > 1 else n for n, m in zip(names, models)]


def _report(store, covered: set, names_by_identity: dict[tuple, list[str]], names: list[str], *, json_output: bool,
            threshold: float, plot: Path | None, baseline: str | None = None, current_versions: set | None = None) -> None:
    """Summaries of exactly the stored rows this invocation asked for, as one table set or JSON document.

    Rows are found by model identity (model hash and back-end) and prompt, and shown under this
    invocation's names: a checkpoint folder renamed since its rows were stored still finds them,
    and two references to one model show the same rows, each under its own name.
    """
    import json

    import pandas as pd

    from bamctl.results.render import render_summaries, summaries_to_json
    from bamctl.results.schema import row_key
    from bamctl.results.summary import summarize

    frame = store.read()
    if len(frame):
        frame = frame[[row_key(row) in covered for row in frame.to_dict("records")]]
        identity = list(zip(frame["model_hash"], frame["backend"]))
        frame = pd.concat(
            [frame[[i == key for i in identity]].assign(model=name) for key, same in names_by_identity.items() for name in same],
            ignore_index=True,
        ) if len(frame) else frame
    if frame.empty:  # e.g. a shard that drew no sample
        stderr.print("no result rows for this request yet")
        return
    summaries = summarize(frame, threshold=threshold, models=names, baseline=baseline, current_versions=current_versions)
    if json_output:
        typer.echo(json.dumps(summaries_to_json(summaries), indent=2))
    else:
        stdout.print(render_summaries(summaries))
    if plot is not None:
        from bamctl.results.plots import plot_grid

        path = plot_grid(frame, plot, models=names, threshold=threshold, baseline=baseline)
        stderr.print(f"plot written to {path}")


# The reference a run command evaluates when no model is named: the one the paper's claims are about.
FLAGSHIP = {"passkey": "bam-ssmax", "ruler": "bam-ssmax", "ppl": "lm-bam"}


def model_or_flagship(model: str | None, command: str) -> str:
    """The model asked for, or the command's flagship reference, named in one line on stderr."""
    if model is not None:
        return model
    stderr.print(f"no model named: evaluating the shipped reference {FLAGSHIP[command]} "
                 f"(name one first: bamctl {command} MODEL ...)", soft_wrap=True)
    return FLAGSHIP[command]


@app.command()
@opt.with_options("samples", "prompt", "evaluation", panels=())
def passkey(model: opt.ModelArgument = None, *, samples, prompt, evaluation) -> None:
    """Passkey retrieval: a 5-digit key hidden at several depths in filler, prompts of exact token length.

    Example: bamctl passkey bam-ssmax --lengths 512..32k --samples 4 --depths 5 --seed 0,1
    """
    run_models([model_or_flagship(model, "passkey")], AskedRequests(["passkey"], samples, prompt), evaluation, prompt)


@app.command()
@opt.with_options("samples", "prompt", "evaluation", panels=(opt.RULER_PANEL,))
def ruler(
    model: opt.ModelArgument = None,
    task: Annotated[str, typer.Option("--task", "-t", help="RULER tasks, comma separated: niah_single_1,2,3, niah_multikey_1,2,3, niah_multivalue, niah_multiquery, vt, cwe, fwe; all: every one of them.")] = "niah_single_1",
    *,
    samples,
    prompt,
    evaluation,
) -> None:
    """RULER's synthetic tasks: needle in a haystack, variable tracking (vt), common and frequent words
    extraction (cwe, fwe); greedy generation within the length, scored by string_match_all.

    Example: bamctl ruler bam-ssmax --task niah_single_1,vt,cwe,fwe --lengths 1k..8k --samples 20
    """
    run_models([model_or_flagship(model, "ruler")], AskedRequests(task_names(task), samples, prompt), evaluation, prompt)


@app.command()
@opt.with_options("samples", "prompt", "evaluation", panels=(opt.PERPLEXITY_PANEL,))
def ppl(model: opt.ModelArgument = None, *, samples, prompt, evaluation) -> None:
    """Perplexity: every token scored exactly once with up to L tokens of context (sliding), or per position bucket.

    Example: bamctl ppl lm-bam --lengths 512..8k --protocol sliding --stride 256
    """
    run_models([model_or_flagship(model, "ppl")], AskedRequests(["ppl"], samples, prompt), evaluation, prompt)


@app.command()
@opt.with_options("samples", "prompt", "evaluation")
def compare(
    models: Annotated[list[str], typer.Argument(help="Models side by side: catalog names, checkpoint directories or PREFIX:PATH.")],
    task: Annotated[str, typer.Option("--task", "-t", help="passkey, a RULER task (niah_single_1, ...) or ppl.")] = "passkey",
    plot: Annotated[Optional[Path], typer.Option(help="PNG of models x lengths, each cell coloured by its score with the number written in it (default: beside the folder holding the results, never inside it, so Parquet readers meet only data: results-passkey.png for --out results, results-main-passkey.png for --out results/main; `bamctl plot curves` draws lines).")] = None,
    threshold: opt.Threshold = 0.9,
    baseline: Annotated[Optional[str], typer.Option(help="The model every other is tested against at each length, on the samples both ran: a paired sign-flip test over the independent draws (passkey keys, RULER draws, documents; every flip enumerated up to 13 draws; the exact McNemar test when each draw is one 0/1 prompt), Holm over lengths. Default: the first model.")] = None,
    *,
    samples,
    prompt,
    evaluation,
) -> None:
    """Run several models on identical samples and show them side by side, with an effective-length row.

    Cells are accuracy with a 95% Wilson interval over the cell's independent draws (the
    5 depths of a passkey index share one key; perplexity for ppl); the best model per
    length is highlighted; "effective length" is the longest length up to which every
    tested length reaches --threshold, and its multiple of the model's training length;
    "certified" asks the same of the Wilson lower bound. Each model is tested against
    --baseline at each length: ▲/▼ mark a significant difference. Perplexity is compared
    only between models that score the same token ids.

    Example: bamctl compare rope alibi bam --task passkey --lengths 128..8k --seed 0,1 --baseline alibi
    """
    names = _model_names(models)
    if baseline is not None:
        check_baseline(baseline, names)

    run_models(
        models,
        AskedRequests([task], samples, prompt),
        evaluation,
        prompt,
        threshold=threshold,
        plot=plot_path(evaluation.out, plot, task),
        baseline=baseline or names[0],
    )

