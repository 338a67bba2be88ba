"""Sizing a prompt to a length in tokens, over one integer: noise lines, words, haystack units.

A generator describes its prompt by :class:`PromptSizes`: ``tokens(n)`` (a real encode),
a cheap monotone ``estimate(n)`` of the variable part's tokens, and RULER's search for
its task. ``size_prompt`` picks the rule from ``SIZINGS``, the one place a rule is chosen:

* ``exact`` (bamctl's): the largest ``n`` whose prompt plus the answer budget fits the
  length, found from the estimate and confirmed by a few real encodes;
* ``ruler``: RULER's own rules: a search once per length, which differs per task (the
  shared binary search is here), then a fixed step down per sample that overflows.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from bamctl.errors import BamctlError
from bamctl.tasks.sample import SampleSlot


@dataclass(frozen=True)
class PromptSizes:
    """One sample's prompt as a function of its size ``n`` (noise lines, words, haystack units),
    with what each sizing rule needs of it."""

    slot: SampleSlot
    tokens: Callable[[int], int]  # the prompt's tokens at size n: a real encode
    estimate: Callable[[int], int]  # exact: cheap, monotone tokens of the variable part at size n
    without: str  # exact: what the prompt is at its smallest size ("without haystack"), for the error
    ruler_search: Callable[[SampleSlot], int]  # ruler: the size RULER's once-per-length search finds on a probe
    ruler_step: int  # ruler: units fewer per retry
    smallest: int = 0  # the smallest size a prompt can have

    @property
    def budget(self) -> int:
        """Tokens the prompt may hold: the length less the answer budget inside it."""
        return self.slot.length - self.slot.max_new_tokens


def _exact(sizes: PromptSizes) -> int:
    slot, low = sizes.slot, sizes.smallest
    return low + size_exact(
        lambda k: sizes.tokens(low + k),
        lambda k: sizes.estimate(low + k) - sizes.estimate(low),
        sizes.budget,
        f"length {slot.length} is too short for {slot.task}: the prompt {sizes.without} already needs "
        f"{{needed}} tokens besides the {slot.max_new_tokens}-token answer budget",
    )


def _ruler(sizes: PromptSizes) -> int:
    slot = sizes.slot
    searched = sizes.ruler_search(ruler_probe(slot))
    return ruler_step_down(sizes.tokens, sizes.budget, searched, sizes.ruler_step, f"length {slot.length} of {slot.task}")


SIZINGS: dict[str, Callable[[PromptSizes], int]] = {"exact": _exact, "ruler": _ruler}


def check_sizing(sizing: str) -> None:
    if sizing not in SIZINGS:
        raise BamctlError(f"--sizing must be one of {', '.join(SIZINGS)}, not {sizing!r}")


def size_prompt(sizing: str, sizes: PromptSizes) -> int:
    """The sample's size under ``sizing``: bamctl's exact fit, or RULER's search and retries."""
    check_sizing(sizing)
    return SIZINGS[sizing](sizes)


def ruler_probe(slot: SampleSlot) -> SampleSlot:
    """The sample RULER's once-per-length search runs on: one of no index, no asked depth."""
    return replace(slot, index=-1, depth=None, depth_grid=None)


def size_exact(tokens: Callable[[int], int], estimate: Callable[[int], int], budget: int, too_short: str) -> int:
    """The largest ``n`` with ``tokens(n) <= budget`` (and ``tokens(n + 1) > budget``).

    ``too_short`` is the error when even ``n = 0`` does not fit; ``{needed}`` in it is
    replaced by the tokens of the prompt at size 0.
    """
    sizes: dict[int, int] = {}

    def measured(n: int) -> int:
        if n not in sizes:
            sizes[n] = tokens(n)
        return sizes[n]

    n = largest_fit(lambda n: measured(n) <= budget, estimate, budget - measured(0))
    if n < 0:
        raise BamctlError(too_short.format(needed=sizes[0]))
    return n


def largest_fit(fits: Callable[[int], bool], estimate: Callable[[int], int], room: int) -> int:
    """Largest n >= 0 with fits(n) and not fits(n + 1); -1 when even n = 0 does not fit.

    ``estimate(n)`` (monotone, cheap) is the variable part's token count; a binary search
    on it gives a starting point, then real checks gallop to the exact boundary.
    """
    if not fits(0):
        return -1
    low, high = 0, 1
    while estimate(high) <= room:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if estimate(middle) <= room else (low, middle)
    n = low
    if fits(n):
        step = 1
        while fits(n + step):
            n, step = n + step, step * 2
        # fits(n) and not fits(n + step): bisect the gap.
        low, high = n, n + step
    else:
        step = 1
        while n - step > 0 and not fits(n - step):
            step *= 2
        # fits(max(0, n - step)) (n = 0 always fits) and not fits(n - step // 2).
        low, high = max(0, n - step), n - step // 2 if step > 1 else n
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def ruler_bisect(total: Callable[[int], int], limit: int, lower: int, upper: int, fallback: int) -> int:
    """RULER's search: the largest n in [lower, upper] with ``total(n) <= limit`` by bisection
    (assuming totals grow with n, as RULER does), else ``fallback``."""
    best = None
    while lower <= upper:
        middle = (lower + upper) // 2
        if total(middle) <= limit:
            best, lower = middle, middle + 1
        else:
            upper = middle - 1
    return fallback if best is None else best


def ruler_step_down(total: Callable[[int], int], limit: int, start: int, step: int, what: str) -> int:
    """RULER's per-sample rule: from ``start``, ``step`` fewer while ``total`` exceeds ``limit``.

    RULER stops stepping at one step and then retries forever; here that is an error
    naming ``what``.
    """
    used = start
    while total(used) > limit:
        if used <= step:
            raise BamctlError(f"{what} does not fit with RULER's sizing (steps of {step})")
        used -= step
    return used
