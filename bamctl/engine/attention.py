"""The engine's attention kernels beyond the dense reference, with the logits of
``bamctl.attention_math`` (the formula is there).

- ``blockwise``: walks key blocks with an online softmax (running max, running sum),
  so the workspace is (Tq, block) whatever the context length. A content-dependent prior given
  as a scan (CoPE's count of open gates) has its key blocks walked nearest first, carrying its
  state from block to block; one given pair by pair is evaluated on each tile. With a bias table and
  ``block_skip="auto"`` it walks each query block's key blocks nearest first and leaves out,
  per head, those the certified bound of ``bamctl.engine.block_skip`` rules out.
"""

from __future__ import annotations

import math

import torch

from bamctl.attention_math import AttentionInputs, pair_bias_of, pair_tile, pairs_content, scans_content, ssmax_factor
from bamctl.engine.block_skip import BlockCounts, attempts, block_bias_range, logit_upper_bound, negligible

EXP_FLOOR = -80.0  # see blockwise_attention
QUERY_BLOCK = 512  # rows that share one skipping decision per head and key block


def prior_line(table: torch.Tensor, top: int, length: int) -> torch.Tensor:
    """(H, length) with line[h, t] = b_h(top - t), the distance clamped to the table's range.

    Kernels walk keys forward through such a line: key j of query i reads t = top - (i - j).
    """
    distance = torch.arange(top, top - length, -1, device=table.device).clamp_(0, table.shape[1] - 1)
    return table[:, distance]


def _toeplitz_bias(table: torch.Tensor, base: int, tq: int, tb: int, heads: torch.Tensor | None = None) -> torch.Tensor:
    """Bias for keys taken in reverse order: out[h, i, r] = table[h, clamp(base + i + r, 0)].

    A distance-only bias is Toeplitz; with the key block reversed it becomes a Hankel
    matrix, which is a strided *view* of one short vector (no (Tq, Tb) gather).
    ``heads``: the table's rows to take, in this order (default: all).
    """
    index = torch.arange(base, base + tq + tb - 1, device=table.device).clamp_(min=0, max=table.shape[1] - 1)
    line = table[:, index]  # (H, Tq + Tb - 1)
    line = (line if heads is None else line[heads]).contiguous()
    return line.as_strided((line.shape[0], tq, tb), (line.stride(0), 1, 1))


