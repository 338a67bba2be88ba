"""Tasks are data: ``bamctl/data/tasks/*.toml`` names each task's generator, arguments and metric.

A table is a task. A ``protocols`` sub-table lists the ways one task can be posed
(passkey: ``authors`` or ``landmark``; ppl: ``sliding`` or ``buckets``), with
``default_protocol`` picking one when none is asked for; a task without one has a
single protocol, named by its ``protocol`` key (RULER's tasks: ``ruler``).

A generator is two pure functions: ``plan`` lists the samples a request asks for
(cheap slots, so a run counts, shards and skips work before building a prompt) and
``build`` turns one slot into its :class:`Sample`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Callable, Iterator

from bamctl.errors import BamctlError, did_you_mean
from bamctl.fingerprints import digest, file_digest
from bamctl.lengths import parse_depths
from bamctl.tasks.common_words import cwe_sample
from bamctl.tasks.facts import facts_sample
from bamctl.tasks.frequent_words import fwe_sample
from bamctl.tasks.metrics import METRICS
from bamctl.tasks.passkey import authors_scoring, passkey_sample
from bamctl.tasks.perplexity import ppl_options, ppl_plan, ppl_sample, ppl_setting, ppl_shortfall
from bamctl.tasks.qa import qa_sample, qa_shortfall, required_data
from bamctl.tasks.ruler import niah_sample, niah_takes_depths
from bamctl.tasks.sample import SCORING_KINDS, Sample, SampleSlot
from bamctl.tasks.texts import common_word_files, corpus_files, read_toml, tasks_dir, word_files
from bamctl.tasks.variable_tracking import vt_sample
from bamctl.tokenizer import Tokenizer


def grid_plan(spec: "TaskSpec", lengths: list[int], depths: list[float] | None, n_samples: int, seed: int, **_) -> list[SampleSlot]:
    """Every (length, depth, index): the plan of tasks whose samples stand alone."""
    grid = even_grid(depths)
    return [
        spec.slot(length=length, depth=depth, seed=seed, index=index, depth_grid=grid[d] if grid else None)
        for length in lengths
        for d, depth in enumerate(depths if depths is not None else [None])
        for index in range(n_samples)
    ]


def even_grid(depths: list[float] | None) -> list[tuple[int, int]] | None:
    """``[(i, k)]`` when the depths are k evenly spaced fractions from 0 to 1 (``--depths K``)."""
    if not depths:
        return None
    k = len(depths)
    expected = [i / (k - 1) for i in range(k)] if k > 1 else [0.0]
    if any(abs(d - e) > 1e-9 for d, e in zip(depths, expected)):
        return None
    return [(i, k) for i in range(k)]


def always(args: dict) -> bool:
    return True


def never(args: dict) -> bool:
    return False


def as_given(spec: "TaskSpec", lengths: list[int], options: dict) -> dict:
    return options


def no_setting(spec: "TaskSpec", lengths: list[int], options: dict) -> str:
    return ""


def no_files(spec: "TaskSpec", options: dict) -> list[Path]:
    return []


def no_shortfall(spec: "TaskSpec", lengths: list[int], n_samples: int, tokenizer: Tokenizer, options: dict) -> str | None:
    return None


def any_tokenizer(spec: "TaskSpec", tokenizer: Tokenizer) -> str | None:
    return None


def passkey_support(spec: "TaskSpec", tokenizer: Tokenizer) -> str | None:
    if spec.args.get("form") != "authors":
        return None
    return authors_scoring(tokenizer, spec.args.get("key_digits", 5))


def niah_files(spec: "TaskSpec", options: dict) -> list[Path]:
    path = options.get("haystack_path")
    return [*([Path(path)] if path else corpus_files("essays")), *word_files()]


def essay_files(spec: "TaskSpec", options: dict) -> list[Path]:
    return corpus_files("essays")


def cwe_files(spec: "TaskSpec", options: dict) -> list[Path]:
    return common_word_files()


def qa_files(spec: "TaskSpec", options: dict) -> list[Path]:
    """The user's data set (``--data``): a QA task without one is refused here, at planning."""
    return [required_data(spec.task, spec.args["dataset"], options.get("data_path"))]


