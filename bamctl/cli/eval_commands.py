"""Evaluation commands: ``passkey``, ``ruler``, ``ppl`` and ``compare``.

Each turns its options into ``TaskRequest``\\ s, opens the back-ends, runs
``bamctl.evaluate.Evaluation`` with a progress bar on stderr, and prints the summary
of exactly the rows it covers (stdout; ``--json``: one document per invocation).
The options they share are declared once, in ``bamctl.cli.options``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from bamctl.cli import options as opt
from bamctl.cli.app import app
from bamctl.errors import BamctlError

# Tables to a pipe or file keep their full width instead of being cut at 80 columns.
stdout = Console(highlight=False, width=None if sys.stdout.isatty() else 1000)
stderr = Console(stderr=True, highlight=False)

DEFAULT_SAMPLES = {"passkey": 4, "ppl": 1}  # passkey: x 5 default depths = 20 per length
RULER_DEFAULT_SAMPLES = 20
RULER_PROTOCOL = "ruler"  # the protocol of every RULER task in bamctl/data/tasks/ruler.toml
ALL_TASKS = "all"  # --task all: every RULER task
PERPLEXITY_SCORING = "nll"  # the scoring kind of perplexity samples (bamctl.evaluate.ANSWERS)


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise BamctlError(f"--seed takes integers, e.g. 0 or 0,1 (got {text!r})") from None
    if not seeds:
        raise BamctlError("--seed needs at least one integer")
    return seeds


def _run_options(ev) -> "RunOptions":  # noqa: F821 - bamctl.backends, imported lazily
    from bamctl.backends import RunOptions

    return RunOptions(
        device=ev.device, dtype=ev.dtype, chunk_size=ev.chunk_size, attention=ev.attention, tokenizer=ev.tokenizer,
        beyond_max=ev.beyond_max, chat_template=ev.chat_template, tensor_parallel=ev.tensor_parallel,
        bos=ev.bos, prior_form=None if ev.prior_form is None else ev.prior_form.replace("-", "_"),
        rope_scaling=ev.rope_scaling, rope_factor=ev.rope_factor,
    )


def _task_options(task: str, ev, perplexity=None, ruler=None) -> dict:
    """Generator options from the perplexity and RULER groups, each for its own tasks only."""
    from bamctl.tasks import get_task

    spec = get_task(task)
    is_ruler = spec.protocol == RULER_PROTOCOL
    options = {}
    for group, applies, what in ((perplexity, spec.generator == "ppl", "--task ppl"), (ruler, is_ruler, "RULER's tasks")):
        given = {name: value for name, value in vars(group).items() if value is not None} if group is not None else {}
        if given and not applies:
            raise BamctlError(f"--{next(iter(given)).replace('_', '-')} applies to {what} only")
        options.update(given)
    if ev.chat_template:
        if not is_ruler:
            raise BamctlError("--chat-template applies to RULER's tasks, whose answer prefix opens the assistant turn")
        options["chat_template"] = True
    for option, key in (("corpus", "corpus_path"), ("haystack", "haystack_path")):
        if option in options:
            path = options.pop(option)
            if not path.is_file():
                raise BamctlError(f"--{option} {path} is not a file")
            options[key] = str(path)
    return options


def _progress(quiet: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=stderr,
        disable=quiet or not sys.stderr.isatty(),
        transient=False,
    )


def run_models(
    models: list[str], requests_for, ev, *, threshold: float = 0.9, plot: Path | None = None, baseline: str | None = None
) -> None:
    """Evaluate every model on each request ``requests_for(train_lengths, seeds)`` returns; print one summary.

    Everything is checked before the first model loads: options, seeds, shard, model
    references and their back-ends, task names and protocols, and the plans. Models are
    then opened one at a time and released before the next; each back-end checks its
    longest request (memory, ``--beyond-max``) before its first sample.
    """
    import gc

    from bamctl.backends import open_backend, peek_backend
    from bamctl.evaluate import Evaluation, new_run_id, parse_shard
    from bamctl.results.store import ResultStore
    from bamctl.tokenizer import get_tokenizer

    shard_of = parse_shard(ev.shard)
    seeds = _seeds(ev.seed)
    run = _run_options(ev)
    if run.device is not None:
        from bamctl.devices import resolve_device

        resolve_device(run.device)
    peeks = [peek_backend(model, run) for model in models]
    requests = requests_for([p.train_length for p in peeks], seeds)
    # Options, protocols and plans checked now; what depends on each model's tokenizer, when it loads.
    plans = [request.plan(get_tokenizer("gpt2"), check_tokenizer=False) for request in requests]
    for request in requests:
        _refuse_beyond_max(request, models, peeks, run)
    if any(plan.spec.scoring == PERPLEXITY_SCORING for plan in plans):
        _refuse_mixed_vocabularies(_model_names(models), peeks)
    if not ev.lengths:
        _say_planned_lengths(requests, plans, peeks)
    store = ResultStore(ev.out)
    store.ensure_writable()
    if ev.quiet:
        _quiet_external_libraries()
    names = _model_names(models)
    run_id = new_run_id()
    covered, names_by_hash, prompts = set(), {}, {}
    with _progress(ev.quiet) as progress:
        for model, name in zip(models, names):
            backend = open_backend(model, run)
            names_by_hash[backend.info.model_hash] = name
            evaluations = [Evaluation(backend, request, store, model_name=name, run_id=run_id) for request in requests]
            covered |= _evaluate_model(evaluations, name, progress, ev, shard_of, prompts)
            del backend, evaluations  # one model in memory at a time
            gc.collect()
    _report(store, covered, names_by_hash, names, json_output=ev.json, threshold=threshold, plot=plot, baseline=baseline)


def _evaluate_model(evaluations, name: str, progress, ev, shard_of, prompts: dict) -> set:
    """Check every request of one model before its first sample, then run them; the keys they cover."""
    for evaluation in evaluations:
        evaluation.preflight()
        _note_other_prompts(prompts, evaluation, name)
    covered = set()
    for evaluation in evaluations:
        covered |= evaluation.keys()
        _run_one(evaluation, name, progress, ev, shard_of)
    return covered


def _run_one(evaluation, name: str, progress, ev, shard_of) -> None:
    bar = progress.add_task(f"{evaluation.request.task} {name}", total=evaluation.count(shard_of), rate="")
    tokens, seconds = 0, 0.0

    def advance(row):
        nonlocal tokens, seconds
        tokens, seconds = tokens + row["n_tokens"], seconds + row["seconds"]
        progress.update(bar, advance=1, rate=f"{tokens / max(seconds, 1e-9):,.0f} tok/s")

    stats = evaluation.run(force=ev.force, on_row=advance, shard=shard_of, checked=True)
    progress.update(bar, completed=progress.tasks[bar].total)
    if stats.skipped:
        stderr.print(f"{name}: {stats.skipped} samples already in {ev.out}, skipped (--force recomputes)", soft_wrap=True)


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
    different weights: ``name@hash8``) must say which."""
    from bamctl.errors import did_you_mean

    if baseline in models:
        return
    shared = [m for m in models if m.startswith(f"{baseline}@")]
    if len(shared) > 1:
        raise BamctlError(f"--baseline {baseline} names {len(shared)} models with different weights; pass one of {', '.join(shared)}")
    raise BamctlError(f"--baseline {baseline} is not one of the models compared{did_you_mean(baseline, models)}")


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


