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
    config, n_tokens: int, chunk_size: int, dtype: torch.dtype, attention: str, cache_dtype: torch.dtype | None = None
) -> int:
    """Peak bytes to stream ``n_tokens`` through a model with ``config`` (weights included);
    ``dtype`` the weights', ``cache_dtype`` the KV cache's when it differs (autocast)."""
    element = torch.empty(0, dtype=dtype).element_size()
    chunk = min(chunk_size, n_tokens)
    hidden = int(config.ffn_dim_multiplier * config.dim)
    weights = element * (
        2 * config.vocab_size * config.dim + config.n_layers * (4 * config.dim**2 + 3 * config.dim * hidden)
    )
    cache = KVCache.nbytes_for(config.n_layers, 1, config.dim, n_tokens, cache_dtype or dtype)
    tables = 4 * config.n_layers * config.n_heads * n_tokens  # one float32 prior line per layer
    keys = n_tokens if attention == "dense" else min(KEY_BLOCK, n_tokens)
    scores = 4 * 3 * config.n_heads * chunk * keys  # logits, exp weights, matmul temporary (float32)
    activations = 4 * chunk * (6 * config.dim + 3 * hidden) + 4 * 256 * config.vocab_size
    prompt = 64 * n_tokens  # the prompt as Python ints and text, and its id tensors
    return weights + cache + tables + scores + activations + prompt


def largest_fitting(
    config, budget: int, chunk_size: int, dtype: torch.dtype, attention: str, cache_dtype: torch.dtype | None = None
) -> int:
    """The longest power-of-two length whose estimate fits in ``budget`` bytes (0 if none)."""
    n, best = 1024, 0
    while n <= 1 << 26 and estimate_bytes(config, n, chunk_size, dtype, attention, cache_dtype) <= budget:
        best, n = n, n * 2
    return best


def check_fits(
    config, n_tokens: int, chunk_size: int, dtype: torch.dtype, attention: str, device: torch.device,
    cache_dtype: torch.dtype | None = None,
) -> None:
    """Raise a BamctlError naming the estimate and what would fit when ``n_tokens`` cannot."""
    need = estimate_bytes(config, n_tokens, chunk_size, dtype, attention, cache_dtype)
    budget = int(devices.available_bytes(device) * devices.MEMORY_SAFETY)
    if need <= budget:
        return
    fits = largest_fitting(config, budget, chunk_size, dtype, attention, cache_dtype)
    hint = f"about {fits:,} tokens fit" if fits else "not even 1,024 tokens fit"
    raise BamctlError(
        f"{n_tokens:,} tokens need about {need / 2**30:.1f} GiB on {device} ({attention} attention, "
        f"chunk {chunk_size}), but only {budget / 2**30:.1f} GiB are available: {hint}; "
        f"use shorter --lengths{', --attention blockwise' if attention == 'dense' else ''} or a smaller --chunk-size"
    )
