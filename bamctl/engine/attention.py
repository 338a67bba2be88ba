"""The engine's attention kernels beyond the dense reference, with the logits of
``bamctl.attention_math`` (the formula is there).

- ``blockwise``: walks key blocks with an online softmax (running max, running sum),
  so the workspace is (Tq, block) whatever the context length.
"""

from __future__ import annotations

import math

import torch

from bamctl.attention_math import AttentionInputs, ssmax_factor

EXP_FLOOR = -80.0  # see blockwise_attention


def prior_line(table: torch.Tensor, top: int, length: int) -> torch.Tensor:
    """(H, length) with line[h, t] = b_h(top - t), the distance clamped to the table's range.

    Kernels walk keys forward through such a line: key j of query i reads t = top - (i - j).
    """
    distance = torch.arange(top, top - length, -1, device=table.device).clamp_(0, table.shape[1] - 1)
    return table[:, distance]


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
