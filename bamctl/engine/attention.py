"""The engine's attention kernels beyond the dense reference, with the logits of
``bamctl.attention_math`` (the formula is there).

- ``blockwise``: walks key blocks nearest first with an online softmax (running max, running
  sum), so the workspace is (Tq, block) whatever the context length. A content-dependent prior
  given as a scan (CoPE's count of open gates) carries its state from block to block; one given
  pair by pair is evaluated on each tile. With a bias table and ``block_skip="auto"`` the same
  walk, for query blocks of ``QUERY_BLOCK`` rows, leaves out per head the key blocks the certified
  bound of ``bamctl.engine.block_skip`` rules out.
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

    Key blocks are walked nearest first from each query block's last query, and each is taken
    in reverse order so that the prior is a strided view (see ``_toeplitz_bias``); the logits are
    then updated in place to keep memory traffic low on CPUs. All queries are one block, unless
    ``block_skip="auto"`` skips (docs/engine.md, "Certified block skipping"): queries then go in
    blocks of ``QUERY_BLOCK`` rows (at most ``block_size``, so that a row's own key lies in its first
    key block), and before each key block after the first (which holds every row's diagonal), a head
    whose rows all pass ``negligible`` (the block's bound against the largest logit each row has
    computed) leaves it out; the others compute it, for their heads alone. ``counts``: where to add,
    per sequence, the (head, query block, key block) units considered and those left out, the same
    units whether it skips or not (``key_block_units``).
    """
    batch, heads, tq, _ = q.shape
    skips = attempts(inputs, block_skip)
    walk = _KeyBlockWalk(q, k, v, inputs, block_size)
    rows_per_block = min(QUERY_BLOCK, block_size) if skips else tq
    out = torch.empty(batch * heads, tq, v.shape[-1], device=q.device)
    skipped = torch.zeros(batch, dtype=torch.long)
    for r0 in range(0, tq, rows_per_block):
        rows = min(rows_per_block, tq - r0)
        out[:, r0 : r0 + rows] = walk.rows(r0, rows, skipped if skips else None)
    if counts is not None:
        counts.add(skipped.tolist(), [key_block_units(inputs.q_start, tq, block_size, heads)] * batch)
    return out.view(batch, heads, tq, -1).to(q.dtype)