def qa_samples_shortfall(spec: "TaskSpec", lengths: list[int], n_samples: int, tokenizer: Tokenizer, options: dict) -> str | None:
    return qa_shortfall(spec.task, spec.args["dataset"], options.get("data_path"), n_samples)


def ruler_setting(spec: "TaskSpec", lengths: list[int], options: dict) -> str:
    """``sizing=ruler``, ``haystack=FILE``, ``chat``: what sets a RULER run apart from the defaults."""
    parts = []
    if options.get("sizing", "exact") != "exact":
        parts.append(f"sizing={options['sizing']}")
    if options.get("haystack_path"):
        parts.append(f"haystack={Path(options['haystack_path']).name}")
    if options.get("chat_template"):
        parts.append("chat")
    return " ".join(parts)


def ppl_files(spec: "TaskSpec", options: dict) -> list[Path]:
    path = options.get("corpus_path")
    return [Path(path)] if path is not None else corpus_files("ppl")


@dataclass(frozen=True)
class Generator:
    """``build(slot, tokenizer, **args)`` makes one sample; ``plan`` lists a request's slots;
    ``resolve`` fills in the options whose default depends on the request (e.g. its lengths);
    ``setting`` names the options that depart from the protocol's defaults (``stride=256``);
    ``files`` lists the data files its samples are made from (their contents are part of
    the fingerprint); ``shortfall`` says in one line when the data cannot give as many distinct
    samples as asked. ``version`` counts changes to what ``build`` makes: raise it whenever
    the same slot would give another sample (``tests/test_fingerprints.py`` pins them)."""

    build: Callable[..., Sample]
    version: int = 1
    plan: Callable[..., list[SampleSlot]] = grid_plan
    resolve: Callable[..., dict] = as_given
    setting: Callable[..., str] = no_setting
    files: Callable[..., list[Path]] = no_files
    supports: Callable[..., str | None] = any_tokenizer
    shortfall: Callable[..., str | None] = no_shortfall
    takes_depths: Callable[[dict], bool] = always  # given the task's TOML args: does --depths apply?


# generator name in the TOML -> its functions
GENERATORS: dict[str, Generator] = {
    "passkey": Generator(passkey_sample, version=2, supports=passkey_support),
    "niah": Generator(niah_sample, version=3, setting=ruler_setting, files=niah_files, takes_depths=niah_takes_depths),
    "vt": Generator(vt_sample, version=1, setting=ruler_setting, takes_depths=never),
    "cwe": Generator(cwe_sample, version=1, setting=ruler_setting, files=cwe_files, takes_depths=never),
    "fwe": Generator(fwe_sample, version=1, setting=ruler_setting, takes_depths=never),
    "facts": Generator(facts_sample, version=1, files=essay_files),
    "qa": Generator(
        qa_sample, version=1, setting=ruler_setting, files=qa_files, shortfall=qa_samples_shortfall, takes_depths=never,
    ),
    "ppl": Generator(
        ppl_sample, version=4, plan=ppl_plan, resolve=ppl_options, setting=ppl_setting, files=ppl_files,
        shortfall=ppl_shortfall, takes_depths=never,
    ),
}


@dataclass(frozen=True)
class TaskSpec:
    """Everything needed to plan, generate and score one protocol of a task."""

    task: str
    protocol: str
    generator: str
    scoring: str
    metric: str
    max_new_tokens: int
    args: dict = field(default_factory=dict)
    description: str = ""
    default_depths: str | None = None  # depth grid when --depths is not given (None: the generator's own)

    def slot(self, **identity) -> SampleSlot:
        return SampleSlot(
            task=self.task, protocol=self.protocol, scoring=self.scoring, metric=self.metric,
            max_new_tokens=self.max_new_tokens, **identity,
        )

    @property
    def functions(self) -> Generator:
        return GENERATORS[self.generator]

    def unsupported(self, tokenizer: Tokenizer) -> str | None:
        """Why ``tokenizer`` cannot run this protocol (None when it can)."""
        return self.functions.supports(self, tokenizer)

    def options(self) -> set[str]:
        """Option names the generator takes beyond its TOML arguments (e.g. ``corpus_path``)."""
        names = set(inspect.signature(self.functions.build).parameters) | set(inspect.signature(self.functions.plan).parameters)
        return names - {"slot", "tokenizer", "spec", "lengths", "depths", "n_samples", "seed", "bos", "_"}

    def takes_bos(self) -> bool:
        """Whether what the generator builds depends on a BOS going in front (perplexity's buckets:
        their document is one token longer without one); the back-end says, never the user."""
        return "bos" in inspect.signature(self.functions.build).parameters

    def takes_depths(self) -> bool:
        """Whether ``--depths`` applies: the task hides one thing and lets the caller place it."""
        return self.functions.takes_depths(self.args)


