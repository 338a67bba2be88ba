"""RoPE restated as a PE plugin, through the hook that rotates queries and keys by position.

    bamctl new --pe examples/positional/rope.py:RoPE --preset tiny --out models/rope-plugin
"""

import torch


class RoPE(torch.nn.Module):
    """Rotary position embedding (Su et al. 2021, "RoFormer"): channel pairs (2k, 2k+1) of each query and
    key turned by the angle position * base^(-2k/Dh), as Meta's Llama code pairs them."""

    def __init__(self, config):
        super().__init__()
        pairs = torch.arange(0, config.head_dim, 2, dtype=torch.float32) / config.head_dim
        self.register_buffer("inverse_frequencies", 1.0 / config.rope_base**pairs, persistent=False)  # (Dh/2,)

    def transform_qk(self, q, k, q_positions, k_positions):
        """q (B, H, Tq, Dh), k (B, H, Tk, Dh) at these absolute positions -> the same, rotated."""
        return self._rotate(q, q_positions), self._rotate(k, k_positions)

    def _rotate(self, x, positions):
        angles = positions.float()[:, None] * self.inverse_frequencies[None, :]  # (T, Dh/2)
        cos, sin = angles.cos(), angles.sin()
        pairs = x.float().unflatten(-1, (-1, 2))  # (B, H, T, Dh/2, 2)
        even, odd = pairs[..., 0], pairs[..., 1]
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2).type_as(x)
