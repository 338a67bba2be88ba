"""Progress of one evaluation: an ETA from the plan's token cost, and a line per finished cell.

A sample's time is not constant: the projections and the MLP cost about the same per
token at every length, while attention costs more per token the longer the context, and
a generated answer adds about the same at every length, so a prompt of L tokens costs
about ``c + a·L + b·L²`` seconds. Counting samples, a run from 1k to 512k would look
nearly finished after its short lengths with hours left. Here the rows still to compute
are priced by that formula, ``c``, ``a`` and ``b`` fitted by non-negative least squares to
the rows finished so far (a prior shape until two lengths are timed; past the longest length
timed, the fit's price there grown by that prior shape), and rows a run skips (stored
already) are dropped from the price as the run passes them.

With stderr a terminal the rich bar shows that ETA; otherwise (a log file, a batch job)
one line is printed per finished cell: a run of consecutive samples of one seed and
length, the order the plan computes them in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

# Context length at which attention's share of a token's cost equals everything else's: the
# prior shape until the run has timed two lengths. Dense attention's FLOPs balance at about
# 12x the model width (1.5k for the references' 128); the native kernel skips the key blocks
# a steep prior zeroes, which moves it out (bam-ssmax, 1k to 32k: 54x the time per sample).
PRIOR_BALANCE = 4096
# A generated token costs about as much as this many prompt tokens prefilled: one token through
# every weight matrix as a vector, not in a block (bamctl's reference models on a CPU).
DECODE_STEP_TOKENS = 64
# Rows left past this many times the longest length timed: the ETA is said to be an extrapolation.
EXTRAPOLATION = 4


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


# The terms a sample's time is fitted with (L in units of 1,024 tokens, for conditioning):
# a constant (answer generation, per-sample overhead), the linear work, attention's square.
TERMS = (0, 1, 2)
# Subsets of TERMS tried, in the order a tie (rows at too few lengths to tell) is broken:
# prefill's physics first, the constant alone last.
SUBSETS = ((1, 2), (0, 2), (0, 1), (0, 1, 2), (2,), (1,), (0,))


def prior_cost(length: int, new_tokens: int) -> float:
    """The cost shape assumed before two lengths are timed, in prefill-token units: the prompt's
    tokens, attention's growing share, and each generated token as DECODE_STEP_TOKENS of them."""
    return length * (1 + length / PRIOR_BALANCE) + new_tokens * DECODE_STEP_TOKENS


@dataclass
class CostFit:
    """Non-negative least squares ``seconds ≈ c + a·L + b·L²`` over the timed rows.

    With one length timed the data cannot tell the terms apart: ``prior_cost`` is scaled to
    it instead (``new_tokens``: the answer budget a sample generates, 0 when it is fed).
    """

    new_tokens: int = 0
    powers: list = field(default_factory=lambda: [0.0] * 5)  # Σ x^k, k = 0..4
    moments: list = field(default_factory=lambda: [0.0] * 3)  # Σ s·x^k, k = 0..2
    squares: float = 0.0  # Σ s²
    prior: list = field(default_factory=lambda: [0.0, 0.0])  # Σ s·p, Σ p² for the prior shape p
    lengths: set = field(default_factory=set)

    def add(self, length: int, seconds: float) -> None:
        x = length / 1024
        for k in range(5):
            self.powers[k] += x**k
        for k in range(3):
            self.moments[k] += seconds * x**k
        self.squares += seconds * seconds
        shape = prior_cost(length, self.new_tokens)
        self.prior[0] += seconds * shape
        self.prior[1] += shape * shape
        self.lengths.add(length)

    def timed(self) -> bool:
        return self.powers[0] > 0

    def price(self, length: int) -> float | None:
        """Seconds of one sample of ``length``; None before any row is timed. Within the lengths
        timed, the fit; past the longest, the fit's price there grown by the prior shape
        (``prior_cost``), never by the fit's own curve: a quadratic term fitted to short lengths
        is mostly noise, and extrapolated 64x it swung the design card's ETA (1k..512k) by 3-14x
        from one cell to the next; anchored, it moves by < 1.3x on bam-ssmax's measured costs."""
        if not self.timed():
            return None
        coefficients = self.coefficients()
        if coefficients is None:  # one length timed: the prior shape, scaled to it by least squares
            return self.prior[0] / self.prior[1] * prior_cost(length, self.new_tokens)
        longest = max(self.lengths)
        if length > longest:
            return self._fitted(longest, coefficients) * prior_cost(length, self.new_tokens) / prior_cost(longest, self.new_tokens)
        return self._fitted(length, coefficients)

    @staticmethod
    def _fitted(length: int, coefficients) -> float:
        x = length / 1024
        return sum(c * x**k for k, c in zip(TERMS, coefficients))

    def coefficients(self) -> tuple[float, float, float] | None:
        """(c, a, b) per 1,024 tokens, or None while fewer than two lengths are timed."""
        if len(self.lengths) < 2:
            return None
        best, best_residual = None, math.inf
        for subset in SUBSETS:
            solved = _solve([[self.powers[i + j] for j in subset] for i in subset], [self.moments[i] for i in subset])
            if solved is None or min(solved) < 0:
                continue
            theta = dict(zip(subset, solved))
            full = [theta.get(k, 0.0) for k in TERMS]
            residual = self.squares - 2 * sum(t * m for t, m in zip(full, self.moments)) + sum(
                full[i] * full[j] * self.powers[i + j] for i in TERMS for j in TERMS)
            if residual < best_residual - 1e-9 * max(self.squares, 1e-12):
                best, best_residual = tuple(full), residual
        return best  # (0, 0, 0) fits at worst: some subset always solves


