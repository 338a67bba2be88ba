"""bamctl from Python: ``evaluate`` gives the rows of a run, ``compare`` its summary.

Both make the run the command line makes (``bamctl.runs.runner.run_models``): the same checks
before any work, the same results directory, rows reused on a rerun exactly as there. The
keyword arguments are the command line's options, with underscores::

    import bamctl

    rows = bamctl.evaluate("bam-ssmax", task="passkey", lengths="1k..8k", seeds=[0, 1])
    rows.groupby("length")["score"].mean()

    result = bamctl.compare(["rope", "alibi", "bam-ssmax"], task="passkey", lengths="128..4k")
    print(result.table())          # the table `bamctl compare` prints
    result.summaries[0].effective  # effective length per model, as a DataFrame

A model is a reference (catalog name, checkpoint folder, ``hf:PATH``, ``hf:ORG/NAME@REV``,
``bam:PATH``, ``vllm:PATH``), a bamctl ``Transformer`` object, or a Hugging Face causal LM
with its tokenizer as a pair ``(model, tokenizer)``: a model still in memory, e.g. in a
training loop (``bamctl.backends.in_memory``). Such a model is left as it was found: its
weights, device, dtype and train/eval mode.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

__all__ = ["evaluate", "compare", "Comparison"]

DEFAULT_DIR = Path("results")

# Keywords renamed, under their old names: still taken, with a DeprecationWarning (old -> new).
RENAMED = {"out": "dir"}


@dataclass
class Comparison:
    """``compare``'s result: every row it covered, and one summary per task and setting
    (``bamctl.results.summary.Summary``: accuracy or perplexity tables, effective lengths,
    paired tests against the baseline)."""

    rows: Any  # pandas.DataFrame
    summaries: list

    def table(self) -> str:
        """The tables ``bamctl compare`` prints, as plain text."""
        import io

        from rich.console import Console

        from bamctl.results.render import render_summaries

        console = Console(file=io.StringIO(), width=1000, highlight=False)
        console.print(render_summaries(self.summaries))
        return console.file.getvalue()

    def to_json(self) -> dict | list:
        """What ``bamctl compare --json`` prints."""
        from bamctl.results.render import summaries_to_json

        return summaries_to_json(self.summaries)


def evaluate(
    models=None,
    task: str | Sequence[str] = "passkey",
    *,
    lengths: str | int | Sequence[int] | None = None,
    samples: int | None = None,
    seeds: int | str | Sequence[int] = 0,
    depths: int | str | Sequence[float] | None = None,
    protocol: str | None = None,
    names: str | Sequence[str] | None = None,
    dir: str | Path = DEFAULT_DIR,
    batch_size: int | str = "auto",
    force: bool = False,
    reuse: bool = False,
    quiet: bool = False,
    shard: str | None = None,
    answer_logprob: bool = False,
    device: str | None = None,
    dtype: str | None = None,
    chunk_size: int | None = None,
    attention: str | None = None,
    block_skip: str | None = None,
    tokenizer: str | None = None,
    chat_template: bool = False,
    sizing: str | None = None,
    haystack: str | Path | None = None,
    data: str | Path | None = None,
    stride: int | None = None,
    bucket: int | None = None,
    doc_tokens: int | None = None,
    corpus: str | Path | None = None,
    beyond_max: str | None = None,
    bos: str | None = None,
    prior_form: str | None = None,
    rope_scaling: str | None = None,
    rope_factor: float | None = None,
    tensor_parallel: int | None = None,
    trust_remote_code: bool = False,
    base_url: str | None = None,
    endpoint: str | None = None,
    concurrency: int | None = None,
    logprobs_via: str | None = None,
    **unknown,
):
    """Evaluate ``models`` on ``task``; the rows of exactly this request, as a pandas DataFrame
    (one row per sample; columns: docs/SCHEMA.md), each under the name it was asked by.

    ``models``: one model or a list (see the module doc); None: the task's shipped flagship
    reference. ``task``: ``passkey``, ``ppl``, a RULER task, several comma separated or as a
    list, or ``all`` (every RULER task). ``lengths``: '1k..64k', '512,2k' or token counts;
    None: 1x to 64x the training length, doubling. ``seeds``: an integer, '0,1' or a list.
    ``names``: what rows call the models (default: a reference's last path part, a model in
    memory's ``in-memory-…`` name). Every other keyword is the command-line option of the
    same name (``bamctl passkey --help`` says each). Bad input raises ``bamctl.errors.BamctlError``
    before any work. ``dir``: the results directory (``--dir``), rows reused from it on a rerun.
    """
    outcome = _run(models, task, locals())
    return outcome.rows()


def compare(
    models,
    task: str | Sequence[str] = "passkey",
    *,
    threshold: float = 0.9,
    baseline: str | None = None,
    metric: str = "score",
    relative: float | None = None,
    base_length: int | str | None = None,
    **options,
) -> Comparison:
    """Run ``models`` on identical samples (``evaluate``'s keywords) and summarise them side by
    side: accuracy with 95% Wilson intervals over the independent draws, effective and certified
    lengths at ``threshold``, and each model tested against ``baseline`` (default: the first) at
    each length (a paired sign-flip test over the draws, Holm over lengths). ``metric``
    ``"answer_logprob"``: the cells hold the mean answer log-probability instead (``--metric``).
    ``relative`` (``--relative``): also each model's effective length relative to its own score at
    ``base_length`` (``--base-length``; default: its shortest tested length)."""
    from bamctl.lengths import parse_size
    from bamctl.results.summary import check_metric, check_relative, summarize

    check_metric(metric)
    base = None if base_length is None else parse_size(str(base_length))
    check_relative(relative, base)

    outcome = _run(models, task, {**_defaults(), **options}, baseline=baseline)
    names = outcome.names
    rows = outcome.rows()
    summaries = [] if rows.empty else summarize(rows, threshold=threshold, models=names, baseline=baseline or names[0],
                                                current_versions=outcome.versions, metric=metric, relative=relative,
                                                base_length=base)
    return Comparison(rows=rows, summaries=summaries)


def _defaults() -> dict:
    import inspect

    return {name: p.default for name, p in inspect.signature(evaluate).parameters.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY}


def _run(models, task, given: dict, baseline: str | None = None):

    given = {**{key: value for key, value in given.items() if key != "unknown"}, **given.get("unknown", {})}
    given = _fold_renamed(given)
    _refuse_unknown(set(given) - set(_defaults()) - {"models", "task"})
    with _keyword_errors():
        return _checked_run(models, task, _checked(given), baseline)


def _checked_run(models, task, given: dict, baseline: str | None):
    from bamctl.errors import BamctlError
    from bamctl.runs.checks import check_baseline
    from bamctl.runs.requests import AskedRequests, PromptChoices, Sampling, task_names
    from bamctl.runs.runner import command_of, model_names, model_or_flagship, parse_batch_size, run_models, run_options

    if not isinstance(task, str) and not (isinstance(task, (list, tuple)) and all(isinstance(t, str) for t in task)):
        raise BamctlError(f"task takes a task name or a list of them, not {task!r}")
    if isinstance(models, (list, tuple)) and not _is_pair(models) and not models:
        raise BamctlError("models is an empty list: give one or more models, or None for the task's flagship reference")
    tasks = task_names(task if isinstance(task, str) else ",".join(task))
    say = _stderr_line
    models = _as_models(models, given["names"], lambda: model_or_flagship(None, command_of(tasks[0]), say))
    names = _as_names(given["names"], models)
    if baseline is not None:
        check_baseline(baseline, names or model_names(models))
    asked = AskedRequests(
        tasks,
        Sampling(lengths=given["lengths"], samples=given["samples"], seed=given["seeds"]),
        PromptChoices(
            protocol=given["protocol"], depths=given["depths"], tokenizer=given["tokenizer"],
            chat_template=given["chat_template"], sizing=given["sizing"], haystack=_path(given["haystack"]),
            data=_path(given["data"]), stride=given["stride"], bucket=given["bucket"], doc_tokens=given["doc_tokens"], corpus=_path(given["corpus"]),
        ),
    )
    with _left_as_found(models):
        return run_models(models, asked, run_options(given), out=Path(given["dir"]),
                          batch_size=parse_batch_size(given["batch_size"], "batch_size"),
                          force=given["force"], reuse=given["reuse"], shard=given["shard"], quiet=given["quiet"],
                          names=names, console=_console(), answer_logprob=given["answer_logprob"])


INTEGERS = ("chunk_size", "stride", "bucket", "doc_tokens", "tensor_parallel", "concurrency")  # positive integers or None
FLAGS = ("force", "reuse", "quiet", "chat_template", "trust_remote_code", "answer_logprob")  # True or False


def _checked(given: dict) -> dict:
    """The keywords as the command line would take them, each refused by its name before any work
    (a BamctlError): numbers that must be integers are integers, counts are positive. Any integer
    type is an integer (numpy's ``np.int64`` of ``list(np.array([128, 256]))`` too, a bool not:
    ``numbers.Integral``), and is handed on as a plain ``int``, so no code below meets numpy's."""
    from numbers import Integral, Real

    from bamctl.errors import BamctlError

    def whole(value) -> bool:
        return isinstance(value, Integral) and not isinstance(value, bool)

    def number(value) -> bool:
        return isinstance(value, Real) and not isinstance(value, bool)

    def numbers(value, kind: str) -> list:
        several = isinstance(value, (list, tuple, range)) or getattr(value, "ndim", None) == 1  # a numpy array too
        items = list(value) if several else [value]
        if several and not items:
            raise BamctlError(f"{kind} is an empty list")
        return items

    given = dict(given)
    samples = given["samples"]
    if samples is not None and not (whole(samples) and samples >= 1):
        raise BamctlError(f"samples takes a positive integer (samples per length and depth), not {samples!r}")
    given["samples"] = None if samples is None else int(samples)
    lengths = given["lengths"]
    if lengths is not None and not isinstance(lengths, str):
        bad = [n for n in numbers(lengths, "lengths") if not (whole(n) and n >= 1)]
        if bad:
            raise BamctlError(f"lengths takes token counts (positive integers) or text such as '1k..64k', not {bad[0]!r}")
        given["lengths"] = [int(n) for n in numbers(lengths, "lengths")]
    seeds = given["seeds"]
    if not isinstance(seeds, str):
        bad = [n for n in numbers(seeds, "seeds") if not whole(n)]
        if bad:
            raise BamctlError(f"seeds takes integers (0, [0, 1]) or text such as '0,1', not {bad[0]!r}")
        given["seeds"] = [int(n) for n in numbers(seeds, "seeds")]
    depths = given["depths"]
    if whole(depths):  # a count of depths
        given["depths"] = int(depths)
    elif number(depths):  # one depth, a fraction of the filler
        given["depths"] = [float(depths)]
    elif depths is not None and not isinstance(depths, str):
        bad = [d for d in numbers(depths, "depths") if not number(d)]
        if bad:
            raise BamctlError(f"depths takes a count (5), a fraction (0.5), a list of fractions or text such as "
                              f"'0,0.5,1', not {bad[0]!r}")
        given["depths"] = [float(d) for d in numbers(depths, "depths")]
    for name in INTEGERS:
        value = given[name]
        if value is not None and not (whole(value) and value >= 1):
            raise BamctlError(f"{name} takes a positive integer, not {value!r}")
        given[name] = None if value is None else int(value)
    batch_size = given["batch_size"]
    if not isinstance(batch_size, str) and not (whole(batch_size) and batch_size >= 1):  # 2.5 is not 2
        raise BamctlError(f"batch_size must be 'auto' or a positive number of samples, not {batch_size!r}")
    given["batch_size"] = batch_size if isinstance(batch_size, str) else int(batch_size)
    for name in FLAGS:
        if not isinstance(given[name], bool):
            raise BamctlError(f"{name} takes True or False, not {given[name]!r}")
    factor = given["rope_factor"]
    if factor is not None and not number(factor):
        raise BamctlError(f"rope_factor takes a number, not {factor!r}")
    given["rope_factor"] = None if factor is None else float(factor)
    return given


def _fold_renamed(given: dict) -> dict:
    """``given`` with each old keyword's value under its new name (``RENAMED``), with a
    DeprecationWarning; refused where both are given and differ."""
    import warnings

    from bamctl.errors import BamctlError

    for old, new in RENAMED.items():
        if old not in given:
            continue
        given = dict(given)
        value = given.pop(old)
        default = _defaults()[new]
        if given.get(new, default) not in (default, value):
            raise BamctlError(f"{old} is the old name of {new}: give {new} alone")
        given[new] = value
        warnings.warn(f"bamctl: {old}= is now {new}= (the results directory, --dir on the command line)",
                      DeprecationWarning, stacklevel=4)
    return given


def _refuse_unknown(unknown: set) -> None:
    """A keyword evaluate does not take: a BamctlError naming it and the one meant, where one is close."""
    import difflib

    from bamctl.errors import BamctlError

    if not unknown:
        return
    name = sorted(unknown)[0]
    close = difflib.get_close_matches(name, list(_defaults()), n=1)
    meant = f"; did you mean {close[0]}?" if close else f" (it takes: {', '.join(_defaults())})"
    raise BamctlError(f"no keyword {name!r}{meant}")


# How the command line's flags are called here: an error raised below the API names the keyword.
KEYWORD_OF_FLAG = {"--seed": "seeds", "--force": "force=True", "--reuse": "reuse=True", "--quiet": "quiet=True",
                   "--chat-template": "chat_template=True"}


@contextmanager
def _keyword_errors():
    """Errors of the run name the API's keywords (``seeds``, ``chunk_size``), not the flags the
    command line spells them with (``--seed``, ``--chunk-size``)."""
    import re

    from bamctl.errors import BamctlError

    try:
        yield
    except BamctlError as err:
        raise BamctlError(keywords_for_flags(str(err))) from None


def keywords_for_flags(text: str) -> str:
    """``--seed`` → ``seeds``, ``--chunk-size`` → ``chunk_size``: a line of the run in the API's words."""
    from bamctl.errors import flags_as_keywords

    return flags_as_keywords(text, KEYWORD_OF_FLAG)


def _console():
    """stderr, as the run's lines go there on the command line, in the API's words."""
    from rich.console import Console

    class KeywordConsole(Console):
        def print(self, *objects, **kwargs):
            super().print(*(keywords_for_flags(o) if isinstance(o, str) else o for o in objects), **kwargs)

    return KeywordConsole(stderr=True, highlight=False)


def _as_models(models, names, flagship) -> list:
    """Each model as a run takes it: a reference string, or a model in memory."""
    from bamctl.backends.in_memory import in_memory

    if models is None:
        return [flagship()]
    listed = list(models) if isinstance(models, list) or (isinstance(models, tuple) and not _is_pair(models)) else [models]
    given = [names] if isinstance(names, str) else list(names or [])
    taken = []
    for index, model in enumerate(listed):
        name = given[index] if index < len(given) else None
        if isinstance(model, (str, Path)):
            taken.append(str(model))
        elif _is_pair(model):
            taken.append(in_memory(model[0], model[1], name))
        else:
            taken.append(in_memory(model, None, name))
    return taken


def _as_names(names, models: list) -> list[str] | None:
    from bamctl.errors import BamctlError
    from bamctl.runs.runner import model_names

    if names is None:
        return None
    names = [names] if isinstance(names, str) else list(names)
    if len(names) != len(models):
        raise BamctlError(f"{len(names)} names given for {len(models)} models")
    defaults = model_names(models)
    return [name or default for name, default in zip(names, defaults)]


def _is_module(model) -> bool:
    import torch

    return isinstance(model, torch.nn.Module)


def _is_pair(model) -> bool:
    return isinstance(model, tuple) and len(model) == 2 and _is_module(model[0]) and not _is_module(model[1])


@contextmanager
def _left_as_found(models: list):
    """A model in memory leaves the run in the train/eval mode it came in (the back-ends set eval),
    and a bamctl Transformer with the RoPE scaling it had (the engine sets its own)."""
    from bamctl.backends.in_memory import TransformerInMemory

    kept = [(m.module, m.module.training, m.module.rope_scaling if isinstance(m, TransformerInMemory) else None,
             isinstance(m, TransformerInMemory)) for m in models if not isinstance(m, str)]
    try:
        yield
    finally:
        for module, training, rope_scaling, engine_run in kept:
            module.train(training)
            if engine_run:
                module.rope_scaling = rope_scaling


def _path(value) -> Path | None:
    return None if value is None else Path(value)


def _stderr_line(line: str) -> None:
    from rich.console import Console

    Console(stderr=True, highlight=False).print(line, soft_wrap=True)
