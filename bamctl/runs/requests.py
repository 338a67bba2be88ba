"""The task requests a run asks for, built one way for ``generate``, the run commands and the API.

What decides the prompts comes in two groups, ``Sampling`` (lengths, samples, seeds) and
``PromptChoices`` (protocol, depths and each task's own options). The command line's option
groups (``bamctl.cli.options.SAMPLES`` and ``PROMPT``) carry the same fields, so ``generate``
writes the prompts a run feeds and ``bamctl.evaluate`` asks what the same command line asks.
Everything that does not depend on a model is checked when an ``AskedRequests`` is made,
before any work: task names, protocols, seeds, options that do not apply to the tasks asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bamctl.errors import BamctlError


@dataclass(frozen=True)
class Sampling:
    """Which samples: ``lengths`` as text ('1k..8k') or token counts, None for the default
    doubling from the training length; ``samples`` per length and depth (None: the task's);
    ``seed`` as text ('0,1') or integers."""

    lengths: str | list[int] | None = None
    samples: int | None = None
    seed: str | list[int] = "0"


@dataclass(frozen=True)
class PromptChoices:
    """How the prompts are made; None is each task's default (``bamctl.cli.options.PROMPT`` says each)."""

    protocol: str | None = None
    depths: str | list[float] | None = None
    tokenizer: str | None = None
    chat_template: bool = False
    sizing: str | None = None
    haystack: Path | None = None
    data: Path | None = None
    stride: int | None = None
    bucket: int | None = None
    doc_tokens: int | None = None
    corpus: Path | None = None

DEFAULT_SAMPLES = {"passkey": 4, "ppl": 1}  # passkey: x 5 default depths = 20 per length
RULER_DEFAULT_SAMPLES = 20
RULER_PROTOCOL = "ruler"  # the protocol of every RULER task in bamctl/data/tasks/ruler.toml
ALL_TASKS = "all"  # --task all: every RULER task but the QA tasks, which need --data
PATH_OPTIONS = {"corpus": "corpus_path", "haystack": "haystack_path", "data": "data_path"}  # option -> the generator's argument
# The options of PROMPT handed to generators, each with the tasks it applies to: (how errors name
# them, whether a task is one of them).
RULER_TASKS = ("RULER's tasks", lambda spec: spec.protocol == RULER_PROTOCOL)
PPL_TASKS = ("--task ppl", lambda spec: spec.generator == "ppl")
QA_TASKS = ("qa_1 and qa_2", lambda spec: spec.generator == "qa")
TASK_OPTIONS = {"sizing": RULER_TASKS, "haystack": RULER_TASKS, "data": QA_TASKS, "stride": PPL_TASKS, "bucket": PPL_TASKS,
                "doc_tokens": PPL_TASKS, "corpus": PPL_TASKS}


class AskedRequests:
    """What a command line asks for, checked when made (before any work); ``for_models(train_lengths)``
    gives the requests for models trained at those lengths (the default ``--lengths`` depend on
    them; with no model, as in ``generate``, ``--lengths`` is needed)."""

    def __init__(self, names: list[str], sampling, prompt):
        from bamctl.lengths import parse_depths, parse_lengths
        from bamctl.tasks import get_task

        self.names = names
        self.seeds = parse_seeds(sampling.seed)
        self.lengths = _lengths(sampling.lengths, parse_lengths)
        self.samples = sampling.samples
        self.protocol = prompt.protocol
        for name in names:
            get_task(name, prompt.protocol)
        self.options = _taken_options({name: _task_options(name, prompt) for name in names})
        self.depths = {name: _depths(d, parse_depths) for name, d in _depths_by_task(names, prompt.depths).items()}

    def for_models(self, train_lengths: list[int]) -> list:
        from bamctl.evaluation import TaskRequest, default_lengths

        lengths = self.lengths or default_lengths(train_lengths)
        return [
            TaskRequest(
                name, lengths, self.samples or DEFAULT_SAMPLES.get(name, RULER_DEFAULT_SAMPLES), self.seeds,
                self.depths[name], self.protocol, self.options[name],
            )
            for name in self.names
        ]


def _lengths(lengths, parse) -> list[int] | None:
    if lengths is None or lengths == "":
        return None
    if isinstance(lengths, str):
        return parse(lengths)
    return parse(",".join(str(int(n)) for n in ([lengths] if isinstance(lengths, int) else lengths)))


def _depths(depths, parse) -> list[float] | None:
    if depths is None or depths == "":
        return None
    if isinstance(depths, str):
        return parse(depths)
    return parse(str(depths) if isinstance(depths, int) else ",".join(repr(float(d)) for d in depths))


def parse_seeds(text) -> list[int]:
    """``--seed``: '0' or '0,1'; the API also takes an integer or a list of them."""
    if isinstance(text, int):
        text = str(text)
    elif not isinstance(text, str):
        text = ",".join(str(seed) for seed in text)
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise BamctlError(f"--seed takes integers, e.g. 0 or 0,1 (got {text!r})") from None
    if not seeds:
        raise BamctlError("--seed needs at least one integer")
    negative = [seed for seed in seeds if seed < 0]
    if negative:  # -1 means "random" to many tools; here it would silently be one more fixed set of prompts
        raise BamctlError(f"--seed takes integers >= 0, e.g. 0 or 0,1 (got {negative[0]})")
    return seeds


def task_names(text: str) -> list[str]:
    """Comma-separated task names, every one checked before any work; ``all`` stands for every RULER task."""
    from bamctl.tasks import get_task
    from bamctl.tasks import task_names as every_task

    names = []
    for name in (t.strip() for t in text.split(",") if t.strip()):
        expanded = [t for t in every_task() if _in_all(t)] if name == ALL_TASKS else [name]
        names += [t for t in expanded if t not in names]
    if not names:
        raise BamctlError("--task needs at least one task name")
    for name in names:
        get_task(name)
    return names


def _in_all(task: str) -> bool:
    """Whether ``--task all`` runs ``task``: every RULER task but those reading a data set the user
    names (``qa_1`` and ``qa_2``: one ``--data`` file cannot be both)."""
    from bamctl.tasks import get_task

    spec = get_task(task)
    return spec.protocol == RULER_PROTOCOL and not QA_TASKS[1](spec)


def _task_options(task: str, prompt) -> dict:
    """The generator options ``prompt`` gives ``task``; one that applies to other tasks only is refused."""
    from bamctl.tasks import get_task

    spec = get_task(task)
    given = {name: getattr(prompt, name) for name in TASK_OPTIONS if getattr(prompt, name) is not None}
    for name in given:
        what, applies = TASK_OPTIONS[name]
        if not applies(spec):
            raise BamctlError(f"--{name.replace('_', '-')} applies to {what} only")
    if prompt.chat_template:
        if not RULER_TASKS[1](spec):
            raise BamctlError("--chat-template applies to RULER's tasks, whose answer prefix opens the assistant turn")
        given["chat_template"] = True
    for option, key in PATH_OPTIONS.items():
        if option in given:
            path = given.pop(option)
            if not path.is_file():
                raise BamctlError(f"--{option} {path} is not a file")
            given[key] = str(path)
    return given


def _taken_options(options: dict[str, dict]) -> dict[str, dict]:
    """Each task's options less those its generator does not take (``--haystack`` goes to the NIAH
    tasks of ``--task all``, not to vt); an option no task asked for takes is refused."""
    from bamctl.tasks import get_task

    taken = {name: get_task(name).options() for name in options}
    flags = {key: option for option, key in PATH_OPTIONS.items()}
    for key in {key for given in options.values() for key in given}:
        if not any(key in taken[name] for name in options):
            raise BamctlError(f"--{flags.get(key, key).replace('_', '-')} applies to none of the tasks asked for ({', '.join(options)})")
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
