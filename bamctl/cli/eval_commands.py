"""Evaluation commands: ``passkey``, ``ruler``, ``ppl`` and ``compare``.

Each turns its options into what ``bamctl.runs.runner.run_models`` takes (the run
``bamctl.evaluate`` makes too), lets it check and run everything with a progress bar on
stderr, and prints the summary of exactly the rows it covered (stdout; ``--json``: one
document per invocation). The options they share are declared once, in
``bamctl.cli.options``, and turned into requests by ``bamctl.cli.requests``, as
``generate``'s are.
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
from bamctl.cli.requests import asked_requests
from bamctl.runs.checks import check_baseline
from bamctl.runs.requests import task_names
from bamctl.runs.runner import model_names

# Tables to a pipe or file keep their full width instead of being cut at 80 columns.
stdout = Console(highlight=False, width=None if sys.stdout.isatty() else 1000)
stderr = Console(stderr=True, highlight=False)


def run_models(
    models: list[str], asked, ev, prompt, *, threshold: float = 0.9, plot: Path | None = None, baseline: str | None = None,
    metric: str = "score", relative: float | None = None, base_length: int | None = None,
) -> None:
    """Evaluate every model on the requests ``asked`` (``bamctl.runs.requests.AskedRequests``) with
    ``bamctl.runs.runner.run_models``, which checks everything before the first model loads;
    print one summary of exactly the rows asked for."""
    from dataclasses import asdict

    from bamctl.runs.runner import parse_batch_size, run_models as run, run_options

    report = {"names": model_names(models), "json": ev.json, "threshold": threshold, "plot": plot and str(plot),
              "baseline": baseline, "metric": metric, "relative": relative, "base_length": base_length}
    outcome = run(models, asked, run_options({**asdict(ev), **asdict(prompt)}), out=ev.dir,
                  batch_size=parse_batch_size(ev.batch_size),
                  force=ev.force, reuse=ev.reuse, shard=ev.shard, quiet=ev.quiet, report=report, console=stderr,
                  answer_logprob=ev.answer_logprob)
    if outcome.submitted:  # `bamctl submit` prints the whole sweep's table: no partial table or plot here
        return
    _report(outcome.rows(), outcome.names, json_output=ev.json, threshold=threshold, plot=plot, baseline=baseline,
            current_versions=outcome.versions, metric=metric, relative=relative, base_length=base_length)


def _report(frame, names: list[str], *, json_output: bool, threshold: float, plot: Path | None,
            baseline: str | None = None, current_versions: set | None = None, metric: str = "score",
            relative: float | None = None, base_length: int | None = None) -> None:
    """Summaries of the rows a run covered (``bamctl.runs.runner.covered_rows``), as one table set or JSON document."""
    import json

    from bamctl.results.render import render_summaries, summaries_to_json
    from bamctl.results.summary import summarize

    if frame.empty:  # e.g. a shard that drew no sample
        stderr.print("no result rows for this request yet")
        return
    summaries = summarize(frame, threshold=threshold, models=names, baseline=baseline, current_versions=current_versions,
                          metric=metric, relative=relative, base_length=base_length)
    if json_output:
        typer.echo(json.dumps(summaries_to_json(summaries), indent=2))
    else:
        stdout.print(render_summaries(summaries))
    if plot is not None:
        from bamctl.results.plots import plot_grid

        path = plot_grid(frame, plot, models=names, threshold=threshold, baseline=baseline, metric=metric)
        stderr.print(f"plot written to {path}")


def model_or_flagship(model: str | None, command: str) -> str:
    """The model asked for, or the command's flagship reference, named in one line on stderr."""
    from bamctl.runs.runner import model_or_flagship as chosen

    return chosen(model, command, lambda line: stderr.print(line, soft_wrap=True))


