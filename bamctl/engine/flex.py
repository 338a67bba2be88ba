"""FlexAttention fast path: the same logits as ``bamctl.attention_math``, fused and compiled.

``torch.compile(flex_attention)`` fuses the prior and SSMax into the attention kernel
(``score_mod``) and skips key blocks in a query's future (a ``BlockMask``), so it never
builds a (Tq, Tk) tensor. A content-dependent prior given pair by pair (``pair_bias``) is
a ``score_mod`` already, and enters the same way. Compiled, it runs on CUDA and, for inference only, on x86
CPUs. Every distinct shape is one compilation (seconds), so shapes are kept few:

- queries are padded to a multiple of the block size (one chunk shape per run);
- keys are read from the KV cache up to the next power of two of the visible length
  (positions past the last query are masked), so a 512k prefill compiles ~10 shapes;
- the block mask is built from block indices (causal with a query offset), never by
  evaluating a mask over (Tq, Tk).

Decoding steps (a handful of queries) go to the blockwise kernel, which is as fast
there and needs no compilation.

With a distance table and ``block_skip="auto"`` the block mask is per head: a key block in a
query block's past is left out of it where the certified bound of ``bamctl.engine.block_skip``
rules it out (``skipping_blocks``). FlexAttention computes a row in one pass, so the lower bound
on each row's maximum is taken beforehand: the largest logit of its diagonal block, computed
here with the reference's formula (one 128 x 128 tile per query block).
"""

from __future__ import annotations

import functools
import math

import torch

from bamctl.attention_math import AttentionInputs, pair_bias_of, ssmax_factor
from bamctl.engine.attention import blockwise_attention
from bamctl.engine.block_skip import BlockCounts, attempts, block_bias_range, logit_upper_bound, negligible
from bamctl.errors import BamctlError

BLOCK = 128  # FlexAttention's default block size, for queries and keys
MIN_QUERIES = BLOCK  # fewer queries than this: the blockwise kernel


def flex_available() -> tuple[bool, str]:
    """Whether compiled FlexAttention can run here, and why not."""
    try:
        from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
    except ImportError:
        return False, f"torch {torch.__version__} has no FlexAttention (needs torch >= 2.5)"
    if torch.cuda.is_available():
        return True, ""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False, "compiled FlexAttention runs on CUDA or x86 CPUs only"
    return True, ""


@functools.cache
def _compiled():
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention

    # One compilation per shape; past the cache limit dynamo would silently fall back
    # to eager flex, which materialises the whole score matrix. These limits are dynamo's,
    # process-wide: raising them here raises them for every compiled function in the process.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
    torch._dynamo.config.accumulated_cache_size_limit = max(torch._dynamo.config.accumulated_cache_size_limit, 1024)
    return torch.compile(flex_attention, dynamic=False)


def _causal_block_mask(q_start: int, offset: torch.Tensor, n_query_blocks: int, n_kv_blocks: int, device):
    """Query block r (absolute queries q_start + 128 r …) sees key blocks < its diagonal fully, the diagonal partly.

    ``offset``: q_start as a tensor. The mask reads that, not the int: dynamo guards on an int a
    closure holds, and would compile again for every chunk rather than once per key length.
    """
    from torch.nn.attention.flex_attention import BlockMask

    first = q_start // BLOCK
    diagonal = torch.arange(first, first + n_query_blocks, device=device, dtype=torch.int32)  # (Qb,)
    columns = torch.arange(n_kv_blocks, device=device, dtype=torch.int32)
    full_indices = columns[None, :].expand(n_query_blocks, n_kv_blocks).contiguous()  # blocks 0..diag-1 come first
    partial_indices = torch.zeros(n_query_blocks, n_kv_blocks, device=device, dtype=torch.int32)
    partial_indices[:, 0] = diagonal

    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset

    return BlockMask.from_kv_blocks(
        kv_num_blocks=torch.ones(1, 1, n_query_blocks, device=device, dtype=torch.int32),
        kv_indices=partial_indices[None, None],
        full_kv_num_blocks=diagonal[None, None].clone(),
        full_kv_indices=full_indices[None, None],
        BLOCK_SIZE=BLOCK,
        mask_mod=mask_mod,
    )


