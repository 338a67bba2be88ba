"""Evaluation commands: ``passkey``, ``ruler``, ``ppl`` and ``compare``.

Each parses its options into a ``TaskRequest``, opens the back-ends, runs
``bamctl.evaluate.Evaluation`` with a progress bar on stderr, and prints the summary
of the rows it covers (stdout; ``--json`` for scripts).
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


def _engine_options(device, dtype, chunk_size, attention, tokenizer, beyond_max, chat_template, tensor_parallel):
    from bamctl.backends import RunOptions

    return RunOptions(
        device=None if device == "auto" else device, dtype=None if dtype == "auto" else dtype,
        chunk_size=None if chunk_size == 2048 else chunk_size, attention=None if attention == "auto" else attention,
        tokenizer=tokenizer, beyond_max=None if beyond_max == "warn" else beyond_max, chat_template=chat_template,
        tensor_parallel=None if tensor_parallel == 1 else tensor_parallel,
    )


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
    models: list[str],
    build_request,
    *,
    engine,
    out: Path,
    force: bool,
    quiet: bool,
    json_output: bool,
    threshold: float = 0.9,
    plot: Path | None = None,
    shard: str | None = None,
):
    """Evaluate every model on the request ``build_request(train_lengths)`` returns; print the summary."""
    from bamctl.backends import open_backend
    from bamctl.evaluate import Evaluation, new_run_id, parse_shard
    from bamctl.results.store import ResultStore

    shard_of = parse_shard(shard)
    store = ResultStore(out)
    store.ensure_writable()
    names = _model_names(models)
    backends = [open_backend(model, engine) for model in models]
    request = build_request([b.info.train_length for b in backends])
    run_id = new_run_id()
    evaluations = [Evaluation(b, request, store, model_name=name, run_id=run_id) for b, name in zip(backends, names)]
    with _progress(quiet) as progress:
        for evaluation, name in zip(evaluations, names):
            total = -(-(evaluation.count() - shard_of[0]) // shard_of[1])  # this shard's share
            bar = progress.add_task(f"{request.task} {name}", total=total, rate="")
            tokens, seconds = 0, 0.0

            def advance(row, bar=bar):
                nonlocal tokens, seconds
                tokens, seconds = tokens + row["n_tokens"], seconds + row["seconds"]
                progress.update(bar, advance=1, rate=f"{tokens / max(seconds, 1e-9):,.0f} tok/s")

            stats = evaluation.run(force=force, on_row=advance, shard=shard_of)
            progress.update(bar, completed=progress.tasks[bar].total)
            if stats.skipped:
                stderr.print(f"{name}: {stats.skipped} samples already in {out}, skipped (--force recomputes)")
    _report(store, request, backends, names, json_output=json_output, threshold=threshold, plot=plot)


def _model_names(models: list[str]) -> list[str]:
    names = [m.rstrip("/").split("/")[-1] for m in models]
    return [m if names.count(n) > 1 else n for n, m in zip(names, models)]


def _report(store, request, backends, names, *, json_output: bool, threshold: float, plot: Path | None) -> None:
    import json

    from bamctl.results.render import render_summaries, summaries_to_json
    from bamctl.results.summary import summarize

    frame = store.read(task=request.task)
    frame = frame[
        frame["model_hash"].isin([b.info.model_hash for b in backends])
        & frame["model"].isin(names)
        & frame["length"].isin(request.lengths)
        & frame["seed"].isin(request.seeds)
        & (frame["sample"] < request.samples)
    ]
    if request.variant is not None or request.spec.variant:
        frame = frame[frame["variant"] == request.spec.variant]
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


@app.command()
def passkey(
    model: Annotated[str, typer.Argument(help="Catalog name, checkpoint directory, or PREFIX:PATH (hf:, bam:, vllm:).")],
    lengths: opt.Lengths = None,
    samples: opt.Samples = None,
    seed: opt.Seeds = "0",
    depths: opt.Depths = None,
    protocol: Annotated[str, typer.Option(help="authors (teacher-forced 5 digits, no newlines) or landmark (newlines, generate 10 tokens, first integer).")] = "authors",
    device: opt.Device = "auto",
    dtype: opt.Dtype = "auto",
    chunk_size: opt.ChunkSize = 2048,
    attention: opt.Attention = "auto",
    tokenizer: opt.Tokenizer = None,
    beyond_max: opt.BeyondMax = "warn",
    chat_template: opt.ChatTemplate = False,
    tensor_parallel: opt.TensorParallel = 1,
    out: opt.Out = opt.DEFAULT_OUT,
    force: opt.Force = False,
    shard: opt.Shard = None,
    quiet: opt.Quiet = False,
    json_output: opt.Json = False,
) -> None:
    """Passkey retrieval: a 5-digit key hidden at several depths in filler, prompts of exact token length.

    Example: bamctl passkey bam-ssmax --lengths 512..32k --samples 4 --depths 5 --seed 0,1
    """
    from bamctl.evaluate import TaskRequest

    run_models(
        [model],
        lambda train: TaskRequest("passkey", _lengths(lengths, train), samples or DEFAULT_SAMPLES["passkey"], _seeds(seed), _depths(depths), variant=protocol),
        engine=_engine_options(device, dtype, chunk_size, attention, tokenizer, beyond_max, chat_template, tensor_parallel),
        out=out, force=force, quiet=quiet, json_output=json_output, shard=shard,
    )


@app.command()
def ruler(
    model: Annotated[str, typer.Argument(help="Catalog name, checkpoint directory, or PREFIX:PATH (hf:, bam:, vllm:).")],
    task: Annotated[str, typer.Option("--task", "-t", help="RULER NIAH variants, comma separated: niah_single_1,2,3, niah_multikey_1,2,3, niah_multivalue, niah_multiquery.")] = "niah_single_1",
    lengths: opt.Lengths = None,
    samples: opt.Samples = None,
    seed: opt.Seeds = "0",
    depths: opt.Depths = None,
    device: opt.Device = "auto",
    dtype: opt.Dtype = "auto",
    chunk_size: opt.ChunkSize = 2048,
    attention: opt.Attention = "auto",
    tokenizer: opt.Tokenizer = None,
    beyond_max: opt.BeyondMax = "warn",
    chat_template: opt.ChatTemplate = False,
    tensor_parallel: opt.TensorParallel = 1,
    out: opt.Out = opt.DEFAULT_OUT,
    force: opt.Force = False,
    shard: opt.Shard = None,
    quiet: opt.Quiet = False,
    json_output: opt.Json = False,
) -> None:
    """RULER needle-in-a-haystack: greedy generation (128-token budget) scored by string_match_all/part.

    Example: bamctl ruler bam-ssmax --task niah_single_1,niah_multikey_1 --lengths 1k..8k --samples 20
    """
    from bamctl.evaluate import TaskRequest

    for name in [t.strip() for t in task.split(",") if t.strip()]:
        run_models(
            [model],
            lambda train, name=name: TaskRequest(name, _lengths(lengths, train), samples or RULER_DEFAULT_SAMPLES, _seeds(seed), _depths(depths)),
            engine=_engine_options(device, dtype, chunk_size, attention, tokenizer, beyond_max, chat_template, tensor_parallel),
            out=out, force=force, quiet=quiet, json_output=json_output, shard=shard,
        )


@app.command()
def ppl(
    model: Annotated[str, typer.Argument(help="Catalog name, checkpoint directory, or PREFIX:PATH (hf:, bam:, vllm:).")],
    lengths: opt.Lengths = None,
    mode: Annotated[str, typer.Option(help="sliding: windows of each length over one document; buckets: one pass, mean NLL per position bucket.")] = "sliding",
    stride: Annotated[Optional[int], typer.Option(help="sliding: tokens the window advances (default: the window, non-overlapping; 1 = strict sliding).")] = None,
    bucket: Annotated[int, typer.Option(help="buckets: positions per bucket.")] = 1024,
    doc_tokens: Annotated[Optional[int], typer.Option(help="sliding: document length in tokens (default: the largest length).")] = None,
    corpus: Annotated[Optional[Path], typer.Option(help="UTF-8 text file to score instead of the shipped public-domain corpus.")] = None,
    samples: opt.Samples = None,
    seed: opt.Seeds = "0",
    device: opt.Device = "auto",
    dtype: opt.Dtype = "auto",
    chunk_size: opt.ChunkSize = 2048,
    attention: opt.Attention = "auto",
    tokenizer: opt.Tokenizer = None,
    beyond_max: opt.BeyondMax = "warn",
    chat_template: opt.ChatTemplate = False,
    tensor_parallel: opt.TensorParallel = 1,
    out: opt.Out = opt.DEFAULT_OUT,
    force: opt.Force = False,
    shard: opt.Shard = None,
    quiet: opt.Quiet = False,
    json_output: opt.Json = False,
) -> None:
    """Perplexity: every token scored exactly once with up to L tokens of context (sliding), or per position bucket.

    Example: bamctl ppl bam-ssmax --lengths 512..8k --mode sliding --stride 256
    """
    from bamctl.evaluate import TaskRequest

    if mode not in ("sliding", "buckets"):
        raise BamctlError(f"--mode must be sliding or buckets, not {mode!r}")
    if corpus is not None and not corpus.is_file():
        raise BamctlError(f"--corpus {corpus} is not a file")
    run_models(
        [model],
        lambda train: TaskRequest(
            "ppl", _lengths(lengths, train), samples or DEFAULT_SAMPLES["ppl"], _seeds(seed),
            options={"corpus_path": str(corpus)} if corpus else {}, ppl_mode=mode, stride=stride, bucket=bucket, doc_tokens=doc_tokens,
        ),
        engine=_engine_options(device, dtype, chunk_size, attention, tokenizer, beyond_max, chat_template, tensor_parallel),
        out=out, force=force, quiet=quiet, json_output=json_output, shard=shard,
    )


@app.command()
def compare(
    models: Annotated[list[str], typer.Argument(help="Models side by side: catalog names, checkpoint directories or PREFIX:PATH.")],
    task: Annotated[str, typer.Option("--task", "-t", help="passkey, a RULER variant (niah_single_1, ...) or ppl.")] = "passkey",
    lengths: opt.Lengths = None,
    samples: opt.Samples = None,
    seed: opt.Seeds = "0",
    depths: opt.Depths = None,
    plot: Annotated[Optional[Path], typer.Option(help="PNG of score against length, one line per model (default: OUT/compare-TASK.png).")] = None,
    threshold: opt.Threshold = 0.9,
    device: opt.Device = "auto",
    dtype: opt.Dtype = "auto",
    chunk_size: opt.ChunkSize = 2048,
    attention: opt.Attention = "auto",
    tokenizer: opt.Tokenizer = None,
    beyond_max: opt.BeyondMax = "warn",
    chat_template: opt.ChatTemplate = False,
    tensor_parallel: opt.TensorParallel = 1,
    out: opt.Out = opt.DEFAULT_OUT,
    force: opt.Force = False,
    shard: opt.Shard = None,
    quiet: opt.Quiet = False,
    json_output: opt.Json = False,
) -> None:
    """Run several models on identical samples and show them side by side, with an effective-length row.

    Cells are accuracy with a 95% Wilson interval (perplexity for ppl); the best model
    per length is highlighted; "effective length" is the longest length at or above
    --threshold, and its multiple of the model's training length.

    Example: bamctl compare rope alibi bam --task passkey --lengths 128..8k --seed 0,1
    """
    from bamctl.evaluate import TaskRequest

    default_samples = DEFAULT_SAMPLES.get(task, RULER_DEFAULT_SAMPLES)
    run_models(
        models,
        lambda train: TaskRequest(task, _lengths(lengths, train), samples or default_samples, _seeds(seed), _depths(depths)),
        engine=_engine_options(device, dtype, chunk_size, attention, tokenizer, beyond_max, chat_template, tensor_parallel),
        out=out, force=force, quiet=quiet, json_output=json_output, shard=shard, threshold=threshold,
        plot=plot or out / f"compare-{task}.png",
    )