def _spec(task: str, protocol: str, table: dict, base: dict, source: str) -> TaskSpec:
    merged = {**base, **table}
    missing = [key for key in ("generator", "scoring", "metric") if key not in merged]
    if missing:
        raise BamctlError(f"{source}: task {task!r} lacks {', '.join(missing)}")
    if merged["generator"] not in GENERATORS:
        raise BamctlError(f"unknown generator in {source} for {merged['generator']!r}{did_you_mean(merged['generator'], GENERATORS, cutoff=0.5)}")
    if merged["scoring"] not in SCORING_KINDS:
        raise BamctlError(f"{source}: task {task!r} scoring must be one of {', '.join(SCORING_KINDS)}")
    if merged["metric"] not in METRICS:
        raise BamctlError(f"unknown metric in {source} for {merged['metric']!r}{did_you_mean(merged['metric'], METRICS, cutoff=0.5)}")
    return TaskSpec(
        task=task,
        protocol=protocol,
        generator=merged["generator"],
        scoring=merged["scoring"],
        metric=merged["metric"],
        max_new_tokens=int(merged.get("max_new_tokens", 0)),
        args=dict(merged.get("args", {})),
        description=merged.get("description", ""),
        default_depths=merged.get("default_depths"),
    )


TABLE_KEYS = ("protocols", "default_protocol", "protocol", "auto")
AUTO = "auto"  # the protocol that picks, per tokenizer, the first of a task's `auto` list it can run


@cache
def _load() -> tuple[dict[str, dict[str, TaskSpec]], dict[str, str], dict[str, list[str]]]:
    protocols: dict[str, dict[str, TaskSpec]] = {}
    defaults: dict[str, str] = {}
    autos: dict[str, list[str]] = {}
    for path in sorted(tasks_dir().glob("*.toml")):
        for task, table in read_toml(path).items():
            if task in protocols:
                raise BamctlError(f"task {task!r} is defined twice (again in {path.name})")
            base = {key: value for key, value in table.items() if key not in TABLE_KEYS}
            if "protocols" in table:
                protocols[task] = {name: _spec(task, name, sub, base, path.name) for name, sub in table["protocols"].items()}
                defaults[task] = table.get("default_protocol", next(iter(table["protocols"])))
            else:
                name = table.get("protocol", task)
                protocols[task] = {name: _spec(task, name, {}, base, path.name)}
                defaults[task] = name
            autos[task] = list(table.get("auto", []))
            unknown = [name for name in autos[task] if name not in protocols[task]]
            if unknown or (defaults[task] == AUTO and not autos[task]):
                raise BamctlError(f"{path.name}: task {task!r} has an `auto` list naming no protocol of it")
    return protocols, defaults, autos


def task_names() -> list[str]:
    return list(_load()[0])


def protocol_names(task: str) -> list[str]:
    """The protocols ``--protocol`` takes for ``task``, ``auto`` first where the task has it."""
    protocols, _, autos = _load()
    if task not in protocols:
        raise BamctlError(f"unknown task {task!r}{did_you_mean(task, protocols, cutoff=0.5)}")
    return ([AUTO] if autos[task] else []) + list(protocols[task])


def get_task(task: str, protocol: str | None = None, tokenizer: Tokenizer | None = None) -> TaskSpec:
    """The spec of ``task`` posed by ``protocol`` (its default protocol when None).

    ``auto`` picks the first protocol of the task's ``auto`` list that ``tokenizer`` can run
    (without a tokenizer: the first of the list).
    """
    protocols, defaults, autos = _load()
    if task not in protocols:
        raise BamctlError(f"unknown task {task!r}{did_you_mean(task, protocols, cutoff=0.5)}")
    protocol = defaults[task] if protocol is None else protocol
    if protocol == AUTO and autos[task]:
        for name in autos[task]:
            spec = protocols[task][name]
            if tokenizer is None or spec.unsupported(tokenizer) is None:
                return spec
        return protocols[task][autos[task][-1]]
    if protocol not in protocols[task]:
        known = protocol_names(task)
        raise BamctlError(f"unknown protocol {protocol!r} for {task}{did_you_mean(protocol, known, cutoff=0.5)}")
    return protocols[task][protocol]