@app.command()
@opt.with_options("samples", "prompt", "evaluation", panels=())
def passkey(model: opt.ModelArgument = None, *, samples, prompt, evaluation) -> None:
    """Passkey retrieval: a 5-digit key hidden at several depths in filler, prompts of exact token length.

    Example: bamctl passkey bam-ssmax --lengths 512..32k --samples 4 --depths 5 --seed 0,1
    """
    run_models([model_or_flagship(model, "passkey")], asked_requests(["passkey"], samples, prompt), evaluation, prompt)


@app.command()
@opt.with_options("samples", "prompt", "evaluation", panels=(opt.RULER_PANEL,))
def ruler(
    model: opt.ModelArgument = None,
    task: Annotated[str, typer.Option("--task", "-t", help="RULER tasks, comma separated: niah_single_1,2,3, niah_multikey_1,2,3, niah_multivalue, niah_multiquery, vt, cwe, fwe; all: every one of them; qa_1, qa_2 with --data (e.g. --task qa_1 --data dev-v2.0.json); bamctl's facts_1, facts_2, facts_3.")] = "niah_single_1",
    *,
    samples,
    prompt,
    evaluation,
) -> None:
    """RULER's synthetic tasks: needle in a haystack, variable tracking (vt), common and frequent words
    extraction (cwe, fwe), question answering over the user's data set (qa_1, qa_2); greedy generation
    within the length, scored by string_match_all (qa: string_match_part); and bamctl's facts in a haystack
    (facts_1, facts_2, facts_3: one, two or three supporting facts; --protocol teacher_forced feeds the answer).

    Example: bamctl ruler bam-ssmax --task niah_single_1,vt,cwe,fwe --lengths 1k..8k --samples 20
    """
    run_models([model_or_flagship(model, "ruler")], asked_requests(task_names(task), samples, prompt), evaluation, prompt)


@app.command()
@opt.with_options("samples", "prompt", "evaluation", panels=(opt.PERPLEXITY_PANEL,))
def ppl(model: opt.ModelArgument = None, *, samples, prompt, evaluation) -> None:
    """Perplexity: every token scored exactly once with up to L tokens of context (sliding), or per position bucket.

    Example: bamctl ppl lm-bam --lengths 512..8k --protocol sliding --stride 256
    """
    run_models([model_or_flagship(model, "ppl")], asked_requests(["ppl"], samples, prompt), evaluation, prompt)


@app.command()
@opt.with_options("samples", "prompt", "evaluation")
def compare(
    models: Annotated[list[str], typer.Argument(help="Models side by side: catalog names, checkpoint directories or PREFIX:PATH.")],
    task: Annotated[str, typer.Option("--task", "-t", help="passkey, a RULER task (niah_single_1, ...) or ppl.")] = "passkey",
    plot: Annotated[Optional[Path], typer.Option(help="PNG of models x lengths, each cell coloured by its score with the number written in it (default: beside the folder holding the results, never inside it, so Parquet readers meet only data: results-passkey.png for --dir results, results-main-passkey.png for --dir results/main; `bamctl plot curves` draws lines).")] = None,
    threshold: opt.Threshold = 0.9,
    metric: opt.CellMetric = "score",
    relative: opt.Relative = None,
    base_length: opt.BaseLength = None,
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
    "certified" asks the same of the Wilson lower bound; --relative adds the effective length
    against each model's own score at the base length. Each model is tested against
    --baseline at each length: ▲/▼ mark a significant difference. Perplexity is compared
    only between models that score the same token ids.

    Example: bamctl compare rope alibi bam --task passkey --lengths 128..8k --seed 0,1 --baseline alibi
    """
    names = model_names(models)
    base = opt.checked_cells(metric, relative, base_length)
    if baseline is not None:
        check_baseline(baseline, names)

    run_models(
        models,
        asked_requests([task], samples, prompt),
        evaluation,
        prompt,
        threshold=threshold,
        plot=plot_path(evaluation.dir, plot, task),
        baseline=baseline or names[0],
        metric=metric,
        relative=relative,
        base_length=base,
    )