def blockwise_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: AttentionInputs, block_size: int = 1024,
    block_skip: str = "off", counts: BlockCounts | None = None,
) -> torch.Tensor:
    """Online-softmax attention over key blocks; never holds more than (Tq, block) logits.

    Each key block is walked in reverse order so that the prior is a strided view
    (see ``_toeplitz_bias``); the logits are then updated in place to keep memory
    traffic low on CPUs. ``block_skip="auto"``: leave out key blocks the certified bound rules
    out (``_skipping_attention``); ``counts``: where to add, per sequence, the (head, query
    block, key block) units considered and those left out.
    """
    if attempts(inputs, block_skip):
        return _skipping_attention(q, k, v, inputs, block_size, counts)
    if counts is not None:
        units = key_block_units(inputs.q_start, q.shape[2], block_size, q.shape[1])
        counts.add([0] * q.shape[0], [units] * q.shape[0])
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
    q_positions = torch.arange(q_start, q_start + tq, device=q.device)
    starts = range(0, last_key, block_size)
    scan, carry, pair = None, None, None
    if inputs.content_prior is not None:
        if pairs_content(inputs.content_prior):  # pair by pair: one function for every tile of this call
            pair = pair_bias_of(inputs.content_prior, q, k[:, :, :last_key], q_positions)
        elif scans_content(inputs.content_prior):  # a scan wants the nearest keys first
            scan = inputs.content_prior
            starts = reversed(starts)
        else:
            raise ValueError("blockwise attention takes a content-dependent prior as content_scan or pair_bias only")
    for start in starts:
        stop = min(start + block_size, last_key)
        tb = stop - start
        k_block = k[:, :, start:stop].float().flip(2)  # reversed: key r is at position stop - 1 - r
        v_block = v[:, :, start:stop].float().flip(2)
        logits = qf @ k_block.transpose(-1, -2)  # (B, H, Tq, Tb)
        base = q_start - (stop - 1)  # distance of (query 0, reversed key 0)
        future = None
        if base < 0:  # this block holds keys in the future of some queries
            future = (torch.arange(tq, device=q.device)[:, None] + torch.arange(tb, device=q.device)[None, :]) < -base
        bias = None
        if inputs.query_prior is not None:  # depends on the query's position: computed for this block
            bias = inputs.query_prior.bias(q_positions, torch.arange(stop - 1, start - 1, -1, device=q.device))  # reversed keys
        elif inputs.bias_table is not None:
            bias = _toeplitz_bias(inputs.bias_table, base, tq, tb)
        elif scan is not None or pair is not None:  # reads the scores: before SSMax's factor, as the reference
            # a copy: the logits change in place below, and a carry may hold a view of what it was given
            scores = logits.clone() if future is None else logits.masked_fill(future, float("-inf"))
            k_positions = torch.arange(stop - 1, start - 1, -1, device=q.device)
            if scan is not None:
                bias, carry = scan.content_scan(q, scores, q_positions, k_positions, carry)
            else:
                bias = pair_tile(pair, scores, q_positions, k_positions)
        if scale_bias and bias is not None:  # SSMax scope "logits": (content + prior) * factor
            logits.add_(bias).mul_(factor)
        else:  # scope "content" (the authors' ALiBi + SSMax) or no SSMax: content * factor + prior
            if factor is not None:
                logits.mul_(factor)
            if bias is not None:
                logits.add_(bias)
        if future is not None:
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


