"""After CABLE as a PE plugin: a bias by the content given pair by pair (a score_mod), so that every
path that walks tiles of keys serves it: FlexAttention, blockwise and dense.

    bamctl new --pe examples/positional/cable.py:Cable --preset tiny --out models/cable
"""

import torch


class Cable(torch.nn.Module):
    """After CABLE (Veisi et al. 2025, "Context-aware Biases for Length Extrapolation", arXiv
    2503.08067): each token t gives head h a rate r_ht = softplus(w_h . k_ht + c_h) >= 0, and key j's
    bias seen from query i is -(r_h,j+1 + ... + r_h,i): a distance counted in the content's own units,
    ALiBi's where every rate is its slope (as at the start here). CABLE reads the rates from the
    layer's input; here they come from each head's key, which is what the hooks see."""

    content_dependent = True

    def __init__(self, config):
        super().__init__()
        n = config.n_heads  # ALiBi's slopes for a power of two, as examples/positional/alibi.py
        slopes = torch.tensor([2 ** (-8 * (h + 1) / n) for h in range(n)])
        self.weight = torch.nn.Parameter(torch.zeros(n, config.head_dim))
        self.offset = torch.nn.Parameter(torch.log(torch.expm1(slopes)))  # softplus(offset) = slope

    def pair_bias(self, q, k, q_positions):
        """q (B, H, Tq, Dh), k (B, H, Tk, Dh) every key up to the last query -> bias(score, b, h, i, j)."""
        rates = torch.nn.functional.softplus(torch.einsum("bhtd,hd->bht", k.float(), self.weight) + self.offset[:, None])
        total = rates.cumsum(-1)  # (B, H, Tk): the rates of keys 0 .. t

        def bias(score, b, h, i, j):  # i, j absolute positions; j > i is masked whatever it gives
            return total[b, h, j] - total[b, h, i]
        return bias

    def describe(self) -> dict:
        return {"start rate": torch.nn.functional.softplus(self.offset.detach()), "|w|": self.weight.detach().norm(dim=-1)}
