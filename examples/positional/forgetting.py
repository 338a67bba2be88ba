"""Forgetting Attention (Lin et al. 2025, "Forgetting Transformer: Softmax Attention with a Forget
Gate") as a PE plugin, written as the paper writes it: a scalar forget gate per head and token,
f_t = sigmoid(w_h . x_t + b_h), from the attention layer's input x_t, and the logit of query i on
key j biased by D_ij = sum over l = j+1 .. i of log f_l.

    bamctl new --pe examples/positional/forgetting.py:ForgettingGate --preset tiny --out models/fox

The gate reads the layer's input, which only the ``observe(x, positions)`` hook sees: it keeps the
running sum c_t = sum over l <= t of log f_l for every position fed (a new sequence starts at
position 0; a position fed again is recomputed from the one before it), so D_ij = c_i - c_j is
read pair by pair for keys of earlier chunks too.
"""

import torch
import torch.nn.functional as F


class ForgettingGate(torch.nn.Module):
    """Forgetting Attention: a data-dependent forget gate per head, D_ij = sum_{l=j+1}^{i} log f_l."""

    content_dependent = True

    def __init__(self, config):
        super().__init__()
        self.gate = torch.nn.Linear(config.dim, config.n_heads)  # w_h and b_h of every head
        self.sums = None  # (B, H, positions fed) running sums of log f

    def observe(self, x, positions):
        log_f = F.logsigmoid(self.gate(x.float())).transpose(1, 2)  # (B, H, T)
        start = int(positions[0])
        before = 0.0 if start == 0 else self.sums[:, :, start - 1 : start]
        sums = before + log_f.cumsum(-1)
        self.sums = sums if start == 0 else torch.cat([self.sums[:, :, :start], sums], dim=-1)

    def pair_bias(self, q, k, q_positions):
        sums, last = self.sums, self.sums.shape[-1] - 1

        def bias(score, b, h, i, j):  # indices past the last position fed (flex's padding) are masked anyway
            return sums[b, h, i.clamp(max=last)] - sums[b, h, j.clamp(max=last)]

        return bias