def _solve(matrix: list[list[float]], vector: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None for a singular system."""
    n = len(vector)
    rows = [list(map(float, row)) + [float(v)] for row, v in zip(matrix, vector)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(rows[r][col]))
        if abs(rows[pivot][col]) < 1e-12 * max(1.0, max(abs(v) for row in rows for v in row[:n])):
            return None
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(n):
            if r != col:
                factor = rows[r][col] / rows[col][col]
                rows[r] = [a - factor * b for a, b in zip(rows[r], rows[col])]
    return [rows[i][n] / rows[i][i] for i in range(n)]


class RunProgress:
    """Follows one evaluation's rows as they are written; ``eta()`` prices what is left."""

    def __init__(self, slots, label: str, say: Callable[[str], None] | None = None):
        self.cells = cells_of(slots)
        self.label, self.say = label, say
        self.fit = CostFit(new_tokens=max((slot.max_new_tokens for slot in slots if slot.scoring == "generate"), default=0))
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

    def finish(self, interrupted: bool = False) -> None:
        """The run ended: every cell is resolved, and the last one with rows gets its line. An
        interrupted run (Ctrl-C, an error) resolves nothing it did not reach: the cell it was in
        says how many of its rows were computed and how many were not, and the cells after it
        stay unresolved, so the run's share done counts only what was computed or passed."""
        if not interrupted:
            for index in range(self.current, len(self.cells)):
                self._close(index)
            self.current = len(self.cells)
            return
        cell = self.cells[self.current] if self.current < len(self.cells) else None
        if cell is not None and not cell.closed and cell.written and self.say is not None:
            cell.closed = True
            self.say(self.cell_line(cell) if cell.written == cell.rows else self.interrupted_line(cell))

    def eta(self) -> float | None:
        """Seconds left by the fitted cost of the rows not yet resolved; None before a row is timed."""
        if not self.fit.timed():
            return None
        return sum((cell.rows - cell.seen) * self.fit.price(cell.length) for cell in self.cells[self.current:])

    def done_fraction(self) -> float:
        """The share of the run's cost resolved so far, by the fitted (or prior) price."""
        if not self.fit.timed():
            price = [prior_cost(cell.length, self.fit.new_tokens) for cell in self.cells]
        else:
            price = [self.fit.price(cell.length) for cell in self.cells]
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

    def extrapolated_from(self) -> int | None:
        """The longest length timed, when the rows left reach past EXTRAPOLATION times it: the ETA
        then rests on the fit's extrapolation (attention's share at lengths not yet seen)."""
        if not self.fit.lengths:
            return None
        timed = max(self.fit.lengths)
        left = [cell.length for cell in self.cells[self.current:] if cell.seen < cell.rows]
        return timed if left and max(left) > EXTRAPOLATION * timed else None

    def cell_line(self, cell: Cell) -> str:
        from bamctl.results.render import format_length

        skipped = f" ({cell.rows - cell.written} stored already)" if cell.written < cell.rows else ""
        left = self.eta()
        eta = f", about {format_seconds(left)} left" if left is not None else ""
        timed = self.extrapolated_from()
        if left is not None and timed is not None:
            eta += f" (extrapolated from lengths up to {format_length(timed)})"
        return (f"{self._where(cell)}: {cell.written} sample{'s' if cell.written != 1 else ''}{skipped} in "
                f"{format_seconds(cell.seconds)}{self._rate(cell)}; {self.done_fraction():.0%} of the run done{eta}")

    def interrupted_line(self, cell: Cell) -> str:
        missing = cell.rows - cell.written
        return (f"{self._where(cell)}: interrupted, {cell.written} sample{'s' if cell.written != 1 else ''} computed in "
                f"{format_seconds(cell.seconds)}{self._rate(cell)} and {missing} not (stored already or still to "
                f"compute); {self.done_fraction():.0%} of the run done")

    def _where(self, cell: Cell) -> str:
        from bamctl.results.render import format_length

        return f"{self.label} {format_length(cell.length)}" + (f" seed {cell.seed}" if self.seeds > 1 else "")

    @staticmethod
    def _rate(cell: Cell) -> str:
        return f", {cell.tokens / cell.seconds:,.0f} tok/s" if cell.seconds > 0 else ""


def format_seconds(seconds: float) -> str:
    """h:mm:ss, as rich's columns write it."""
    whole = int(round(seconds))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def progress_display(console, quiet: bool):
    """The bar on a terminal or in a notebook; elsewhere (a log file) it is off, and each finished
    cell prints a line."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TextColumn("eta {task.fields[eta]}"),  # priced by length (RunProgress), not by sample count
        console=console,
        disable=quiet or not (console.is_terminal or console.is_jupyter),
        transient=False,
    )
