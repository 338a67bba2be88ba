"""Pre-flight memory estimate: refuse a length that cannot fit before doing any work.

The streaming engine's memory is weights + KV cache + bias tables + one chunk's
workspace, all linear in the context length except the workspace, which the chunk and
key-block sizes bound. The estimate errs on the high side (every term is counted at
its peak at once), so a refusal is a real one.
"""

from __future__ import annotations

import torch

from bamctl.engine.cache import KVCache
from bamctl import devices
from bamctl.errors import BamctlError

KEY_BLOCK = 1024  # blockwise kernel's key block (bamctl.engine.attention)


def estimate_bytes(
    config, n_tokens: int, chunk_size: int, dtype: torch.dtype, attention: str, cache_dtype: torch.dtype | None = None,
    batch: int = 1,
) -> int:
    """Peak bytes to stream ``batch`` sequences of ``n_tokens`` side by side through a model with
    ``config`` (weights included); ``dtype`` the weights', ``cache_dtype`` the KV cache's when it
    differs (autocast). Weights, prior tables and the output head's rows (computed a sequence at a
    time) are shared; the cache, the chunk's workspace and the prompt are per sequence."""
    element = torch.empty(0, dtype=dtype).element_size()
    chunk = min(chunk_size, n_tokens)
    hidden = int(config.ffn_dim_multiplier * config.dim)
    weights = element * (
        2 * config.vocab_size * config.dim + config.n_layers * (4 * config.dim**2 + 3 * config.dim * hidden)
    )
    cache = KVCache.nbytes_for(config.n_layers, batch, config.dim, n_tokens, cache_dtype or dtype)
    tables = 4 * config.n_layers * config.n_heads * n_tokens  # one float32 prior line per layer
    keys = n_tokens if attention == "dense" else min(KEY_BLOCK, n_tokens)
    scores = batch * 4 * 3 * config.n_heads * chunk * keys  # logits, exp weights, matmul temporary (float32)
    activations = batch * 4 * chunk * (6 * config.dim + 3 * hidden) + 4 * 256 * config.vocab_size
    prompt = batch * 64 * n_tokens  # the prompt as Python ints and text, and its id tensors
    return weights + cache + tables + scores + activations + prompt


def largest_fitting(
    config, budget: int, chunk_size: int, dtype: torch.dtype, attention: str, cache_dtype: torch.dtype | None = None
) -> int:
    """The longest power-of-two length whose estimate fits in ``budget`` bytes (0 if none)."""
    n, best = 1024, 0
    while n <= 1 << 26 and estimate_bytes(config, n, chunk_size, dtype, attention, cache_dtype) <= budget:
        best, n = n, n * 2
    return best


def budget_bytes(device: torch.device) -> int:
    """What the estimates may take of the memory available on ``device``."""
    return int(devices.available_bytes(device) * devices.MEMORY_SAFETY)


def largest_batch(
    config, n_tokens: int, chunk_size: int, dtype: torch.dtype, attention: str, budget: int,
    cache_dtype: torch.dtype | None = None, most: int = 1 << 16,
) -> int:
    """The most sequences of ``n_tokens`` (up to ``most``) whose estimate fits in ``budget`` bytes (0 if not one)."""
    one = estimate_bytes(config, n_tokens, chunk_size, dtype, attention, cache_dtype, batch=1)
    if one > budget:
        return 0
    each = estimate_bytes(config, n_tokens, chunk_size, dtype, attention, cache_dtype, batch=2) - one  # linear in batch
    return most if each <= 0 else int(min(most, 1 + (budget - one) // each))


def check_fits(
    config, n_tokens: int, chunk_size: int, dtype: torch.dtype, attention: str, device: torch.device,
    cache_dtype: torch.dtype | None = None, batch: int = 1,
) -> None:
    """Raise a BamctlError naming the estimate and what would fit when ``batch`` sequences of ``n_tokens`` cannot."""
    need = estimate_bytes(config, n_tokens, chunk_size, dtype, attention, cache_dtype, batch)
    budget = budget_bytes(device)
    if need <= budget:
        return
    if batch > 1 and estimate_bytes(config, n_tokens, chunk_size, dtype, attention, cache_dtype) <= budget:
        fits = largest_batch(config, n_tokens, chunk_size, dtype, attention, budget, cache_dtype)
        raise BamctlError(
            f"--batch-size {batch}: {batch} sequences of {n_tokens:,} tokens need about {need / 2**30:.1f} GiB on {device}, "
            f"but only {budget / 2**30:.1f} GiB are available: {fits} fit; use --batch-size {fits} or auto"
        )
    fits = largest_fitting(config, budget, chunk_size, dtype, attention, cache_dtype)
    hint = f"about {fits:,} tokens fit" if fits else "not even 1,024 tokens fit"
    raise BamctlError(
        f"{n_tokens:,} tokens need about {need / 2**30:.1f} GiB on {device} ({attention} attention, "
        f"chunk {chunk_size}), but only {budget / 2**30:.1f} GiB are available: {hint}; "
        f"use shorter --lengths{', --attention blockwise' if attention == 'dense' else ''} or a smaller --chunk-size"
    )