def key_block_units(q_start: int, tq: int, block_size: int, heads: int) -> int:
    """The (head, query block, key block) units a sequence's call considers, skipping or not: query
    blocks of ``min(QUERY_BLOCK, block_size)`` rows, each over the key blocks up to its last query."""
    rows = min(QUERY_BLOCK, block_size)
    return heads * sum(-(-(q_start + min(r0 + rows, tq)) // block_size) for r0 in range(0, tq, rows))


class _KeyBlockWalk:
    """One call's online softmax, run for a block of query rows at a time (``rows``). Heads of every
    sequence are one axis (B * H), so that a skipping walk computes a key block for the heads that
    need it alone; the PE hooks that take (B, H, ...) tensors get them so."""

    def __init__(self, q, k, v, inputs: AttentionInputs, block_size: int) -> None:
        self.batch, self.heads, tq, dim = q.shape
        self.k, self.v, self.inputs, self.block_size = k, v, inputs, block_size
        bh = self.batch * self.heads
        self.qf = (q.float() * (1.0 / math.sqrt(dim))).reshape(bh, tq, dim)
        self.head_of = torch.arange(bh, device=q.device) % self.heads  # (BH,): each row's head
        # SSMax's factor c_h(i), per row of the flattened heads: (BH, Tq)
        self.factor = None if inputs.ssmax_scale is None else ssmax_factor(inputs, tq, q.device)[self.head_of]
        self.scale_bias = self.factor is not None and inputs.ssmax_scope == "logits"
        self.scan = self.pair = None
        if inputs.content_prior is not None:
            if pairs_content(inputs.content_prior):  # pair by pair: one function for every tile of this call
                positions = torch.arange(inputs.q_start, inputs.q_start + tq, device=q.device)
                self.pair = pair_bias_of(inputs.content_prior, q, k[:, :, : inputs.q_start + tq], positions)
            elif scans_content(inputs.content_prior):  # carried from block to block, nearest first
                self.q, self.scan = q, inputs.content_prior
            else:
                raise ValueError("blockwise attention takes a content-dependent prior as content_scan, pair_bias or score_mod only")
        self.key_norm = None  # (BH, keys): each key's norm, for the skipping bound, taken once

    def rows(self, r0: int, rows: int, skipped: torch.Tensor | None) -> torch.Tensor:
        """(BH, rows, Dv) outputs of query rows r0 .. r0 + rows - 1; ``skipped``: None (every block is
        read), or (B,) counts of units left out, to add to (the walk then tests blocks after the first)."""
        inputs, device, bh = self.inputs, self.qf.device, self.qf.shape[0]
        first = inputs.q_start + r0
        end = first + rows  # keys 0 .. end - 1 are seen by some row
        qb = self.qf[:, r0 : r0 + rows]  # (BH, rows, Dh)
        fb = None if self.factor is None else self.factor[:, r0 : r0 + rows]  # (BH, rows)
        positions = torch.arange(first, end, device=device)
        stops = range(end, 0, -self.block_size)  # nearest first
        test = None if skipped is None else self._skip_test(qb, fb, first, rows, stops, positions)
        running_max = torch.full((bh, rows, 1), float("-inf"), device=device)
        running_sum = torch.zeros(bh, rows, 1, device=device)
        acc = torch.zeros(bh, rows, self.v.shape[-1], device=device)
        carry = None
        for n, stop in enumerate(stops):
            start = max(stop - self.block_size, 0)
            active = None  # None: every head
            if test is not None and n > 0:  # the first block holds the diagonal: never left out
                skip = test(n, start, stop, running_max)  # (BH,)
                if bool(skip.any()):
                    skipped += skip.view(self.batch, self.heads).sum(-1).cpu()
                    active = (~skip).nonzero()[:, 0]
                    if active.numel() == 0:
                        continue
            logits, future, carry = self._logits(qb, fb, first, rows, start, stop, active, carry)
            idx = slice(None) if active is None else active
            v_block = self.v[:, :, start:stop].float().reshape(bh, stop - start, -1)[idx].flip(1)  # reversed keys
            new_max = torch.maximum(running_max[idx], logits.amax(dim=-1, keepdim=True))
            # Rows that have seen only masked keys keep max = -inf; exp(-inf - -inf) would be NaN.
            safe_max = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
            correction = torch.exp(running_max[idx] - safe_max)
            # exp() of values that underflow float32 takes a slow path (~15x slower on x86); below
            # -80 a weight is < 2e-35 of the row's largest, so flooring there changes nothing visible.
            weights = logits.sub_(safe_max).clamp_(min=EXP_FLOOR).exp_()
            if future is not None:
                weights.masked_fill_(future, 0.0)  # keep causality exact, not merely 1e-35-close
            new_sum = running_sum[idx] * correction + weights.sum(dim=-1, keepdim=True)
            new_acc = acc[idx] * correction + weights @ v_block
            if active is None:
                running_max, running_sum, acc = new_max, new_sum, new_acc
            else:
                running_max[active], running_sum[active], acc[active] = new_max, new_sum, new_acc
        return acc / running_sum

    def _logits(self, qb, fb, first, rows, start, stop, active, carry):
        """(A, rows, Tb) logits of the active heads (None: all) over keys start .. stop - 1, reversed;
        the mask of future keys (None: none) and the content scan's carry after this block."""
        inputs, device = self.inputs, qb.device
        tb = stop - start
        idx = slice(None) if active is None else active
        k_block = self.k[:, :, start:stop].float().reshape(qb.shape[0], tb, -1)[idx].flip(1)  # reversed: key r at stop - 1 - r
        logits = qb[idx] @ k_block.transpose(-1, -2)  # (A, rows, Tb)
        base = first - (stop - 1)  # distance of (row 0, reversed key 0)
        future = None
        if base < 0:  # this block holds keys in the future of some rows
            future = (torch.arange(rows, device=device)[:, None] + torch.arange(tb, device=device)[None, :]) < -base
        q_positions = torch.arange(first, first + rows, device=device)
        k_positions = torch.arange(stop - 1, start - 1, -1, device=device)  # reversed keys
        bias = None
        if inputs.query_prior is not None:  # depends on the query's position: computed for this block
            bias = inputs.query_prior.bias(q_positions, k_positions).repeat(self.batch, 1, 1)  # (BH, rows, Tb)
        elif inputs.bias_table is not None:
            bias = _toeplitz_bias(inputs.bias_table, base, rows, tb, self.head_of[idx])  # (A, rows, Tb), a view
        elif self.scan is not None or self.pair is not None:  # reads the scores: before SSMax's factor, as the reference
            # a copy in (B, H, rows, Tb): the logits change in place below, and a carry may hold a view of it
            scores = logits.view(self.batch, self.heads, rows, tb)
            scores = scores.clone() if future is None else scores.masked_fill(future, float("-inf"))
            if self.scan is not None:
                bias, carry = self.scan.content_scan(self.q, scores, q_positions, k_positions, carry)  # rows: all of q
            else:
                bias = pair_tile(self.pair, scores, q_positions, k_positions)
            bias = bias.reshape(-1, rows, tb)
        f = None if fb is None else fb[idx][:, :, None]
        if self.scale_bias and bias is not None:  # SSMax scope "logits": (content + prior) * factor
            logits.add_(bias).mul_(f)
        else:  # scope "content" (the authors' ALiBi + SSMax) or no SSMax: content * factor + prior
            if f is not None:
                logits.mul_(f)
            if bias is not None:
                logits.add_(bias)
        if future is not None:
            logits.masked_fill_(future, float("-inf"))
        return logits, future, carry

    def _skip_test(self, qb, fb, first, rows, stops, positions):
        """For a skipping walk: ``test(n, start, stop, running_max) -> (BH,)``, whether each head's
        rows may all leave key block n out (the bound of ``bamctl.engine.block_skip``)."""
        inputs = self.inputs
        if self.key_norm is None:
            self.key_norm = self.k[:, :, : inputs.q_start + self.qf.shape[1]].float().norm(dim=-1).reshape(qb.shape[0], -1)
        starts = torch.tensor([stop - self.block_size for stop in stops], device=qb.device)  # nominal: may reach below 0
        high, low = block_bias_range(inputs.bias_table, first, rows, starts, self.block_size)  # (H, n): a superset of distances
        high, low = high[self.head_of], low[self.head_of]  # (BH, n)
        q_norm = qb.norm(dim=-1)  # (BH, rows): |q| / sqrt(Dh)

        def test(n, start, stop, running_max):
            key_max = self.key_norm[:, start:stop].amax(-1, keepdim=True)  # (BH, 1)
            upper = logit_upper_bound(q_norm, key_max, high[:, n : n + 1], low[:, n : n + 1], fb, inputs.ssmax_scope)
            return negligible(upper, running_max[..., 0], positions).all(-1)

        return test


class BlockwiseKernel:
    """``blockwise_attention`` for one engine: its ``--block-skip`` and its own counts."""

    def __init__(self, block_skip: str = "auto", block_size: int = 1024) -> None:
        self.block_skip = block_skip
        self.block_size = block_size
        self.counts = BlockCounts()

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        return blockwise_attention(q, k, v, inputs, self.block_size, self.block_skip, self.counts)