def skipping_blocks(q: torch.Tensor, k: torch.Tensor, inputs: AttentionInputs, tq: int) -> torch.Tensor:
    """(B, H, Qb, KVb) bool: key block ``j`` left out for query block ``r`` (queries ``q_start + 128 r
    ...``; ``q_start`` a multiple of 128) by the certified bound, against the largest logit of each
    row's diagonal block. ``q``: (B, H, 128 Qb, Dh), padded past its ``tq`` real rows; ``k``: (B, H,
    128 KVb, Dh). Only blocks wholly in a query block's past are ever True."""
    batch, heads, rows, dim = q.shape
    n_q, n_kv = rows // BLOCK, k.shape[2] // BLOCK
    first = inputs.q_start // BLOCK  # the first query block's diagonal key block
    qf = q.float() * (1.0 / math.sqrt(dim))
    positions = torch.arange(inputs.q_start, inputs.q_start + rows, device=q.device)
    factor = ssmax_factor(inputs, rows, q.device) if inputs.ssmax_scale is not None else None  # (H, T)
    table = inputs.bias_table
    last = table.shape[1] - 1
    # The lower bound: each row's largest logit over its diagonal block (keys up to itself).
    diag_k = k[:, :, first * BLOCK : (first + n_q) * BLOCK].float().reshape(batch, heads, n_q, BLOCK, dim)
    scores = qf.view(batch, heads, n_q, BLOCK, dim) @ diag_k.transpose(-1, -2)  # (B, H, Qb, 128, 128)
    offsets = torch.arange(BLOCK, device=q.device)
    distance = offsets[:, None] - offsets[None, :]  # (128, 128): query minus key within the tile
    bias = table[:, distance.clamp(0, last)][:, None]  # (H, 1, 128, 128)
    if factor is None:
        logits = scores + bias
    else:
        f = factor.view(heads, n_q, BLOCK, 1)
        logits = (scores + bias) * f if inputs.ssmax_scope == "logits" else scores * f + bias
    lower = logits.masked_fill(distance < 0, float("-inf")).amax(-1).reshape(batch, heads, rows)  # (B, H, T)
    # The upper bound of every row over every key block, and the test: one query block at a time,
    # so the workspace is (B, H, 128, KVb), not (B, H, Tq, KVb).
    key_max = k.float().norm(dim=-1).view(batch, heads, n_kv, BLOCK).amax(-1)[:, :, None, :]  # (B, H, 1, KVb)
    # by block distance t = diagonal - j: the distances 128 t - 127 .. 128 t + 127 a query block and
    # the key block t blocks before it can hold, from a query block placed t blocks after key block 0
    ahead = first + n_q
    distances = torch.arange(ahead, device=q.device)
    high, low = block_bias_range(table, ahead * BLOCK, BLOCK, (ahead - distances) * BLOCK, BLOCK)
    q_norm = qf.norm(dim=-1)  # (B, H, T)
    padding = torch.arange(rows, device=q.device) >= tq  # padding rows: never in the way
    j = torch.arange(n_kv, device=q.device)
    skip = torch.zeros(batch, heads, n_q, n_kv, dtype=torch.bool, device=q.device)
    for r in range(n_q):
        diagonal = first + r
        if diagonal == 0:
            continue
        t = diagonal - j[:diagonal]  # (J,): key blocks wholly in the past
        rows_r = slice(r * BLOCK, (r + 1) * BLOCK)
        upper = logit_upper_bound(
            q_norm[:, :, rows_r, None], key_max[..., :diagonal], high[None, :, None, t], low[None, :, None, t],
            None if factor is None else factor[None, :, rows_r, None], inputs.ssmax_scope,
        )  # (B, H, 128, J)
        passed = negligible(upper, lower[:, :, rows_r, None], positions[rows_r, None]) | padding[rows_r, None]
        skip[:, :, r, :diagonal] = passed.all(2)
    return skip


def _skipping_block_mask(skip: torch.Tensor, q_start: int, offset: torch.Tensor, device):
    """The causal block mask with, per head, the key blocks of ``skip`` (B, H, Qb, KVb) left out."""
    from torch.nn.attention.flex_attention import BlockMask

    batch, heads, n_q, n_kv = skip.shape
    first = q_start // BLOCK
    diagonal = torch.arange(first, first + n_q, device=device, dtype=torch.int32)
    j = torch.arange(n_kv, device=device, dtype=torch.int32)
    keep = (j[None, :] < diagonal[:, None]) & ~skip  # (B, H, Qb, KVb): full blocks read
    order = torch.where(keep, j, j + n_kv).argsort(dim=-1).to(torch.int32)  # kept blocks first, in order
    partial = torch.zeros(batch, heads, n_q, n_kv, device=device, dtype=torch.int32)
    partial[..., 0] = diagonal

    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset

    return BlockMask.from_kv_blocks(
        kv_num_blocks=torch.ones(batch, heads, n_q, device=device, dtype=torch.int32),
        kv_indices=partial,
        full_kv_num_blocks=keep.sum(-1).to(torch.int32),
        full_kv_indices=order.contiguous(),
        BLOCK_SIZE=BLOCK,
        mask_mod=mask_mod,
    )


