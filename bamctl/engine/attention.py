"""Causal attention kernels with a distance prior and SSMax, behind one signature.

Every kernel computes, for query ``i`` (absolute position) and key ``j <= i``:

    s_ij = q_i . k_j / sqrt(Dh)
    l_ij = (s_ij + b_h(i - j)) * c_h(i)     SSMax over the logits (``ssmax_scope="logits"``)
    l_ij =  s_ij * c_h(i) + b_h(i - j)      SSMax over the content only (the authors' code)
    l_ij =  s_ij + b_h(i - j)               without SSMax

with ``b_h`` read from a per-head table ``(H, max_distance + 1)`` (or, for a prior that
depends on the query's position too, FIRE's, ``b_h(i, j)`` asked of the prior) and
``c_h(i) = s_h * log(i + 1)`` (i + 1 keys are visible to query i). Keys always start at
absolute position 0 (a KV cache); queries start at ``q_start``.

- ``dense``: materialises the (Tq, Tk) logits. The plain reference the tests trust.
- ``blockwise``: walks key blocks with an online softmax (running max, running sum),
  so the workspace is (Tq, block) whatever the context length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

EXP_FLOOR = -80.0  # see blockwise_attention


@dataclass(frozen=True)
class PiecewiseBias:
    """A query-dependent bias in the form a kernel can compute pair by pair:

        b_h(i, j) = slopes[h, s] * x + offsets[h, s],   x = line[i - j] / query_norm[i - q_start],

    with ``s`` the number of ``breaks`` strictly below ``x`` (``torch.bucketize``). ``line`` is
    increasing in the distance, so along a query's keys ``x`` is monotone and each piece covers
    one run of keys. FIRE is such a bias (``FIREPrior.kernel_form``).
    """

    line: torch.Tensor  # (D+1,) float32, ψ(d) for d = 0..D, shared by the heads
    query_norm: torch.Tensor  # (Tq,) float32, > 0: each query's divisor
    breaks: torch.Tensor  # (m,) float32, sorted
    slopes: torch.Tensor  # (H, m+1) float32
    offsets: torch.Tensor  # (H, m+1) float32


@dataclass(frozen=True)
class AttentionInputs:
    """Everything position-dependent a kernel needs besides q, k, v."""

    q_start: int  # absolute position of the first query
    bias_table: torch.Tensor | None  # (H, D+1) float32, b_h(d) for d = 0..D
    ssmax_scale: torch.Tensor | None  # (H,) s_h, or None without SSMax
    ssmax_scope: str = "logits"  # "logits" (content + prior) or "content"
    # A prior that depends on the query's position too (FIRE), instead of bias_table. Its
    # ``bias(q positions (Tq,), k positions (Tk,))`` -> (H, Tq, Tk) serves the dense and blockwise
    # kernels; its ``kernel_form(q positions, max distance)`` -> PiecewiseBias the native one.
    # fused and flex are refused it (bamctl.engine.stream).
    query_prior: QueryPrior | None = None

    @property
    def bias_for(self):
        """(q positions, k positions) -> (H, Tq, Tk) bias, from the table or the prior; None without a prior."""
        if self.query_prior is not None:
            return self.query_prior.bias
        if self.bias_table is None:
            return None
        table = self.bias_table
        return lambda q, k: table[:, (q[:, None] - k[None, :]).clamp(0, table.shape[1] - 1)]


class QueryPrior(Protocol):
    def bias(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor: ...

    def kernel_form(self, q_positions: torch.Tensor, max_distance: int) -> PiecewiseBias: ...


class AttentionKernel(Protocol):
    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor: ...


def ssmax_factor(inputs: AttentionInputs, n_queries: int, device) -> torch.Tensor:
    """(H, Tq) SSMax's c_h(i) = s_h * log(i + 1) for queries q_start .. q_start + Tq - 1."""
    positions = torch.arange(inputs.q_start, inputs.q_start + n_queries, device=device, dtype=torch.float32)
    return inputs.ssmax_scale.float()[:, None] * torch.log(positions + 1.0)[None, :]


def prior_line(table: torch.Tensor, top: int, length: int) -> torch.Tensor:
    """(H, length) with line[h, t] = b_h(top - t), the distance clamped to the table's range.

    Kernels walk keys forward through such a line: key j of query i reads t = top - (i - j).
    """
    distance = torch.arange(top, top - length, -1, device=table.device).clamp_(0, table.shape[1] - 1)
    return table[:, distance]


def _logits(
    scores: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor, inputs: AttentionInputs
) -> torch.Tensor:
    """Turn scaled dot products (B, H, Tq, Tk) into logits for queries and keys at these positions."""
    bias = None
    if inputs.bias_for is not None:
        bias = inputs.bias_for(q_positions, k_positions)  # (H, Tq, Tk)
    if inputs.ssmax_scale is None:
        return scores if bias is None else scores + bias
    factor = ssmax_factor(inputs, scores.shape[2], scores.device)[:, :, None]  # (H, Tq, 1)
    if bias is None:
        return scores * factor
    if inputs.ssmax_scope == "logits":
        return (scores + bias) * factor
    return scores * factor + bias


