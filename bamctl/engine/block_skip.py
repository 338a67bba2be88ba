"""Certified block skipping: the bound that lets a kernel leave out a key block whose softmax mass
is provably below ``EPSILON`` of its rows' totals (docs/engine.md, "Certified block skipping").

For query row ``r`` (absolute position ``i``) the logits are those of ``bamctl.attention_math``:
``l = (s + b) c`` (SSMax over the logits), ``s c + b`` (over the content), ``s + b`` (no SSMax),
``s = q . k / sqrt(Dh)``, ``b = b_h(i - j)``, ``c = c_h(i) = s_h log(i + 1)``. A key block whose
keys are all in the row's past is skipped for a block of rows when, for every row,

    upper_r + margin(i) + slack < lower_r,     margin(i) = EPSILON_NATS + log(i + 1),

``upper_r`` an upper bound on every logit of the row in the block (``logit_upper_bound``) and
``lower_r`` a logit of the row already computed (a lower bound on its maximum). The row sees
``i + 1`` keys, so at most that many are skipped, each with weight below
``exp(lower_r - margin(i)) <= exp(max_r) 2^-40 / (i + 1)``: together below ``2^-40`` of the row's
total ``sum_j exp(l_rj) >= exp(max_r)``.

Everything here is a pure function of tensors; the kernels (blockwise, native, flex) use it or,
in C++, the same formula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from bamctl.attention_math import AttentionInputs

# The C++ kernel keeps a copy, kEpsilonNats in csrc/bam_attention.cpp (its source names its build and
# the compute version of its rows); tests/test_skip_bound.py holds both to 40 ln 2.
EPSILON_BITS = 40
EPSILON = 2.0 ** -EPSILON_BITS  # the skipped mass's bound, a fraction of the row's total
EPSILON_NATS = EPSILON_BITS * math.log(2.0)  # 27.73: log(1 / EPSILON)
SLACK = 1e-5  # relative: float32 rounding in the bound and in the logit it is compared with
MODES = ("auto", "off")


def check_mode(mode: str) -> str:
    """``--block-skip``: ``auto`` (skip what the bound allows) or ``off`` (read every causal key block)."""
    if mode not in MODES:
        from bamctl.errors import BamctlError

        raise BamctlError(f"--block-skip must be one of {', '.join(MODES)}, not {mode!r}")
    return mode


def attempts(inputs: AttentionInputs, mode: str) -> bool:
    """Whether a kernel tries to skip: only with ``auto`` and a bias read from a distance table.

    Without a bias (nope, rope, xpos, sinusoidal; their SSMax twins too) no block is far enough
    below the diagonal to be worth the test; a prior that depends on the query (FIRE) or on the
    content (CoPE) gives no table to bound a block's bias by.
    """
    return (mode == "auto" and inputs.bias_table is not None and inputs.query_prior is None
            and inputs.content_prior is None)


def skip_margin(positions: torch.Tensor) -> torch.Tensor:
    """``EPSILON_NATS + log(i + 1)`` per absolute query position ``i`` (``i + 1`` keys visible)."""
    return EPSILON_NATS + torch.log(positions.to(torch.float32) + 1.0)


def logit_upper_bound(
    q_norm: torch.Tensor, key_norm: torch.Tensor, bias_max: torch.Tensor, bias_min: torch.Tensor,
    factor: torch.Tensor | None = None, scope: str = "logits",
) -> torch.Tensor:
    """An upper bound on every logit of a row over a key block (all arguments broadcast together).

    ``q_norm``: ``|q_r| / sqrt(Dh)``; ``key_norm``: the block's largest ``|k_j|``, so
    ``|s| <= q_norm key_norm`` (Cauchy-Schwarz); ``bias_max`` / ``bias_min``: the largest and
    smallest bias the row can meet in the block; ``factor``: ``c_h(i)``, or None without SSMax.

    - no SSMax: ``l = s + b <= q_norm key_norm + bias_max``;
    - ``scope="content"``: ``l = s c + b <= |c| q_norm key_norm + bias_max``;
    - ``scope="logits"``: ``l = s c + b c``; ``s c <= |c| q_norm key_norm`` for either sign, and
      ``b c`` is largest at ``bias_max`` when ``c >= 0``, at ``bias_min`` when ``c < 0`` (a negative
      factor makes the most negative bias the largest logit).
    """
    content = q_norm * key_norm
    if factor is None:
        return content + bias_max
    if scope == "content":
        return factor.abs() * content + bias_max
    return factor.abs() * content + torch.where(factor >= 0, factor * bias_max, factor * bias_min)


def negligible(upper: torch.Tensor, lower: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Per row, whether a block whose logits are at most ``upper`` may be left out, given a computed
    logit ``lower`` of the row at absolute position ``positions``. A row with no logit yet
    (``lower = -inf``) or a bound that is not finite never allows it."""
    slack = SLACK * (upper.abs() + lower.abs())
    return (upper + skip_margin(positions) + slack < lower) & torch.isfinite(upper) & torch.isfinite(lower)


def block_bias_range(table: torch.Tensor, first: int, rows: int, starts: torch.Tensor, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(max, min), each (H, n), of the bias ``b_h(i - j)`` over rows ``first .. first + rows - 1`` and the
    key blocks ``[starts[n], starts[n] + cols)``: the distances ``first - starts[n] - cols + 1`` to
    ``first + rows - 1 - starts[n]``, clamped to the table (the engine sizes tables to cover them).

    Distances below 0 (keys in a row's future) are clamped to 0 and so bound the bias of the
    diagonal too: a caller skips only blocks wholly in the past, where none is below 1.
    """
    last = table.shape[1] - 1
    span = rows + cols - 1
    nearest = first - (starts + cols - 1)  # (n,) each block's smallest distance
    distance = (nearest[:, None] + torch.arange(span, device=table.device)[None, :]).clamp_(0, last)  # (n, span)
    values = table[:, distance]  # (H, n, span)
    return values.amax(-1), values.amin(-1)


def skipped_mass_bound(upper: torch.Tensor, counts: torch.Tensor, logsumexp: torch.Tensor) -> torch.Tensor:
    """Per row, ``sum_b counts_b exp(upper_b) / exp(logsumexp)``: the largest share of the row's
    softmax mass the blocks with bounds ``upper`` (..., n) and ``counts`` keys could hold."""
    return torch.exp(torch.logsumexp(upper + torch.log(counts.to(upper.dtype)), -1) - logsumexp)


@dataclass
class BlockCounts:
    """Key blocks a kernel skipped and considered, per sequence of the batch it was last given.

    A kernel adds to it on every call; the engine reads and clears it per request
    (``StreamingEngine.block_counts``)."""

    skipped: list[int] = field(default_factory=list)
    total: list[int] = field(default_factory=list)

    def add(self, skipped, total) -> None:
        """Add per-sequence counts (sequences of ints or (B,) tensors)."""
        skipped, total = [int(x) for x in skipped], [int(x) for x in total]
        grow = len(skipped) - len(self.skipped)
        if grow > 0:
            self.skipped += [0] * grow
            self.total += [0] * grow
        for b, (s, t) in enumerate(zip(skipped, total)):
            self.skipped[b] += s
            self.total[b] += t

    def take(self) -> list[tuple[int, int]]:
        """(skipped, total) per sequence so far; clears the counts."""
        out = list(zip(self.skipped, self.total))
        self.skipped, self.total = [], []
        return out