def _report(store, covered: set, names_by_hash: dict[str, str], names: list[str], *, json_output: bool, threshold: float,
            plot: Path | None, baseline: str | None = None) -> None:
    """Summaries of exactly the stored rows this invocation asked for, as one table set or JSON document.

    Rows are found by weights (model hash) and prompt, and shown under this invocation's names: a
    checkpoint folder renamed since its rows were stored still finds them.
    """
    import json

    from bamctl.results.render import render_summaries, summaries_to_json
    from bamctl.results.schema import row_key
    from bamctl.results.summary import summarize

    frame = store.read()
    mine = [row_key(row) in covered and row["model_hash"] in names_by_hash for row in frame.to_dict("records")]
    frame = frame[mine].copy() if len(frame) else frame
    if len(frame):
        frame["model"] = frame["model_hash"].map(names_by_hash)
    if frame.empty:  # e.g. a shard that drew no sample
        stderr.print("no result rows for this request yet")
        return
    summaries = summarize(frame, threshold=threshold, models=names, baseline=baseline)
    if json_output:
        typer.echo(json.dumps(summaries_to_json(summaries), indent=2))
    else:
        stdout.print(render_summaries(summaries))
    if plot is not None:
        from bamctl.results.plots import plot_grid

        path = plot_grid(frame, plot, models=names, threshold=threshold, baseline=baseline)
        stderr.print(f"plot written to {path}")


