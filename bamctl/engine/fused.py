"""Fused CPU path: torch's flash-attention kernel, handed our logits through its mask.

torch ships a vectorised, tiled CPU attention kernel (the one behind
``scaled_dot_product_attention``). It adds an arbitrary float mask to the scaled
scores, honours the mask's strides without copying it, can skip the causal future,
and returns each row's log-sum-exp. Our logits (``bamctl.attention_math``) fit it:

- SSMax's factor ``c_h(i)`` multiplies the scores of row ``i``: it is folded into the
  queries, once per call.
- The prior ``b_h(i - j)`` depends on the distance only (Toeplitz). With a block's
  queries taken in reverse order it becomes Hankel, ``line[r + j]``: a strided *view*
  of one line per head, so the mask for ``rows x keys`` costs ``rows + keys`` floats.
- Each block of ``ROWS`` queries is split in two calls merged by log-sum-exp: the keys
  before the block, all visible (reversed queries, prior as a view), and the block's own
  diagonal square, causal (natural order; the kernel skips the future; its small
  Toeplitz prior is materialised once per call).
- ``ssmax_scope="logits"`` scales the prior by ``c_h(i)`` as well; no view can express
  a row-scaled Toeplitz matrix, so that mask is materialised one key tile at a time
  (``TILE_BYTES``), and the tiles merged by log-sum-exp: memory is bounded by the tile.

The reference this must match is ``dense_attention``; the tests hold it to 1e-4.
"""

from __future__ import annotations

import math

import torch

from bamctl.attention_math import AttentionInputs, dense_attention, ssmax_factor
from bamctl.engine.attention import blockwise_attention, prior_line

ROWS = 1024  # queries per kernel call: >= 768 lets the kernel tile them by 256; the diagonal square is ROWS^2
TILE_BYTES = 8 << 20  # a materialised (logits-scope) mask tile: small enough to be read back from cache
TILE_QUANTUM = 512  # the kernel walks keys 512 at a time; tiles are whole multiples of that


def fused_available() -> tuple[bool, str]:
    """Whether this torch has the fused CPU kernel with a log-sum-exp output."""
    if not hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"):
        return False, f"torch {torch.__version__} has no fused CPU attention kernel (needs torch >= 2.3)"
    return True, ""


def needs_grad(*tensors) -> bool:
    if not torch.is_grad_enabled():
        return False
    inputs = tensors[-1]
    return any(t is not None and t.requires_grad for t in (*tensors[:-1], inputs.bias_table, inputs.ssmax_scale, inputs.ssmax_bias))


def _flash(q, k, v, mask, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(output (B, H, R, Dh), log-sum-exp (B, H, R)) of softmax(scale * q k^T + mask) v."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, causal, attn_mask=mask, scale=scale
    )