def protocol_candidates(task: str, protocol: str | None = None) -> list[str]:
    """The protocols ``protocol`` may turn out to be once a tokenizer is known: each of ``auto``'s
    list for ``auto``, else the one named."""
    protocols, defaults, autos = _load()
    protocol = defaults.get(task) if protocol is None else protocol
    if protocol == AUTO and autos.get(task):
        return list(autos[task])
    return [get_task(task, protocol).protocol]


# (plan fingerprint, slots) whose samples built: a sample is a pure function of its slot and
# the plan's fingerprinted inputs, so building them again proves nothing new.
_BUILT_FINE: set[tuple] = set()


@dataclass(frozen=True)
class TaskPlan:
    """A request's samples, planned: ``slots`` in order, each built on demand by ``build``."""

    spec: TaskSpec
    slots: list[SampleSlot]
    tokenizer: Tokenizer
    options: dict  # resolved: every default that depends on the request filled in
    setting: str = ""  # the options that depart from the protocol's defaults, as key=value words
    fingerprint: str = ""  # of everything the prompts and their scoring are made from (see plan_fingerprint)
    notes: tuple[str, ...] = ()  # what a user should read before the run starts (too few distinct documents)

    def build(self, slot: SampleSlot) -> Sample:
        return self.spec.functions.build(slot=slot, tokenizer=self.tokenizer, **self.spec.args, **self.options)

    def samples(self) -> Iterator[Sample]:
        return (self.build(slot) for slot in self.slots)

    def check_lengths(self) -> None:
        """Build every sample of the shortest length now, and drop them: a length too short for the
        task (its prompt around the haystack, its vocabulary) is refused before any work, not when
        the run reaches it. Longer lengths only give the prompt more room."""
        lengths = sorted({slot.length for slot in self.slots})
        shortest = tuple(slot for slot in self.slots if slot.length == lengths[0])
        key = (self.fingerprint, shortest)
        if key in _BUILT_FINE:  # the same prompts already built (another model of the same tokenizer)
            return
        try:
            for slot in shortest:
                self.build(slot)
        except BamctlError as err:
            fitting = self._shortest_fitting(lengths[1:])
            if fitting is None:  # no length helps: not a matter of length, or every one is too short
                raise
            raise BamctlError(f"{err}; start --lengths at {fitting:,} (the shortest asked for that fits)") from None
        _BUILT_FINE.add(key)

    def shortest_buildable_length(self) -> int | None:
        """The shortest planned length whose first sample builds (None: none does)."""
        return self._shortest_fitting(sorted({slot.length for slot in self.slots}))

    def _shortest_fitting(self, longer: list[int]) -> int | None:
        """The shortest of the other planned lengths whose first sample builds, if any."""
        for length in longer:
            try:
                self.build(next(slot for slot in self.slots if slot.length == length))
            except BamctlError:
                continue
            return length
        return None

    @property
    def n_rows(self) -> int:
        return sum(len(slot.rows) for slot in self.slots)