def _lengths(spec: str | None, train_lengths: list[int]) -> list[int]:
    from bamctl.evaluate import default_lengths
    from bamctl.lengths import parse_lengths

    return parse_lengths(spec) if spec else default_lengths(train_lengths)


def _depths(spec: str | None):
    from bamctl.lengths import parse_depths

    return parse_depths(spec) if spec else None


def _request(task: str, ev, train_lengths, seeds, *, depths=None, protocol=None, options=None, samples=None):
    from bamctl.evaluate import TaskRequest

    count = ev.samples or samples or DEFAULT_SAMPLES.get(task, RULER_DEFAULT_SAMPLES)
    return TaskRequest(task, _lengths(ev.lengths, train_lengths), count, seeds, _depths(depths), protocol, options or {})


def _taken_options(options: dict[str, dict]) -> dict[str, dict]:
    """Each task's options less those its generator does not take (``--haystack`` goes to the NIAH
    tasks of ``--task all``, not to vt); an option no task asked for takes is refused."""
    from bamctl.tasks import get_task

    taken = {name: get_task(name).options() for name in options}
    for key in {key for given in options.values() for key in given}:
        if not any(key in taken[name] for name in options):
            flag = {"haystack_path": "haystack"}.get(key, key).replace("_", "-")
            raise BamctlError(f"--{flag} applies to none of the tasks asked for ({', '.join(options)})")
    return {name: {k: v for k, v in given.items() if k in taken[name]} for name, given in options.items()}


def _depths_by_task(names: list[str], depths: str | None) -> dict[str, str | None]:
    """``--depths`` for each task: with several tasks (``--task all``) it goes to those that hide one
    needle and let it be placed; one task that does not take it, or none among several, is refused."""
    from bamctl.tasks import get_task

    if depths is None or len(names) == 1:
        return {name: depths for name in names}
    placed = {name: depths if get_task(name).takes_depths() else None for name in names}
    if not any(placed.values()):
        raise BamctlError(f"--depths applies to none of the tasks asked for ({', '.join(names)})")
    return placed


def _task_names(text: str) -> list[str]:
    """Comma-separated task names, every one checked before any work; ``all`` stands for every RULER task."""
    from bamctl.tasks import get_task, task_names

    names = []
    for name in (t.strip() for t in text.split(",") if t.strip()):
        expanded = [t for t in task_names() if get_task(t).protocol == RULER_PROTOCOL] if name == ALL_TASKS else [name]
        names += [t for t in expanded if t not in names]
    if not names:
        raise BamctlError("--task needs at least one task name")
    for name in names:
        get_task(name)
    return names


@app.command()
@opt.with_options("evaluation")
def passkey(
    model: opt.ModelArgument,
    depths: opt.Depths = None,
    protocol: Annotated[opt.PasskeyProtocol, typer.Option(help="auto (authors where the model's tokenizer can score it, else exact), authors (the BAM authors' evaluator, token for token), exact (bamctl's exact-length, digit-by-digit form for byte-level BPEs like GPT-2) or landmark (newlines, generate 10 tokens, first integer).")] = opt.PasskeyProtocol.auto,
    *,
    evaluation,
) -> None:
    """Passkey retrieval: a 5-digit key hidden at several depths in filler, prompts of exact token length.

    Example: bamctl passkey bam-ssmax --lengths 512..32k --samples 4 --depths 5 --seed 0,1
    """
    _task_options("passkey", evaluation)  # refuses what applies to other tasks (--chat-template)
    run_models(
        [model],
        lambda train, seeds: [_request("passkey", evaluation, train, seeds, depths=depths, protocol=protocol.value)],
        evaluation,
    )


