"""A preallocated KV cache: one (B, H, capacity, Dh) buffer per layer for keys and values.

Preallocation keeps memory flat and predictable (it is the dominant term for long
contexts: 2 x layers x capacity x dim x bytes) and lets chunks write in place.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, n_layers: int, batch: int, n_heads: int, capacity: int, head_dim: int, dtype, device):
        shape = (batch, n_heads, capacity, head_dim)
        self.capacity = capacity
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]

    @staticmethod
    def nbytes_for(n_layers: int, batch: int, dim: int, capacity: int, dtype: torch.dtype) -> int:
        return 2 * n_layers * batch * capacity * dim * torch.empty(0, dtype=dtype).element_size()

    def store(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write a chunk's keys/values at ``start``; return views of everything up to its end."""
        stop = start + k.shape[2]
        if stop > self.capacity:
            raise ValueError(f"KV cache holds {self.capacity} positions, chunk ends at {stop}")
        self.keys[layer][:, :, start:stop] = k
        self.values[layer][:, :, start:stop] = v
        return self.keys[layer][:, :, :stop], self.values[layer][:, :, :stop]
