"""Commands over stored results: ``results show``, ``results export``, ``plot curves|heatmap``, and
``results compact``, the one that rewrites files (it merges part files; rows are unchanged).

Nothing here runs a model: every number comes from the Parquet rows in a results directory.
Heavy imports (pandas, pyarrow, matplotlib) happen inside the commands, so `bamctl --help`
stays fast.
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from bamctl.cli import options as opt
from bamctl.cli.app import app
from bamctl.runs.checks import check_baseline
from bamctl.cli.plot_paths import plot_path
from bamctl.errors import BamctlError

if TYPE_CHECKING:
    import pandas as pd

results_app = typer.Typer(
    help="Read stored results: summary tables and exports for papers, without running anything.",
    no_args_is_help=True,
)
plot_app = typer.Typer(help="Draw PNG plots from stored results.", no_args_is_help=True)
app.add_typer(results_app, name="results")
app.add_typer(plot_app, name="plot")


class ExportFormat(str, Enum):
    csv = "csv"
    markdown = "markdown"
    latex = "latex"
    json = "json"


DirOption = Annotated[
    Path, typer.Option("--dir", "-d", help="Results directory to read (what a run's --dir wrote, `results` by default).")
]
TaskOption = Annotated[
    list[str] | None, typer.Option("--task", help="Only rows of this task (passkey, niah_single_1, ppl, ...); repeat for several.")
]
ModelOption = Annotated[
    list[str] | None,
    typer.Option("--model", "-m", help="Only rows of this model, by name or model-hash prefix; repeat for several (sets column order)."),
]
WhereOption = Annotated[
    str | None,
    typer.Option(help='Row filter as a pandas query over the columns of docs/SCHEMA.md, e.g. "length >= 4096 and depth < 0.5".'),
]
BaselineOption = Annotated[
    str | None,
    typer.Option(help="Test every other model against this one at each length, on the samples both ran (marks ▲/▼ and, with --json or --stats, the figures)."),
]
ThresholdOption = Annotated[
    float, typer.Option(min=0.0, max=1.0, help="Score a length must reach to count toward the effective length.")
]


def _load(directory: Path, task: list[str] | None, model: list[str] | None, where: str | None) -> pd.DataFrame:
    from bamctl.results.store import ResultStore

    store = ResultStore(directory)
    if not store.part_files():
        raise BamctlError(f"no results in {directory}; evaluate first (bamctl compare ... --dir {directory}) or pass another --dir")
    frame = store.read(task=task or None, model=model or None, where=where, strict=True)
    if frame.empty:
        raise BamctlError(f"no stored rows in {directory} match the filters")
    return frame


def _summaries(frame: pd.DataFrame, threshold: float, model: list[str] | None, baseline: str | None,
               relative: float | None = None, base_length: int | None = None, metric: str = "score") -> list:
    """The summaries of the rows, with ``--baseline`` checked against the models they show."""
    from bamctl.results.summary import summarize

    summaries = summarize(frame, threshold=threshold, models=model, baseline=baseline, relative=relative,
                          base_length=base_length, metric=metric)
    if baseline is not None:
        check_baseline(baseline, list(dict.fromkeys(m for s in summaries for m in s.models)))
    return summaries


def _stdout() -> Console:
    # Piped output is for files and scripts: never squeeze a table to 80 columns there.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 1000)


@results_app.command("show")
def show(
    directory: DirOption = Path("results"),
    task: TaskOption = None,
    model: ModelOption = None,
    where: WhereOption = None,
    threshold: ThresholdOption = 0.9,
    relative: opt.Relative = None,
    base_length: opt.BaseLength = None,
    metric: opt.CellMetric = "score",
    baseline: BaselineOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on stdout instead of tables.")] = False,
    show_engines: Annotated[bool, typer.Option("--engines", help="Under the tables, list what the rows ran on: dtype, device and attention path per model.")] = False,
    show_dropped: Annotated[bool, typer.Option("--dropped", help="Under the tables, list the samples whose prompt the back-end cut to fit the model's maximum length (hf:/vllm: at exactly that length), with how many tokens it left out.")] = False,
) -> None:
    """Print the summary table of stored rows: rows = lengths, columns = models, cells = accuracy with
    a Wilson 95% interval over the cell's independent draws (keys for passkey; perplexity for ppl),
    best per length highlighted, then the effective length.
    Rows of different dtypes are tables apart; device and attention path do not split them (--engines lists them).

    Example: bamctl results show --dir results --task passkey --where "depth <= 0.5"
    """
    from bamctl.results.provenance import dropped, engines
    from bamctl.results.render import render_summaries, summaries_to_json

    base = opt.checked_cells(metric, relative, base_length)
    frame = _load(directory, task, model, where)
    summaries = _summaries(frame, threshold, model, baseline, relative, base, metric)
    if as_json:
        document = summaries_to_json(summaries)
        if show_engines:
            document["engines"] = engines(frame).to_dict("records")
        if show_dropped:
            document["dropped"] = dropped(frame).to_dict("records")
        typer.echo(json.dumps(document, indent=2))
        return
    _stdout().print(render_summaries(summaries))
    if show_engines:
        _stdout().print(_listing("ran on", engines(frame)))
    if show_dropped:
        cut = dropped(frame)
        _stdout().print(_listing("prompts cut to fit", cut) if len(cut) else "no prompt was cut to fit a model's maximum length")


def _listing(title: str, frame: "pd.DataFrame"):
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left")
    for column in frame.columns:
        table.add_column(column, justify="left" if frame[column].dtype == object else "right")
    for row in frame.itertuples(index=False):
        table.add_row(*(Text(str(value)) for value in row))  # Text: a model named "m[hf]" is not markup
    return table


@results_app.command("compact")
def compact(directory: DirOption = Path("results")) -> None:
    """Merge a results directory's part files into one, keeping the newest row per sample.

    Each run already merges its own rows into one file when it ends; directories written by
    older versions, or by runs that were killed, may hold one file per row, which makes every
    read slower. Run it when no evaluation is writing to the directory.

    Example: bamctl results compact --dir results/main
    """
    from bamctl.results.store import ResultStore

    store = ResultStore(directory)
    before = len(store.part_files())
    if not before:
        raise BamctlError(f"no results in {directory}")
    store.compact()
    typer.echo(f"{directory}: {before} part files -> {len(store.part_files())}", err=True)


@results_app.command("export")
def export(
    fmt: Annotated[ExportFormat, typer.Option("--format", "-f", help="Output format.")] = ExportFormat.csv,
    pivot: Annotated[bool, typer.Option(help="One row per length and one column per model, instead of one row per (model, length).")] = False,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="File to write; stdout when left out.")] = None,
    directory: DirOption = Path("results"),
    task: TaskOption = None,
    model: ModelOption = None,
    where: WhereOption = None,
    threshold: ThresholdOption = 0.9,
    relative: opt.Relative = None,
    base_length: opt.BaseLength = None,
    metric: opt.CellMetric = "score",
    baseline: BaselineOption = None,
    stats: Annotated[bool, typer.Option("--stats", help="Write the paired tests against --baseline (difference, 95% interval, Holm-adjusted p) instead of the summary.")] = False,
) -> None:
    """Write the summary as CSV, Markdown (pipe table), LaTeX (tabular, booktabs) or JSON for papers.

    Example: bamctl results export --format latex --pivot --task passkey --out table.tex
    """
    from bamctl.results.export import export as export_text

    if stats and baseline is None:
        raise BamctlError("--stats needs --baseline: the model the others are tested against")
    base = opt.checked_cells(metric, relative, base_length)
    summaries = _summaries(_load(directory, task, model, where), threshold, model, baseline, relative, base, metric)
    if stats and not any(s.paired for s in summaries):
        raise BamctlError(f"--baseline {baseline} shares no samples of the same tokens with another model: no paired test to write")
    text = export_text(summaries, fmt.value, pivot=pivot, stats=stats)
    if out is None:
        typer.echo(text, nl=False)
        return
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
    except OSError as err:
        raise BamctlError(f"cannot write {out}: {err.strerror or err}") from err
    typer.echo(str(out))


@plot_app.command("curves")
def curves(
    out: Annotated[Path | None, typer.Option("--out", "-o", help="PNG file to write; default DIR-curves.png beside the results directory.")] = None,
    directory: DirOption = Path("results"),
    task: TaskOption = None,
    model: ModelOption = None,
    where: WhereOption = None,
    threshold: ThresholdOption = 0.9,
    metric: opt.CellMetric = "score",
) -> None:
    """Plot accuracy (or --metric answer_logprob) against context length (log2 axis), one line per model
    with its training length dashed, one panel per task; the plot `bamctl compare` draws, from stored rows.

    Example: bamctl plot curves --task passkey --out passkey.png
    """
    from bamctl.results.plots import plot_curves

    frame = _load(directory, task, model, where)
    typer.echo(str(plot_curves(frame, plot_path(directory, out, "curves"), models=model, threshold=threshold,
                               metric=metric)))


@plot_app.command("grid")
def grid(
    out: Annotated[Path | None, typer.Option("--out", "-o", help="PNG file to write; default DIR-grid.png beside the results directory.")] = None,
    directory: DirOption = Path("results"),
    task: TaskOption = None,
    model: ModelOption = None,
    where: WhereOption = None,
    threshold: ThresholdOption = 0.9,
    baseline: BaselineOption = None,
    metric: opt.CellMetric = "score",
) -> None:
    """Plot models × lengths with each cell's number written in it, coloured by accuracy (or by
    perplexity against the model's own at its shortest length, or by --metric answer_logprob); the
    picture `bamctl compare` draws.

    Example: bamctl plot grid --dir results/main --task passkey --baseline alibi --out passkey.png
    """
    from bamctl.results.plots import plot_grid

    frame = _load(directory, task, model, where)
    if baseline is not None:
        _summaries(frame, threshold, model, baseline)
    typer.echo(str(plot_grid(frame, plot_path(directory, out, "grid"), models=model, threshold=threshold, baseline=baseline,
                             metric=metric)))


@plot_app.command("heatmap")
def heatmap(
    out: Annotated[Path | None, typer.Option("--out", "-o", help="PNG file to write; default DIR-heatmap.png beside the results directory.")] = None,
    directory: DirOption = Path("results"),
    task: TaskOption = None,
    model: ModelOption = None,
    where: WhereOption = None,
    metric: Annotated[str, typer.Option(help="Result column to average in each cell: score (the default), correct, seconds, tokens_per_s, n_tokens, ...")] = "score",
) -> None:
    """Plot the mean score (or --metric) per needle depth × context length, one panel per model (the
    needle-in-a-haystack picture). Depths a task drew at random, as RULER's, fall into 10 bins.

    Example: bamctl plot heatmap --task niah_single_2 --metric score --out niah.png
    """
    from bamctl.results.plots import plot_heatmap

    frame = _load(directory, task, model, where)
    typer.echo(str(plot_heatmap(frame, plot_path(directory, out, "heatmap"), models=model, metric=metric)))