def key_block_units(q_start: int, tq: int, block_size: int, heads: int) -> int:
    """The (head, query block, key block) units a sequence's call considers, skipping or not: query
    blocks of ``min(QUERY_BLOCK, block_size)`` rows, each over the key blocks up to its last query."""
    rows = min(QUERY_BLOCK, block_size)
    return heads * sum(-(-(q_start + min(r0 + rows, tq)) // block_size) for r0 in range(0, tq, rows))


def _skipping_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: AttentionInputs, block_size: int,
    counts: BlockCounts | None,
) -> torch.Tensor:
    """``blockwise_attention`` with certified skipping (docs/engine.md, "Certified block skipping").

    Queries go in blocks of ``QUERY_BLOCK`` rows (at most ``block_size``, so that a row's own key
    lies in its first key block). Each query block walks key blocks ending at its last query,
    nearest first; the first holds every row's diagonal and is always computed. Before each
    further block, a head whose rows all pass ``negligible`` (the block's bound against the
    largest logit each row has computed) leaves it out; the others compute it, for their heads
    alone.
    """
    batch, heads, tq, dim = q.shape
    bh = batch * heads
    q_start = inputs.q_start
    table = inputs.bias_table
    scale_bias = inputs.ssmax_scale is not None and inputs.ssmax_scope == "logits"
    qf = (q.float() * (1.0 / math.sqrt(dim))).reshape(bh, tq, dim)
    factor = ssmax_factor(inputs, tq, q.device) if inputs.ssmax_scale is not None else None  # (H, Tq)
    key_norm = k[:, :, : q_start + tq].float().norm(dim=-1).reshape(bh, -1)  # (BH, visible)
    head_of = torch.arange(bh, device=q.device) % heads  # (BH,)
    out = torch.empty(bh, tq, v.shape[-1], device=q.device)
    skipped = torch.zeros(batch, dtype=torch.long)
    total = torch.zeros(batch, dtype=torch.long)
    rows_per_block = min(QUERY_BLOCK, block_size)
    for r0 in range(0, tq, rows_per_block):
        rows = min(rows_per_block, tq - r0)
        first = q_start + r0
        end = first + rows  # keys 0 .. end - 1 are seen by some row
        stops = list(range(end, 0, -block_size))
        starts = torch.tensor([stop - block_size for stop in stops], device=q.device)  # nominal: may reach below 0
        high, low = block_bias_range(table, first, rows, starts, block_size)  # (H, n): over a superset of distances
        high, low = high[head_of], low[head_of]  # (BH, n)
        qb = qf[:, r0 : r0 + rows]  # (BH, rows, Dh)
        q_norm = qb.norm(dim=-1)  # (BH, rows): |q| / sqrt(Dh)
        fb = None if factor is None else factor[:, r0 : r0 + rows][head_of]  # (BH, rows)
        positions = torch.arange(first, end, device=q.device)
        running_max = torch.full((bh, rows, 1), float("-inf"), device=q.device)
        running_sum = torch.zeros(bh, rows, 1, device=q.device)
        acc = torch.zeros(bh, rows, v.shape[-1], device=q.device)
        total += heads * len(stops)
        for n, stop in enumerate(stops):
            start = max(stop - block_size, 0)
            tb = stop - start
            active = None  # None: every head
            if n > 0:  # the first block holds the diagonal: never left out
                key_max = key_norm[:, start:stop].amax(-1, keepdim=True)  # (BH, 1)
                upper = logit_upper_bound(q_norm, key_max, high[:, n : n + 1], low[:, n : n + 1], fb, inputs.ssmax_scope)
                skip = negligible(upper, running_max[..., 0], positions).all(-1)  # (BH,)
                if bool(skip.any()):
                    skipped += skip.view(batch, heads).sum(-1).cpu()
                    active = (~skip).nonzero()[:, 0]
                    if active.numel() == 0:
                        continue
            idx = slice(None) if active is None else active
            hb = head_of if active is None else head_of[active]
            k_block = k[:, :, start:stop].float().reshape(bh, tb, dim)[idx].flip(1)  # reversed keys
            v_block = v[:, :, start:stop].float().reshape(bh, tb, v.shape[-1])[idx].flip(1)
            logits = qb[idx] @ k_block.transpose(-1, -2)  # (A, rows, Tb)
            base = first - (stop - 1)  # distance of (row 0, reversed key 0)
            bias = _toeplitz_bias(table, base, rows, tb, hb)  # (A, rows, Tb), a view
            f = None if fb is None else fb[idx][:, :, None]
            if scale_bias:
                logits.add_(bias).mul_(f)
            else:
                if f is not None:
                    logits.mul_(f)
                logits.add_(bias)
            future = None
            if base < 0:
                future = (torch.arange(rows, device=q.device)[:, None] + torch.arange(tb, device=q.device)[None, :]) < -base
                logits.masked_fill_(future, float("-inf"))
            old_max = running_max[idx]
            new_max = torch.maximum(old_max, logits.amax(dim=-1, keepdim=True))
            safe_max = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
            correction = torch.exp(old_max - safe_max)
            weights = logits.sub_(safe_max).clamp_(min=EXP_FLOOR).exp_()
            if future is not None:
                weights.masked_fill_(future, 0.0)
            new_sum = running_sum[idx] * correction + weights.sum(dim=-1, keepdim=True)
            new_acc = acc[idx] * correction + weights @ v_block
            if active is None:
                running_max, running_sum, acc = new_max, new_sum, new_acc
            else:
                running_max[active], running_sum[active], acc[active] = new_max, new_sum, new_acc
        out[:, r0 : r0 + rows] = acc / running_sum
    if counts is not None:
        counts.add(skipped.tolist(), total.tolist())
    return out.view(batch, heads, tq, -1).to(q.dtype)


class BlockwiseKernel:
    """``blockwise_attention`` for one engine: its ``--block-skip`` and its own counts."""

    def __init__(self, block_skip: str = "auto", block_size: int = 1024) -> None:
        self.block_skip = block_skip
        self.block_size = block_size
        self.counts = BlockCounts()

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        return blockwise_attention(q, k, v, inputs, self.block_size, self.block_skip, self.counts)