def flex_attention_kernel(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: AttentionInputs, failed_shapes: set | None = None,
    block_skip: str = "off", counts: BlockCounts | None = None,
) -> torch.Tensor:
    """Drop-in for ``blockwise_attention``: q (B, H, Tq, Dh), k/v (B, H, Tk, Dh) views of a KV cache.

    ``failed_shapes``: shapes the compiler failed on, which go straight to the blockwise
    kernel next time (see ``FlexKernel``); None remembers nothing. ``block_skip``: ``auto`` leaves
    out the key blocks the certified bound rules out, per head; ``counts``: where to add, per
    sequence, the (head, query block, key block) units considered and those left out.
    """
    failed_shapes = set() if failed_shapes is None else failed_shapes
    tq = q.shape[2]
    fallback = lambda: blockwise_attention(q, k, v, inputs, block_skip=block_skip, counts=counts)  # noqa: E731
    if tq < MIN_QUERIES or inputs.q_start % BLOCK:
        return fallback()
    q_start = inputs.q_start
    visible = q_start + tq
    # Keys: the cache's storage beyond the view holds zeros or stale values; masked.
    capacity = _capacity(k)
    kv_len = math.ceil(min(1 << max(visible - 1, 1).bit_length(), capacity) / BLOCK) * BLOCK
    if kv_len > capacity:  # the engine rounds its cache up to whole blocks; others may not
        return fallback()
    k_full, v_full = _widen(k, kv_len), _widen(v, kv_len)
    tq_pad = math.ceil(tq / BLOCK) * BLOCK
    q_pad = q if tq_pad == tq else torch.nn.functional.pad(q, (0, 0, 0, tq_pad - tq))
    device = q.device
    offset = torch.tensor(q_start, device=device)
    table, scale = inputs.bias_table, inputs.ssmax_scale
    factor = None if scale is None else ssmax_factor(inputs, tq_pad, device)  # (H, padded Tq): c_h(i)
    last = (table.shape[1] - 1) if table is not None else 0
    if inputs.content_prior is not None:  # pair by pair (the engine sends no other content prior here)
        # over the padded queries and the widened keys, so that every index flex asks for exists
        pair = pair_bias_of(inputs.content_prior, q_pad, k_full, torch.arange(q_start, q_start + tq_pad, device=device))

        def bias_at(score, b, h, q_idx, kv_idx):
            return pair(score, b, h, q_idx + offset, kv_idx)
    elif table is not None:
        def bias_at(score, b, h, q_idx, kv_idx):
            return table[h, (q_idx + offset - kv_idx).clamp(0, last)]
    else:
        bias_at = None

    if bias_at is None and scale is None:
        score_mod = None
    elif scale is None:
        def score_mod(score, b, h, q_idx, kv_idx):
            return score + bias_at(score, b, h, q_idx, kv_idx)
    elif bias_at is None:
        def score_mod(score, b, h, q_idx, kv_idx):
            return score * factor[h, q_idx]
    elif inputs.ssmax_scope == "logits":
        def score_mod(score, b, h, q_idx, kv_idx):
            return (score + bias_at(score, b, h, q_idx, kv_idx)) * factor[h, q_idx]
    else:
        def score_mod(score, b, h, q_idx, kv_idx):
            return score * factor[h, q_idx] + bias_at(score, b, h, q_idx, kv_idx)

    n_q = tq_pad // BLOCK
    if attempts(inputs, block_skip):
        skip = skipping_blocks(q_pad, k_full, inputs, tq)
        block_mask = _skipping_block_mask(skip, q_start, offset, device)
    else:
        skip = None
        block_mask = _causal_block_mask(q_start, offset, n_q, kv_len // BLOCK, device)
    compute = torch.float32 if q.device.type == "cpu" else q.dtype
    shape = (tq_pad, kv_len, tuple(k.shape), table is None, scale is None, inputs.ssmax_scope, skip is None,
             inputs.content_prior is None)
    if shape in failed_shapes:
        return fallback()
    try:
        out = _compiled()(
            q_pad.to(compute), k_full.to(compute), v_full.to(compute), score_mod=score_mod, block_mask=block_mask
        )
    except Exception as err:  # a compiler failure for one shape must not lose a long run
        failed_shapes.add(shape)
        _warn_once(f"FlexAttention failed to compile for {tq_pad} queries x {kv_len} keys "
                   f"({type(err).__name__}); using the blockwise path for this shape")
        return fallback()
    if counts is not None:
        units = q.shape[1] * sum(q_start // BLOCK + r + 1 for r in range(n_q))
        left_out = [0] * q.shape[0] if skip is None else skip.sum((1, 2, 3)).tolist()
        counts.add(left_out, [units] * q.shape[0])
    return out[:, :, :tq].to(q.dtype)


@functools.cache
def _warn_once(message: str) -> None:
    import sys

    print(f"warning: {message}", file=sys.stderr)


def _capacity(t: torch.Tensor) -> int:
    """Positions the storage behind a (B, H, T, Dh) cache view can hold."""
    return t.untyped_storage().nbytes() // t.element_size() // (t.shape[0] * t.shape[1] * t.shape[3])


def _widen(t: torch.Tensor, length: int) -> torch.Tensor:
    """The same cache view, extended to ``length`` positions of its storage (no copy)."""
    return t.as_strided((t.shape[0], t.shape[1], length, t.shape[3]), t.stride(), t.storage_offset())


class FlexKernel:
    """``flex_attention_kernel`` for one engine, which remembers the shapes that failed to compile,
    and keeps its ``--block-skip`` and its counts."""

    def __init__(self, block_skip: str = "auto") -> None:
        self.failed_shapes: set = set()
        self.block_skip = block_skip
        self.counts = BlockCounts()

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        return flex_attention_kernel(q, k, v, inputs, self.failed_shapes, self.block_skip, self.counts)


def require_flex() -> None:
    ok, why = flex_available()
    if not ok:
        raise BamctlError(f"--attention flex is not available: {why}; use --attention blockwise")
