"""FlexAttention fast path: the same logits as ``bamctl.attention_math``, fused and compiled.

``torch.compile(flex_attention)`` fuses the prior and SSMax into the attention kernel
(``score_mod``) and skips key blocks in a query's future (a ``BlockMask``), so it never
builds a (Tq, Tk) tensor. Compiled, it runs on CUDA and, for inference only, on x86
CPUs. Every distinct shape is one compilation (seconds), so shapes are kept few:

- queries are padded to a multiple of the block size (one chunk shape per run);
- keys are read from the KV cache up to the next power of two of the visible length
  (positions past the last query are masked), so a 512k prefill compiles ~10 shapes;
- the block mask is built from block indices (causal with a query offset), never by
  evaluating a mask over (Tq, Tk).

Decoding steps (a handful of queries) go to the blockwise kernel, which is as fast
there and needs no compilation.
"""

from __future__ import annotations

import functools
import math

import torch

from bamctl.attention_math import AttentionInputs
from bamctl.engine.attention import blockwise_attention
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


def flex_attention_kernel(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: AttentionInputs, failed_shapes: set | None = None
) -> torch.Tensor:
    """Drop-in for ``blockwise_attention``: q (B, H, Tq, Dh), k/v (B, H, Tk, Dh) views of a KV cache.

    ``failed_shapes``: shapes the compiler failed on, which go straight to the blockwise
    kernel next time (see ``FlexKernel``); None remembers nothing.
    """
    failed_shapes = set() if failed_shapes is None else failed_shapes
    tq = q.shape[2]
    if tq < MIN_QUERIES or inputs.q_start % BLOCK:
        return blockwise_attention(q, k, v, inputs)
    q_start = inputs.q_start
    visible = q_start + tq
    # Keys: the cache's storage beyond the view holds zeros or stale values; masked.
    capacity = _capacity(k)
    kv_len = math.ceil(min(1 << max(visible - 1, 1).bit_length(), capacity) / BLOCK) * BLOCK
    if kv_len > capacity:  # the engine rounds its cache up to whole blocks; others may not
        return blockwise_attention(q, k, v, inputs)
    k_full, v_full = _widen(k, kv_len), _widen(v, kv_len)
    tq_pad = math.ceil(tq / BLOCK) * BLOCK
    q_pad = q if tq_pad == tq else torch.nn.functional.pad(q, (0, 0, 0, tq_pad - tq))
    device = q.device
    offset = torch.tensor(q_start, device=device)
    log_n = torch.log(torch.arange(q_start, q_start + tq_pad, device=device, dtype=torch.float32) + 1.0)
    table, scale = inputs.bias_table, inputs.ssmax_scale
    last = (table.shape[1] - 1) if table is not None else 0

    if table is None and scale is None:
        score_mod = None
    elif scale is None:
        def score_mod(score, b, h, q_idx, kv_idx):
            return score + table[h, (q_idx + offset - kv_idx).clamp(0, last)]
    elif table is None:
        def score_mod(score, b, h, q_idx, kv_idx):
            return score * (scale[h] * log_n[q_idx])
    elif inputs.ssmax_scope == "logits":
        def score_mod(score, b, h, q_idx, kv_idx):
            return (score + table[h, (q_idx + offset - kv_idx).clamp(0, last)]) * (scale[h] * log_n[q_idx])
    else:
        def score_mod(score, b, h, q_idx, kv_idx):
            return score * (scale[h] * log_n[q_idx]) + table[h, (q_idx + offset - kv_idx).clamp(0, last)]

    block_mask = _causal_block_mask(q_start, offset, tq_pad // BLOCK, kv_len // BLOCK, device)
    compute = torch.float32 if q.device.type == "cpu" else q.dtype
    if scale is not None:
        scale = scale.to(torch.float32)
    shape = (tq_pad, kv_len, tuple(k.shape), table is None, scale is None, inputs.ssmax_scope)
    if shape in failed_shapes:
        return blockwise_attention(q, k, v, inputs)
    try:
        out = _compiled()(
            q_pad.to(compute), k_full.to(compute), v_full.to(compute), score_mod=score_mod, block_mask=block_mask
        )
    except Exception as err:  # a compiler failure for one shape must not lose a long run
        failed_shapes.add(shape)
        _warn_once(f"FlexAttention failed to compile for {tq_pad} queries x {kv_len} keys "
                   f"({type(err).__name__}); using the blockwise path for this shape")
        return blockwise_attention(q, k, v, inputs)
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
    """``flex_attention_kernel`` for one engine, which remembers the shapes that failed to compile."""

    def __init__(self) -> None:
        self.failed_shapes: set = set()

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        return flex_attention_kernel(q, k, v, inputs, self.failed_shapes)


def require_flex() -> None:
    ok, why = flex_available()
    if not ok:
        raise BamctlError(f"--attention flex is not available: {why}; use --attention blockwise")