def plan_samples(
    task: str,
    lengths: list[int],
    n_samples: int,
    seeds: list[int],
    tokenizer: Tokenizer,
    depths: list[float] | None = None,
    *,
    protocol: str | None = None,
    check_tokenizer: bool = True,
    scored_tokens: str | None = None,
    bos_for: Callable[[str], bool] | None = None,
    **options,
) -> TaskPlan:
    """The samples of every seed, length, depth and index, in that nesting order.

    Arguments are checked here, before anything is built; ``check_tokenizer=False`` leaves
    out what depends on the tokenizer (``auto``'s choice, a protocol the tokenizer cannot
    run), for checks made before the model's tokenizer is known. ``scored_tokens`` names the
    tokens the model can score (``Backend.scored_tokens``), which perplexity's fingerprint
    carries; None before a model is known. ``bos_for`` is the back-end's ``Backend.bos_for``
    (whether one BOS goes before a prompt of a scoring kind), for generators whose samples
    depend on it; None: no BOS, as bamctl's own models. ``options`` go to the
    generator (``corpus_path``, ``stride`` … for ppl; None means its default). Each
    sample is a pure function of its slot and these options: asking for more or other
    lengths never changes it.
    """
    spec = get_task(task, protocol, tokenizer if check_tokenizer else None)
    why = spec.unsupported(tokenizer) if check_tokenizer else None
    if why:
        raise BamctlError(why)
    if n_samples < 1:
        raise BamctlError(f"--samples must be at least 1 (got {n_samples})")
    if depths is None and spec.default_depths is not None:
        depths = parse_depths(spec.default_depths)
    if depths is not None and not spec.takes_depths():
        raise BamctlError(f"--depths does not apply to {task} (its generator places what it hides itself)")
    options = {key: value for key, value in options.items() if value is not None}
    unknown = sorted(set(options) - spec.options())
    if unknown:
        raise BamctlError(f"task {task} does not take {', '.join(unknown)}")
    setting = spec.functions.setting(spec, lengths, options)
    options = spec.functions.resolve(spec, lengths, options)
    if spec.takes_bos():
        options = {**options, "bos": bool(bos_for(spec.scoring)) if bos_for is not None else False}
    slots = _length_by_length([
        slot
        for seed in seeds
        for slot in spec.functions.plan(spec=spec, lengths=lengths, depths=depths, n_samples=n_samples, seed=seed, **options)
    ])
    shortfall = spec.functions.shortfall(spec, lengths, n_samples, tokenizer, options) if check_tokenizer else None
    return TaskPlan(
        spec, slots, tokenizer, options, setting, plan_fingerprint(spec, options, tokenizer, scored_tokens),
        notes=(shortfall,) if shortfall else (),
    )


def _length_by_length(slots: list[SampleSlot]) -> list[SampleSlot]:
    """``slots`` with each length's together, the lengths in order of first appearance and the
    generator's order kept within a length. The generators put seeds (and perplexity's
    documents) outside the length; a run visits the plan in order, and visited that way its
    batches would end at every change of seed, smaller than memory allows and than the run
    announces. ``bamctl generate`` writes the same order, so its file is what a run feeds."""
    first: dict[int, int] = {}
    for slot in slots:
        first.setdefault(slot.length, len(first))
    return sorted(slots, key=lambda slot: first[slot.length])  # stable


# Scoring kinds whose number sums over the tokens a model scores: models scoring other token
# sets (another vocabulary, a token subset) give numbers that are not comparable.
SCORED_OVER_TOKENS = {"nll"}
# Options naming a file whose contents, not its path, are fingerprinted (in `files`): a moved copy is the same plan.
CONTENT_PATHS = ("corpus_path", "data_path")


def plan_fingerprint(spec: TaskSpec, options: dict, tokenizer: Tokenizer, scored_tokens: str | None = None) -> str:
    """The fingerprint of what a task's prompts and scoring are made from: the protocol's
    spec (generator and its version, arguments, scoring, metric, answer budget), the
    resolved options, the contents of every data file read, the tokenizer, and, for
    perplexity, the tokens the model scores."""
    functions = spec.functions
    if not tokenizer.fingerprint:  # a tokenizer without identity would let other prompts match
        raise ValueError(f"tokenizer {tokenizer.name!r} states no fingerprint")
    identity = {
        "task": spec.task,
        "protocol": spec.protocol,
        "generator": [spec.generator, functions.version],
        "args": spec.args,
        "scoring": [spec.scoring, spec.metric, spec.max_new_tokens],
        "options": {key: str(value) for key, value in options.items() if key not in CONTENT_PATHS},
        "files": [file_digest(path) for path in functions.files(spec, options)],
        "tokenizer": tokenizer.fingerprint,
    }
    if spec.scoring in SCORED_OVER_TOKENS:
        identity["scored_tokens"] = scored_tokens
    return digest(identity)


def generate_samples(
    task: str,
    lengths: list[int],
    n_samples: int,
    seed: int,
    tokenizer: Tokenizer,
    depths: list[float] | None = None,
    **options,
) -> Iterator[Sample]:
    """The samples of one seed, built lazily (arguments are checked at the call)."""
    return plan_samples(task, lengths, n_samples, [seed], tokenizer, depths, **options).samples()