@app.command()
@opt.with_options("evaluation", "ruler")
def ruler(
    model: opt.ModelArgument,
    task: Annotated[str, typer.Option("--task", "-t", help="RULER tasks, comma separated: niah_single_1,2,3, niah_multikey_1,2,3, niah_multivalue, niah_multiquery, vt, cwe, fwe; all: every one of them.")] = "niah_single_1",
    depths: opt.Depths = None,
    *,
    evaluation,
    ruler,
) -> None:
    """RULER's synthetic tasks: needle in a haystack, variable tracking (vt), common and frequent words
    extraction (cwe, fwe); greedy generation within the length, scored by string_match_all.

    Example: bamctl ruler bam-ssmax --task niah_single_1,vt,cwe,fwe --lengths 1k..8k --samples 20
    """
    names = _task_names(task)
    options = _taken_options({name: _task_options(name, evaluation, ruler=ruler) for name in names})
    placed = _depths_by_task(names, depths)
    run_models(
        [model],
        lambda train, seeds: [
            _request(name, evaluation, train, seeds, depths=placed[name], samples=RULER_DEFAULT_SAMPLES, options=options[name])
            for name in names
        ],
        evaluation,
    )


@app.command()
@opt.with_options("evaluation", "perplexity")
def ppl(
    model: opt.ModelArgument,
    protocol: Annotated[opt.PplProtocol, typer.Option("--protocol", "--mode", help="sliding: windows of each length over one document; buckets: one pass, mean NLL per position bucket.")] = opt.PplProtocol.sliding,
    *,
    evaluation,
    perplexity,
) -> None:
    """Perplexity: every token scored exactly once with up to L tokens of context (sliding), or per position bucket.

    Example: bamctl ppl bam-ssmax --lengths 512..8k --protocol sliding --stride 256
    """
    options = _task_options("ppl", evaluation, perplexity=perplexity)
    run_models(
        [model],
        lambda train, seeds: [_request("ppl", evaluation, train, seeds, protocol=protocol.value, options=options)],
        evaluation,
    )


@app.command()
@opt.with_options("evaluation", "perplexity", "ruler")
def compare(
    models: Annotated[list[str], typer.Argument(help="Models side by side: catalog names, checkpoint directories or PREFIX:PATH.")],
    task: Annotated[str, typer.Option("--task", "-t", help="passkey, a RULER task (niah_single_1, ...) or ppl.")] = "passkey",
    protocol: Annotated[Optional[str], typer.Option(help="The task's protocol: passkey auto|authors|exact|landmark, ppl sliding|buckets (default: the task's).")] = None,
    depths: opt.Depths = None,
    plot: Annotated[Optional[Path], typer.Option(help="PNG of models x lengths, each cell coloured by its score with the number written in it (default: OUT-TASK.png beside the results directory, which stays a plain Parquet dataset; `bamctl plot curves` draws lines).")] = None,
    threshold: opt.Threshold = 0.9,
    baseline: Annotated[Optional[str], typer.Option(help="The model every other is tested against at each length, on the samples both ran (McNemar for 0/1 scores, paired permutation otherwise; Holm over lengths). Default: the first model.")] = None,
    *,
    evaluation,
    perplexity,
    ruler,
) -> None:
    """Run several models on identical samples and show them side by side, with an effective-length row.

    Cells are accuracy with a 95% Wilson interval (perplexity for ppl); the best model
    per length is highlighted; "effective length" is the longest length up to which every
    tested length reaches --threshold, and its multiple of the model's training length;
    "certified" asks the same of the Wilson lower bound. Each model is tested against
    --baseline at each length: ▲/▼ mark a significant difference. Perplexity is compared
    only between models that score the same token ids.

    Example: bamctl compare rope alibi bam --task passkey --lengths 128..8k --seed 0,1 --baseline alibi
    """
    from bamctl.tasks import get_task

    names = _model_names(models)
    if baseline is not None:
        check_baseline(baseline, names)

    get_task(task, protocol)
    options = _task_options(task, evaluation, perplexity=perplexity, ruler=ruler)
    run_models(
        models,
        lambda train, seeds: [_request(task, evaluation, train, seeds, depths=depths, protocol=protocol, options=options)],
        evaluation,
        threshold=threshold,
        plot=beside(evaluation.out, plot, task),
        baseline=baseline or names[0],
    )


def beside(results: Path, plot: Path | None, name: str) -> Path:
    """Where a plot of a results directory goes: ``--plot``, or ``DIR-NAME.png`` next to it; never
    inside it, so the directory stays a Parquet dataset any reader opens as it is."""
    path = plot if plot is not None else results.parent / f"{results.name}-{name}.png"
    if path.resolve().is_relative_to(results.resolve()):
        raise BamctlError(f"--plot {path} is inside the results directory {results}; put it beside it (a results directory holds Parquet files only)")
    return path
