"""ALiBi restated as a PE plugin: a model built from it has the weights, logits and rows of `--pe alibi`.

    bamctl new --pe examples/positional/alibi.py:ALiBi --preset tiny --out models/alibi-plugin
"""

import math

import torch


class ALiBi(torch.nn.Module):
    """ALiBi (Press et al. 2022, "Train Short, Test Long"): bias -m_h |i - j|, fixed geometric slopes."""

    def __init__(self, config):
        super().__init__()
        n = config.n_heads  # a power of two here; ALiBi's rule for other counts is in its paper
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        self.register_buffer("slopes", torch.tensor([start * start**h for h in range(n)]), persistent=False)

    def distance_table(self, max_distance: int) -> torch.Tensor:
        """b_h(d) for d = 0 .. max_distance: (H, max_distance + 1)."""
        distance = torch.arange(max_distance + 1, device=self.slopes.device, dtype=torch.float32)
        return -self.slopes[:, None] * distance

    def describe(self) -> dict:
        return {"slope": self.slopes}
