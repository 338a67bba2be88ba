"""Sizing a prompt to a length in tokens, over one integer: noise lines, words, haystack units.

A generator describes its prompt at size ``n`` by ``tokens(n)`` (a real encode) and, for
bamctl's exact sizing, a cheap monotone ``estimate(n)`` of the variable part's tokens.
Two rules:

* ``exact`` (bamctl's): the largest ``n`` whose prompt plus the answer budget fits the
  length, found from the estimate and confirmed by a few real encodes;
* ``ruler``: RULER's own rules, which differ per task; the two shapes they share are
  here (a binary search between bounds, then a fixed step down per sample).
"""

from __future__ import annotations

from typing import Callable

from bamctl.errors import BamctlError

SIZINGS = ("exact", "ruler")


def check_sizing(sizing: str) -> None:
    if sizing not in SIZINGS:
        raise BamctlError(f"--sizing must be one of {', '.join(SIZINGS)}, not {sizing!r}")


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
    """RULER's per-sample rule: from ``start``, ``step`` fewer while the sample overflows.

    RULER stops stepping at one step and then retries forever; here that is an error
    naming ``what``.
    """
    used = start
    while total(used) > limit:
        if used <= step:
            raise BamctlError(f"{what} does not fit with RULER's sizing (steps of {step})")
        used -= step
    return used
