"""CoPE as a PE plugin: a bias that depends on the content, given as a scan so that it runs on the
blockwise attention path as well as on dense.

    bamctl new --pe examples/positional/cope.py:CoPE --preset tiny --out models/cope
"""

import torch


class CoPE(torch.nn.Module):
    """CoPE (Golovneva et al. 2024, "Contextual Position Encoding: Learning to Count What's Important",
    arXiv 2405.18719): key j's position seen from query i counts the keys from j to i whose gate
    sigmoid(q_i . k_t / sqrt(d)) is open, p_ij = sum_{t=j..i} g_it; the bias is q_i . e(p_ij), with e
    interpolated between learned embeddings of the integer positions 0 .. npos_max - 1."""

    content_dependent = True

    def __init__(self, config, npos_max: int = 64):
        super().__init__()
        self.npos_max, self.n_heads = npos_max, config.n_heads
        self.pos_emb = torch.nn.Parameter(torch.zeros(config.head_dim, npos_max))  # (Dh, P)

    def content_scan(self, q, scores, q_positions, k_positions, carry):
        """q (B, H, Tq, Dh); scores (B, H, Tq, Tb): a block of keys nearest first, future keys at -inf;
        carry: the gates counted in the blocks before (None first) -> (bias (B, H, Tq, Tb), carry)."""
        counted = torch.sigmoid(scores).cumsum(-1)  # a future key's gate is 0
        if carry is not None:
            counted = counted + carry
        positions = counted.clamp(max=self.npos_max - 1)  # p_ij
        floor = positions.floor()
        by_integer = q.float() @ self.pos_emb.float()  # (B, H, Tq, P): q_i . e[p] at each integer p
        lower, upper = by_integer.gather(-1, floor.long()), by_integer.gather(-1, positions.ceil().long())
        weight = positions - floor
        return upper * weight + lower * (1 - weight), counted[..., -1:]

    def describe(self) -> dict:
        # one table of position embeddings, shared by the heads: its mean norm, in each head's row
        return {"|e| mean": self.pos_emb.detach().norm(dim=0).mean().expand(self.n_heads)}