def attention_weights(q: torch.Tensor, k: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
    """Softmax weights (B, H, Tq, Tk), float32: where each query attends."""
    tq, tk = q.shape[2], k.shape[2]
    q_positions = torch.arange(inputs.q_start, inputs.q_start + tq, device=q.device)
    k_positions = torch.arange(tk, device=q.device)
    signed = q_positions[:, None] - k_positions[None, :]  # (Tq, Tk)
    scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    logits = _logits(scores, q_positions, k_positions, inputs)
    logits = logits.masked_fill(signed < 0, float("-inf"))
    return torch.softmax(logits, dim=-1)


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
    """Reference: full (Tq, Tk) logits, causal mask, softmax. q: (B, H, Tq, Dh), k/v: (B, H, Tk, Dh)."""
    return (attention_weights(q, k, inputs) @ v.float()).to(q.dtype)


def _toeplitz_bias(table: torch.Tensor, base: int, tq: int, tb: int) -> torch.Tensor:
    """Bias for keys taken in reverse order: out[h, i, r] = table[h, clamp(base + i + r, 0)].

    A distance-only bias is Toeplitz; with the key block reversed it becomes a Hankel
    matrix, which is a strided *view* of one short vector (no (Tq, Tb) gather).
    """
    index = torch.arange(base, base + tq + tb - 1, device=table.device).clamp_(min=0, max=table.shape[1] - 1)
    line = table[:, index].contiguous()  # (H, Tq + Tb - 1)
    return line.as_strided((table.shape[0], tq, tb), (line.stride(0), 1, 1))


def blockwise_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: AttentionInputs, block_size: int = 1024
) -> torch.Tensor:
    """Online-softmax attention over key blocks; never holds more than (Tq, block) logits.

    Each key block is walked in reverse order so that the prior is a strided view
    (see ``_toeplitz_bias``); the logits are then updated in place to keep memory
    traffic low on CPUs.
    """
    tq = q.shape[2]
    q_start = inputs.q_start
    last_key = q_start + tq  # keys beyond the last query are never visible
    qf = q.float() * (1.0 / math.sqrt(q.shape[-1]))
    factor = None
    if inputs.ssmax_scale is not None:
        factor = ssmax_factor(inputs, tq, q.device)[:, :, None]  # (H, Tq, 1)
    scale_bias = factor is not None and inputs.ssmax_scope == "logits"
    running_max = torch.full((*q.shape[:3], 1), float("-inf"), device=q.device)  # (B, H, Tq, 1)
    running_sum = torch.zeros_like(running_max)
    acc = torch.zeros(*q.shape[:3], v.shape[-1], device=q.device)  # (B, H, Tq, Dh)
    for start in range(0, last_key, block_size):
        stop = min(start + block_size, last_key)
        tb = stop - start
        k_block = k[:, :, start:stop].float().flip(2)  # reversed: key r is at position stop - 1 - r
        v_block = v[:, :, start:stop].float().flip(2)
        logits = qf @ k_block.transpose(-1, -2)  # (B, H, Tq, Tb)
        base = q_start - (stop - 1)  # distance of (query 0, reversed key 0)
        bias = None
        if inputs.query_prior is not None:  # depends on the query's position: computed for this block
            q_positions = torch.arange(q_start, q_start + tq, device=q.device)
            bias = inputs.query_prior.bias(q_positions, torch.arange(stop - 1, start - 1, -1, device=q.device))  # reversed keys
        elif inputs.bias_table is not None:
            bias = _toeplitz_bias(inputs.bias_table, base, tq, tb)
        if scale_bias and bias is not None:  # SSMax scope "logits": (content + prior) * factor
            logits.add_(bias).mul_(factor)
        else:  # scope "content" (the authors' ALiBi + SSMax) or no SSMax: content * factor + prior
            if factor is not None:
                logits.mul_(factor)
            if bias is not None:
                logits.add_(bias)
        future = None
        if base < 0:  # this block holds keys in the future of some queries
            future = (torch.arange(tq, device=q.device)[:, None] + torch.arange(tb, device=q.device)[None, :]) < -base
            logits.masked_fill_(future, float("-inf"))
        new_max = torch.maximum(running_max, logits.amax(dim=-1, keepdim=True))
        # Rows that have seen only masked keys keep max = -inf; exp(-inf - -inf) would be NaN.
        safe_max = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
        correction = torch.exp(running_max - safe_max)
        # exp() of values that underflow float32 takes a slow path (~15x slower on x86); below
        # -80 a weight is < 2e-35 of the row's largest, so flooring there changes nothing visible.
        weights = logits.sub_(safe_max).clamp_(min=EXP_FLOOR).exp_()
        if future is not None:
            weights.masked_fill_(future, 0.0)  # keep causality exact, not merely 1e-35-close
        running_sum = running_sum * correction + weights.sum(dim=-1, keepdim=True)
        acc = acc * correction + weights @ v_block
        running_max = new_max
    return (acc / running_sum).to(q.dtype)
