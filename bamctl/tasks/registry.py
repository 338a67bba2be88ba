"""Tasks are data: ``tasks/*.toml`` names each task's generator, arguments and metric.

A table is a task. Without a ``variants`` sub-table the task is its own single
variant (RULER: ``niah_single_1`` is both); with one, ``default_variant`` picks
when none is asked for (passkey: ``authors`` or ``landmark``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from functools import cache
from typing import Callable, Iterator

from bamctl.errors import BamctlError, did_you_mean
from bamctl.lengths import parse_depths
from bamctl.tasks.metrics import METRICS
from bamctl.tasks.passkey import passkey_sample
from bamctl.tasks.perplexity import ppl_sample
from bamctl.tasks.ruler import niah_sample
from bamctl.tasks.sample import SCORING_KINDS, Sample
from bamctl.tasks.texts import read_toml, tasks_dir
from bamctl.tokenizer import Tokenizer

# generator name in the TOML -> function(tokenizer, length, seed, index, depth, task, variant, ..., **args)
GENERATORS: dict[str, Callable[..., Sample]] = {
    "passkey": passkey_sample,
    "niah": niah_sample,
    "ppl": ppl_sample,
}


@dataclass(frozen=True)
class TaskVariant:
    """Everything needed to generate and score one variant of a task."""

    task: str
    variant: str
    generator: str
    scoring: str
    metric: str
    max_new_tokens: int
    args: dict = field(default_factory=dict)
    description: str = ""
    default_depths: str | None = None  # depth grid when --depths is not given (None: the generator's own)


def _did_you_mean(kind: str, name: str, known: list[str]) -> BamctlError:
    return BamctlError(f"unknown {kind} {name!r}{did_you_mean(name, known, cutoff=0.5)}")


def _variant(task: str, variant: str, table: dict, base: dict, source: str) -> TaskVariant:
    merged = {**base, **table}
    missing = [key for key in ("generator", "scoring", "metric") if key not in merged]
    if missing:
        raise BamctlError(f"{source}: task {task!r} lacks {', '.join(missing)}")
    if merged["generator"] not in GENERATORS:
        raise _did_you_mean(f"generator in {source} for", merged["generator"], list(GENERATORS))
    if merged["scoring"] not in SCORING_KINDS:
        raise BamctlError(f"{source}: task {task!r} scoring must be one of {', '.join(SCORING_KINDS)}")
    if merged["metric"] not in METRICS:
        raise _did_you_mean(f"metric in {source} for", merged["metric"], list(METRICS))
    return TaskVariant(
        task=task,
        variant=variant,
        generator=merged["generator"],
        scoring=merged["scoring"],
        metric=merged["metric"],
        max_new_tokens=int(merged.get("max_new_tokens", 0)),
        args=dict(merged.get("args", {})),
        description=merged.get("description", ""),
        default_depths=merged.get("default_depths"),
    )


@cache
def _load() -> tuple[dict[str, dict[str, TaskVariant]], dict[str, str]]:
    variants: dict[str, dict[str, TaskVariant]] = {}
    defaults: dict[str, str] = {}
    for path in sorted(tasks_dir().glob("*.toml")):
        for task, table in read_toml(path).items():
            if task in variants:
                raise BamctlError(f"task {task!r} is defined twice (again in {path.name})")
            base = {key: value for key, value in table.items() if key not in ("variants", "default_variant")}
            if "variants" in table:
                variants[task] = {
                    name: _variant(task, name, sub, base, path.name) for name, sub in table["variants"].items()
                }
                defaults[task] = table.get("default_variant", next(iter(table["variants"])))
            else:
                variants[task] = {task: _variant(task, task, {}, base, path.name)}
                defaults[task] = task
    return variants, defaults


def task_names() -> list[str]:
    return list(_load()[0])


def get_task(task: str, variant: str | None = None) -> TaskVariant:
    """The variant spec for ``task`` (its default variant when ``variant`` is None)."""
    variants, defaults = _load()
    if task not in variants:
        raise _did_you_mean("task", task, list(variants))
    if variant is None:
        return variants[task][defaults[task]]
    if variant not in variants[task]:
        raise _did_you_mean(f"variant of {task}:", variant, list(variants[task]))
    return variants[task][variant]


def generate_samples(
    task: str,
    lengths: list[int],
    n_samples: int,
    seed: int,
    tokenizer: Tokenizer,
    depths: list[float] | None = None,
    **options,
) -> Iterator[Sample]:
    """Samples for every length, depth and index, in that nesting order (lazily).

    Arguments are checked at the call, before the first sample is built.

    ``options``: ``variant`` (or its alias ``protocol``) picks a variant; any other
    option goes to the generator (``corpus_path`` for ppl). Each sample is a pure
    function of (task, variant, length, depth, seed, index): asking for more or
    other lengths never changes it.
    """
    variant, protocol = options.pop("variant", None), options.pop("protocol", None)
    spec = get_task(task, variant or protocol)
    if n_samples < 1:
        raise BamctlError(f"--samples must be at least 1 (got {n_samples})")
    if depths is None and spec.default_depths is not None:
        depths = parse_depths(spec.default_depths)
    if depths is not None and spec.generator == "ppl":
        raise BamctlError("--depths does not apply to perplexity")
    options = {key: value for key, value in options.items() if value is not None}
    generator = GENERATORS[spec.generator]
    unknown = sorted(set(options) - set(inspect.signature(generator).parameters))
    if unknown:
        raise BamctlError(f"task {task} does not take {', '.join(unknown)}")
    return _iterate(generator, spec, lengths, depths, n_samples, seed, tokenizer, options)


def _iterate(generator, spec: TaskVariant, lengths, depths, n_samples, seed, tokenizer, options) -> Iterator[Sample]:
    for length in lengths:
        for depth in depths if depths is not None else [None]:
            for index in range(n_samples):
                yield generator(
                    tokenizer=tokenizer,
                    length=length,
                    seed=seed,
                    index=index,
                    depth=depth,
                    task=spec.task,
                    variant=spec.variant,
                    scoring=spec.scoring,
                    metric=spec.metric,
                    max_new_tokens=spec.max_new_tokens,
                    **spec.args,
                    **options,
                )
