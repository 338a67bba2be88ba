"""Sandwich as a PE plugin: a bias by distance alone, so every attention path runs it.

    bamctl new --pe examples/positional/sandwich.py:Sandwich --preset tiny --out models/sandwich
"""

import torch


class Sandwich(torch.nn.Module):
    """After Sandwich (Chi et al. 2023, "Dissecting Transformer Length Extrapolation via the Lens of
    Receptive Field Analysis", arXiv 2212.10356): the inner product of two sinusoidal position
    embeddings of dimension D, sum_k cos(d / 10000^(2k/D)), as a bias by distance alone, shifted to 0
    at d = 0. The paper's Sandwich is parameter-free; here each head scales it by a learned factor
    that starts at 8 / H."""

    def __init__(self, config, dim: int = 128):
        super().__init__()
        self.register_buffer("frequencies", 10000.0 ** (-torch.arange(1, dim // 2 + 1) * 2.0 / dim), persistent=False)
        self.log_scale = torch.nn.Parameter(torch.full((config.n_heads,), 8.0 / config.n_heads).log())  # (H,)

    def distance_table(self, max_distance: int) -> torch.Tensor:
        distance = torch.arange(max_distance + 1, device=self.frequencies.device, dtype=torch.float32)
        inner = torch.cos(distance[:, None] * self.frequencies[None, :]).sum(-1)  # (D+1,): p_i . p_j
        return self.log_scale.float().exp()[:, None] * (inner - inner[0])[None, :]  # (H, D+1), 0 at d = 0

    def describe(self) -> dict:
        return {"scale": self.log_scale.detach().exp()}
