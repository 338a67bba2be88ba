"""Checks a run makes before any model loads, each a pure function of what was asked."""

from __future__ import annotations

import dataclasses
from typing import Callable

from bamctl.errors import BamctlError

PLANNING_TOKENIZER = "gpt2"  # plans are checked in it before any model loads: the tokenizer of bamctl's own models


def refuse_beyond_max(request, labels: list[str], peeks, run) -> None:
    """``--beyond-max refuse``: a length past a model's configured maximum stops the run before any work."""
    if run.beyond_max != "refuse":
        return
    longest = max(request.lengths)
    for label, peek in zip(labels, peeks):
        if peek.max_length is not None and longest > peek.max_length:
            raise BamctlError(
                f"--lengths reach {longest:,} tokens, past {label}'s configured maximum of {peek.max_length:,} "
                "positions (--beyond-max refuse); use shorter --lengths or --beyond-max warn"
            )


def refuse_mixed_vocabularies(names: list[str], peeks) -> None:
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


def start_where_each_task_builds(requests, plans, say: Callable[[str], None]):
    """Default lengths (1x the training length and up) may begin below what a task's prompt needs
    (RULER's template alone is longer than 128 tokens): such a task starts at its shortest length
    that builds, and says so. Asked-for lengths are never changed (a too-short one is an error)."""
    from bamctl.results.render import format_length
    from bamctl.tokenizer import get_tokenizer

    kept_requests, kept_plans = [], []
    for request, plan in zip(requests, plans):
        first = plan.shortest_buildable_length()
        if first is not None and first > min(request.lengths):
            request = dataclasses.replace(request, lengths=[n for n in request.lengths if n >= first])
            plan = request.plan(get_tokenizer(PLANNING_TOKENIZER), check_tokenizer=False)
            say(f"{request.task}: the default lengths start at {format_length(first)}, the shortest its "
                "prompt fits in (--lengths chooses others)")
        kept_requests.append(request)
        kept_plans.append(plan)
    return kept_requests, kept_plans


def planned_lengths_line(requests, plans, peeks) -> str:
    """Without --lengths, what the defaults plan, said before a long run starts."""
    from bamctl.results.render import format_length

    lengths = sorted({length for r in requests for length in r.lengths})
    base = min(p.train_length for p in peeks)
    samples = sum(len(plan.slots) for plan in plans)
    return (
        f"planning {len(lengths)} lengths, {format_length(lengths[0])} to {format_length(lengths[-1])} "
        f"(1x to {lengths[-1] // base}x the training length {base:,}), {samples:,} samples per model; "
        "--lengths chooses others"
    )
