"""Progress of one evaluation: an ETA from the plan's token cost, and a line per finished cell.

A sample's time is not constant: the projections and the MLP cost about the same per
token at every length, while attention costs more per token the longer the context, so
a prompt of L tokens costs about ``a·L + b·L²`` seconds. Counting samples, a run from
1k to 512k would look nearly finished after its short lengths with hours left. Here the
rows still to compute are priced by that formula; ``a`` and ``b`` are fitted by least
squares to the rows finished so far (a prior ratio until two lengths are timed), and
rows a run skips (stored already) are dropped from the price as the run passes them.

With stderr a terminal the rich bar shows that ETA; otherwise (a log file, a batch job)
one line is printed per finished cell: a run of consecutive samples of one seed and
length, the order the plan computes them in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

# Context length at which attention's share of a token's cost equals everything else's: the
# prior shape until the run has timed two lengths. About 6x the model width for a dense
# transformer; 1,024 fits bamctl's reference models (width 128) measured on a CPU.
PRIOR_BALANCE = 1024


@dataclass
class Cell:
    """Consecutive slots of one seed and length: rows planned, rows seen written, their time."""

    seed: int
    length: int
    rows: int
    written: int = 0
    seen: int = 0  # rows written, plus rows the run must have skipped once it is passed
    seconds: float = 0.0
    tokens: int = 0
    closed: bool = False


def cells_of(slots) -> list[Cell]:
    """The plan's slots grouped into cells, in the order the run visits them."""
    cells: list[Cell] = []
    for slot in slots:
        if cells and (cells[-1].seed, cells[-1].length) == (slot.seed, slot.length):
            cells[-1].rows += len(slot.rows)
        else:
            cells.append(Cell(slot.seed, slot.length, len(slot.rows)))
    return cells


@dataclass
class CostFit:
    """Least-squares ``seconds ≈ a·L + b·L²`` over timed rows, with both coefficients kept >= 0."""

    sums: dict = field(default_factory=lambda: dict.fromkeys(("11", "12", "22", "s1", "s2"), 0.0))
    lengths: set = field(default_factory=set)

    def add(self, length: int, seconds: float) -> None:
        x1, x2 = float(length), float(length) ** 2
        for key, value in (("11", x1 * x1), ("12", x1 * x2), ("22", x2 * x2), ("s1", seconds * x1), ("s2", seconds * x2)):
            self.sums[key] += value
        self.lengths.add(length)

    def coefficients(self) -> tuple[float, float] | None:
        """(a, b), or None before any row is timed."""
        s = self.sums
        if s["11"] == 0:
            return None
        if len(self.lengths) >= 2:
            det = s["11"] * s["22"] - s["12"] ** 2
            if det > 0:
                a = (s["s1"] * s["22"] - s["s2"] * s["12"]) / det
                b = (s["s2"] * s["11"] - s["s1"] * s["12"]) / det
                if a >= 0 and b >= 0:
                    return a, b
        # One length timed, or a fit that went negative: the prior shape, scaled to the rows timed.
        # seconds = k·(L + L²/P): least squares over k.
        shape = (s["11"] + 2 * s["12"] / PRIOR_BALANCE + s["22"] / PRIOR_BALANCE**2)
        k = (s["s1"] + s["s2"] / PRIOR_BALANCE) / shape
        return max(k, 0.0), max(k, 0.0) / PRIOR_BALANCE


class RunProgress:
    """Follows one evaluation's rows as they are written; ``eta()`` prices what is left."""

    def __init__(self, slots, label: str, say: Callable[[str], None] | None = None):
        self.cells = cells_of(slots)
        self.label, self.say = label, say
        self.fit = CostFit()
        self.current = 0  # the cell the last row belonged to
        self.seeds = len({cell.seed for cell in self.cells})

    def row_written(self, row: dict) -> None:
        """A row of the run was written: time it, and close the cells the run has passed."""
        index = self._cell_of(row["seed"], row["length"])
        for passed in range(self.current, index):
            self._close(passed)
        self.current = index
        cell = self.cells[index]
        cell.written += 1
        cell.seen += 1
        cell.seconds += row["seconds"]
        cell.tokens += row["n_tokens"]
        self.fit.add(row["length"], row["seconds"])

    def finish(self) -> None:
        """The run ended: every cell is resolved, and the last one with rows gets its line."""
        for index in range(self.current, len(self.cells)):
            self._close(index)
        self.current = len(self.cells)

    def eta(self) -> float | None:
        """Seconds left by the fitted cost of the rows not yet resolved; None before a row is timed."""
        coefficients = self.fit.coefficients()
        if coefficients is None:
            return None
        a, b = coefficients
        return sum((cell.rows - cell.seen) * (a * cell.length + b * cell.length**2) for cell in self.cells[self.current:])

    def done_fraction(self) -> float:
        """The share of the run's cost resolved so far, by the fitted (or prior) price."""
        a, b = self.fit.coefficients() or (1.0, 1.0 / PRIOR_BALANCE)
        price = [a * cell.length + b * cell.length**2 for cell in self.cells]
        total = sum(cell.rows * p for cell, p in zip(self.cells, price))
        done = sum(cell.seen * p for cell, p in zip(self.cells, price))
        return done / total if total else 1.0

    def _cell_of(self, seed: int, length: int) -> int:
        """The cell a row belongs to: the current one, or the next of its seed and length (rows come in plan order)."""
        for index in range(self.current, len(self.cells)):
            cell = self.cells[index]
            if (cell.seed, cell.length) == (seed, length) and cell.seen < cell.rows:
                return index
        return self.current  # not in the plan's order: count it where the run is

    def _close(self, index: int) -> None:
        cell = self.cells[index]
        if cell.closed:
            return
        cell.closed, cell.seen = True, cell.rows  # the rows not written were stored already and skipped
        if cell.written and self.say is not None:  # a cell wholly stored already says nothing
            self.say(self.cell_line(cell))

    def cell_line(self, cell: Cell) -> str:
        from bamctl.results.render import format_length

        seed = f" seed {cell.seed}" if self.seeds > 1 else ""
        rate = f", {cell.tokens / cell.seconds:,.0f} tok/s" if cell.seconds > 0 else ""
        skipped = f" ({cell.rows - cell.written} stored already)" if cell.written < cell.rows else ""
        left = self.eta()
        eta = f", about {format_seconds(left)} left" if left is not None else ""
        return (f"{self.label} {format_length(cell.length)}{seed}: {cell.written} sample{'s' if cell.written != 1 else ''}{skipped} in "
                f"{format_seconds(cell.seconds)}{rate}; {self.done_fraction():.0%} of the run done{eta}")


def format_seconds(seconds: float) -> str:
    """h:mm:ss, as rich's columns write it."""
    whole = int(round(seconds))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"
