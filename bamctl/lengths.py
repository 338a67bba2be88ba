"""Parse ``--lengths`` and ``--depths``: the grids every task command sweeps.

Lengths are token counts; ``k`` means 1,024 (``4k`` = 4096), so a doubling range
lands on the powers of two that papers report. Results always record the exact
integers this module returns.
"""

from __future__ import annotations

import re

from bamctl.errors import BamctlError

KIBI = 1024
# A range may double at most this many times; beyond it a typo ("1..512kk") is likelier than intent.
MAX_RANGE_STEPS = 64
_SIZE = re.compile(r"^(\d+)(k?)$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"4k"`` -> 4096, ``"3000"`` -> 3000; anything else is an error naming the text."""
    match = _SIZE.match(text.strip())
    if not match:
        raise BamctlError(
            f"bad length {text!r}: use an integer or a number with k (k = 1024), e.g. 3000 or 4k"
        )
    value = int(match.group(1)) * (KIBI if match.group(2) else 1)
    if value <= 0:
        raise BamctlError(f"bad length {text!r}: lengths must be positive")
    return value


def _doubling(first: int, last: int, spec: str) -> list[int]:
    if first > last:
        raise BamctlError(f"bad length range {spec!r}: the start is larger than the end")
    values = [first]
    while values[-1] * 2 <= last:
        values.append(values[-1] * 2)
        if len(values) > MAX_RANGE_STEPS:
            raise BamctlError(f"bad length range {spec!r}: too many doublings")
    if values[-1] != last:
        raise BamctlError(
            f"bad length range {spec!r}: doubling {first} never reaches {last} "
            f"(closest: {values[-1]}); list the lengths with commas instead"
        )
    return values


def parse_lengths(spec: str) -> list[int]:
    """Target lengths in tokens, in the order given, duplicates dropped.

    ``"1k..512k"`` doubles from 1,024 to 524,288; ``"512..8k"`` from 512 to 8,192;
    ``"1k,3000,10k"`` is a plain list; items can mix (``"1k..4k,6000"``).
    """
    if not spec or not spec.strip():
        raise BamctlError("no lengths given: use e.g. 1k..32k or 1k,3000,10k")
    lengths: list[int] = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            raise BamctlError(f"bad lengths {spec!r}: empty item between commas")
        if ".." in item:
            first, _, last = item.partition("..")
            values = _doubling(parse_size(first), parse_size(last), item)
        else:
            values = [parse_size(item)]
        lengths.extend(value for value in values if value not in lengths)
    return lengths


def parse_depths(spec: str) -> list[float]:
    """Needle depths as fractions in [0, 1].

    A bare integer ``"5"`` means that many evenly spaced depths, ends included
    (0, 0.25, 0.5, 0.75, 1); ``"1"`` is the middle. A comma list (``"0,0.25,0.5"``)
    or any value with a decimal point is taken as explicit fractions.
    """
    text = (spec or "").strip()
    if not text:
        raise BamctlError("no depths given: use a count (e.g. 5) or fractions (e.g. 0,0.5,1)")
    if "," not in text and re.fullmatch(r"\d+", text):
        count = int(text)
        if count < 1:
            raise BamctlError(
                f"bad depths {spec!r}: a bare integer is a number of depths; write 0.0 for the start"
            )
        if count == 1:
            return [0.5]
        return [round(i / (count - 1), 10) for i in range(count)]
    depths: list[float] = []
    for item in text.split(","):
        item = item.strip()
        try:
            value = float(item)
        except ValueError:
            raise BamctlError(
                f"bad depth {item!r} in {spec!r}: depths are fractions in [0, 1], e.g. 0,0.25,0.5"
            ) from None
        if not 0.0 <= value <= 1.0:
            raise BamctlError(f"bad depth {item!r} in {spec!r}: depths are fractions in [0, 1]")
        if value not in depths:
            depths.append(value)
    return depths
