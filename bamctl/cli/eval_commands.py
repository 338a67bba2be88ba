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
    )


def _task_options(task: str, perplexity) -> dict:
    """Generator options from the perplexity group; they apply to ppl only."""
    values = {"corpus_path": perplexity.corpus, "stride": perplexity.stride, "bucket": perplexity.bucket, "doc_tokens": perplexity.doc_tokens}
    if task != "ppl":
        given = [name for name, value in vars(perplexity).items() if value is not None]
        if given:
            raise BamctlError(f"--{given[0].replace('_', '-')} applies to --task ppl only")
        return {}
    if perplexity.corpus is not None:
        if not perplexity.corpus.is_file():
            raise BamctlError(f"--corpus {perplexity.corpus} is not a file")
        values["corpus_path"] = str(perplexity.corpus)
    return values


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


def run_models(models: list[str], requests_for, ev, *, threshold: float = 0.9, plot: Path | None = None) -> None:
    """Evaluate every model on each request ``requests_for(train_lengths)`` returns; print one summary."""
    from bamctl.backends import open_backend
    from bamctl.evaluate import Evaluation, new_run_id, parse_shard
    from bamctl.results.store import ResultStore

    shard_of = parse_shard(ev.shard)
    seeds = _seeds(ev.seed)
    store = ResultStore(ev.out)
    store.ensure_writable()
    names = _model_names(models)
    backends = [open_backend(model, _run_options(ev)) for model in models]
    requests = requests_for([b.info.train_length for b in backends], seeds)
    run_id = new_run_id()
    covered, hashes = set(), {b.info.model_hash for b in backends}
    with _progress(ev.quiet) as progress:
        for request in requests:
            for backend, name in zip(backends, names):
                evaluation = Evaluation(backend, request, store, model_name=name, run_id=run_id)
                covered |= evaluation.keys()
                bar = progress.add_task(f"{request.task} {name}", total=evaluation.count(shard_of), rate="")
                tokens, seconds = 0, 0.0

                def advance(row, bar=bar):
                    nonlocal tokens, seconds
                    tokens, seconds = tokens + row["n_tokens"], seconds + row["seconds"]
                    progress.update(bar, advance=1, rate=f"{tokens / max(seconds, 1e-9):,.0f} tok/s")

                stats = evaluation.run(force=ev.force, on_row=advance, shard=shard_of)
                progress.update(bar, completed=progress.tasks[bar].total)
                if stats.skipped:
                    stderr.print(f"{name}: {stats.skipped} samples already in {ev.out}, skipped (--force recomputes)")
    _report(store, covered, hashes, names, json_output=ev.json, threshold=threshold, plot=plot)


def _model_names(models: list[str]) -> list[str]:
    names = [m.rstrip("/").split("/")[-1] for m in models]
    return [m if names.count(n) > 1 else n for n, m in zip(names, models)]


def _report(store, covered: set, hashes: set, names: list[str], *, json_output: bool, threshold: float, plot: Path | None) -> None:
    """Summaries of exactly the stored rows this invocation asked for, as one table set or JSON document."""
    import json

    from bamctl.results.render import render_summaries, summaries_to_json
    from bamctl.results.schema import row_key
    from bamctl.results.summary import summarize

    frame = store.read()
    mine = [row_key(row) in covered and row["model"] in names for row in frame.to_dict("records")]
    frame = frame[mine] if len(frame) else frame
    frame = frame[frame["model_hash"].isin(hashes)] if len(frame) else frame
    if frame.empty:  # e.g. a shard that drew no sample
        stderr.print("no result rows for this request yet")
        return
    summaries = summarize(frame, threshold=threshold, models=names)
    if json_output:
        typer.echo(json.dumps(summaries_to_json(summaries), indent=2))
    else:
        stdout.print(render_summaries(summaries))
    if plot is not None:
        from bamctl.results.plots import plot_curves

        path = plot_curves(frame, plot, models=names, threshold=threshold)
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


def _task_names(text: str) -> list[str]:
    """Comma-separated task names, every one checked before any work."""
    from bamctl.tasks import get_task

    names = [t.strip() for t in text.split(",") if t.strip()]
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
    protocol: Annotated[opt.PasskeyProtocol, typer.Option(help="authors (teacher-forced 5 digits, no newlines) or landmark (newlines, generate 10 tokens, first integer).")] = opt.PasskeyProtocol.authors,
    *,
    evaluation,
) -> None:
    """Passkey retrieval: a 5-digit key hidden at several depths in filler, prompts of exact token length.

    Example: bamctl passkey bam-ssmax --lengths 512..32k --samples 4 --depths 5 --seed 0,1
    """
    run_models(
        [model],
        lambda train, seeds: [_request("passkey", evaluation, train, seeds, depths=depths, protocol=protocol.value)],
        evaluation,
    )


@app.command()
@opt.with_options("evaluation")
def ruler(
    model: opt.ModelArgument,
    task: Annotated[str, typer.Option("--task", "-t", help="RULER NIAH tasks, comma separated: niah_single_1,2,3, niah_multikey_1,2,3, niah_multivalue, niah_multiquery.")] = "niah_single_1",
    depths: opt.Depths = None,
    *,
    evaluation,
) -> None:
    """RULER needle-in-a-haystack: greedy generation (128-token budget) scored by string_match_all/part.

    Example: bamctl ruler bam-ssmax --task niah_single_1,niah_multikey_1 --lengths 1k..8k --samples 20
    """
    names = _task_names(task)
    run_models(
        [model],
        lambda train, seeds: [_request(name, evaluation, train, seeds, depths=depths, samples=RULER_DEFAULT_SAMPLES) for name in names],
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
    options = _task_options("ppl", perplexity)
    run_models(
        [model],
        lambda train, seeds: [_request("ppl", evaluation, train, seeds, protocol=protocol.value, options=options)],
        evaluation,
    )


@app.command()
@opt.with_options("evaluation", "perplexity")
def compare(
    models: Annotated[list[str], typer.Argument(help="Models side by side: catalog names, checkpoint directories or PREFIX:PATH.")],
    task: Annotated[str, typer.Option("--task", "-t", help="passkey, a RULER task (niah_single_1, ...) or ppl.")] = "passkey",
    protocol: Annotated[Optional[str], typer.Option(help="The task's protocol: passkey authors|landmark, ppl sliding|buckets (default: the task's).")] = None,
    depths: opt.Depths = None,
    plot: Annotated[Optional[Path], typer.Option(help="PNG of score against length, one line per model (default: OUT/compare-TASK.png).")] = None,
    threshold: opt.Threshold = 0.9,
    *,
    evaluation,
    perplexity,
) -> None:
    """Run several models on identical samples and show them side by side, with an effective-length row.

    Cells are accuracy with a 95% Wilson interval (perplexity for ppl); the best model
    per length is highlighted; "effective length" is the longest length at or above
    --threshold, and its multiple of the model's training length.

    Example: bamctl compare rope alibi bam --task passkey --lengths 128..8k --seed 0,1
    """
    from bamctl.tasks import get_task

    get_task(_task_names(task)[0] if "," not in task else task, protocol)
    options = _task_options(task, perplexity)
    run_models(
        models,
        lambda train, seeds: [_request(task, evaluation, train, seeds, depths=depths, protocol=protocol, options=options)],
        evaluation,
        threshold=threshold,
        plot=plot or evaluation.out / f"compare-{task}.png",
    )