def _scratch(scratch: dict | None, name: str, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """A buffer of ``shape`` from ``scratch``, reused from call to call (one per name; grown
    when too small); a fresh one when there is no ``scratch`` to keep it in."""
    if scratch is None:
        return torch.empty(shape, device=device)
    numel = math.prod(shape)
    buffer = scratch.get(name)
    if buffer is None or buffer.numel() < numel or buffer.device != device:
        with torch.inference_mode(False):  # a normal tensor: usable in and out of inference mode
            buffer = scratch[name] = torch.empty(numel, device=device)
    return buffer[:numel].view(shape)


def _merge(out: torch.Tensor, lse: torch.Tensor, part: torch.Tensor, part_lse: torch.Tensor):
    """Combine two softmax-weighted averages over disjoint key sets, given their log-sum-exps."""
    top = torch.maximum(lse, part_lse)
    w, w_part = (lse - top).exp_(), (part_lse - top).exp_()
    total = w + w_part
    out.lerp_(part, (w_part / total)[..., None])  # both are averages: one pass instead of three
    return out, total.log_().add_(top)


def _diagonal_prior(table: torch.Tensor, rows: int) -> torch.Tensor:
    """(1, H, R, R) mask for a block's causal square: out[0, h, r, c] = b_h(r - c).

    A Toeplitz matrix needs a negative stride, which torch views cannot have: it is
    copied out of the Hankel view upside down (``flip``: 10x faster than gathering an
    (R, R) index). Entries above the diagonal are never read: the kernel skips them.
    """
    line = prior_line(table, rows - 1, 2 * rows - 1)  # line[t] = b(rows - 1 - t), 0 past the diagonal
    hankel = line.as_strided((table.shape[0], rows, rows), (line.stride(0), 1, 1))  # hankel[r] = toeplitz[rows - 1 - r]
    return hankel.flip(1)[None]


def fused_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    inputs: AttentionInputs,
    rows: int = ROWS,
    tile: int | None = None,
    scratch: dict | None = None,
) -> torch.Tensor:
    """Drop-in for ``blockwise_attention`` on CPUs. q: (B, H, Tq, Dh), k/v: (B, H, Tk, Dh).

    ``rows``: queries per call; ``tile``: keys per materialised mask tile (default from
    ``TILE_BYTES``). Both only trade speed; the tests shrink them to cover every branch.
    ``scratch``: where to keep the mask buffers between calls (see ``FusedKernel``).
    """
    if needs_grad(q, k, v, inputs):
        return dense_attention(q, k, v, inputs)  # the fused kernel has no backward for its mask
    if q.device.type != "cpu" or not fused_available()[0]:
        return blockwise_attention(q, k, v, inputs)
    batch, heads, tq, head_dim = q.shape
    q0 = inputs.q_start
    scale = 1.0 / math.sqrt(head_dim)
    qf, kf, vf = q.float(), k.float(), v.float()
    table = inputs.bias_table
    factor = None  # (H, Tq) SSMax's c_h(i)
    if inputs.ssmax_scale is not None:
        factor = ssmax_factor(inputs, tq, q.device)
        qf = qf * factor[None, :, :, None]
    scaled_prior = factor is not None and table is not None and inputs.ssmax_scope == "logits"
    if tile is None:
        tile = max(TILE_QUANTUM, TILE_BYTES // (4 * heads * rows) // TILE_QUANTUM * TILE_QUANTUM)

    diagonal = _diagonal_prior(table, min(rows, tq)) if table is not None else None  # the same for every block
    out = torch.empty(batch, heads, tq, head_dim, device=q.device)
    for a in range(0, tq, rows):
        n_rows = min(rows, tq - a)
        first = q0 + a  # absolute position of this block's first query
        q_block = qf[:, :, a:a + n_rows]
        row_factor = factor[:, a:a + n_rows] if scaled_prior else None  # (H, R)

        mask = None if diagonal is None else diagonal[:, :, :n_rows, :n_rows]
        if row_factor is not None:
            mask = torch.mul(mask, row_factor[None, :, :, None], out=_scratch(scratch, "diagonal", mask.shape, q.device))
        block_out, block_lse = _flash(
            q_block, kf[:, :, first:first + n_rows], vf[:, :, first:first + n_rows], mask, True, scale
        )
        if first:  # keys 0 .. first - 1, visible to every query of the block
            past_out, past_lse = _past(q_block, kf, vf, first, table, row_factor, scale, tile, scratch)
            block_out, block_lse = _merge(block_out, block_lse, past_out, past_lse)
        out[:, :, a:a + n_rows] = block_out
    return out.to(q.dtype)


def _past(q_block, kf, vf, first: int, table, row_factor, scale: float, tile: int, scratch: dict | None):
    """Attention of a query block over keys ``0 .. first - 1`` (all in its past), with its log-sum-exp.

    Without a row-scaled prior the mask is a view and one call covers every key; with
    one, the mask is materialised ``tile`` keys at a time and the tiles merged.
    """
    if table is None:
        return _flash(q_block, kf[:, :, :first], vf[:, :, :first], None, False, scale)
    heads, rows = q_block.shape[1], q_block.shape[2]
    q_reversed = q_block.flip(2)  # reversed row r is query first + rows - 1 - r
    if row_factor is None:
        tile = first
    else:
        tile = min(tile, first)
        factor_reversed = row_factor.flip(1)[None, :, :, None]  # (1, H, R, 1)
    out = lse = None
    for start in range(0, first, tile):
        stop = min(start + tile, first)
        width = stop - start
        # reversed row r, key j: distance (first + rows - 1 - r) - j = top - (r + j - start)
        line = prior_line(table, first + rows - 1 - start, rows + width - 1)
        mask = line.as_strided((1, heads, rows, width), (0, line.stride(0), 1, 1))
        if row_factor is not None:
            mask = torch.mul(mask, factor_reversed, out=_scratch(scratch, "tile", (1, heads, rows, width), q_block.device))
        part, part_lse = _flash(q_reversed, kf[:, :, start:stop], vf[:, :, start:stop], mask, False, scale)
        out, lse = (part, part_lse) if out is None else _merge(out, lse, part, part_lse)
    return out.flip(2), lse.flip(2)


class FusedKernel:
    """``fused_attention`` for one engine, which owns the mask buffers its calls reuse.

    A fresh multi-MiB mask costs one page fault per 4 KiB on first touch, which at 1k
    tokens took longer than the attention itself; reusing them across chunks avoids that.
    """

    def __init__(self) -> None:
        self.scratch: dict[str, torch.Tensor] = {}

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        return fused_attention(q, k, v, inputs, scratch=self.scratch)
