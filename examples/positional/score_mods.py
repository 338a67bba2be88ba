"""FlexAttention score_mods as PE plugins, unchanged: attention-gym's ALiBi (whose rows equal
`--pe alibi`'s) and its tanh soft-capping (Gemma 2's), as their library writes them.

    pip install attn-gym
    bamctl new --pe examples/positional/score_mods.py:GymALiBi --preset tiny --out models/gym-alibi

A `score_mod(score, b, h, q_idx, kv_idx)` returns the new score, as in FlexAttention: bamctl calls
it with the scaled dot product of query `q_idx` and key `kv_idx` (absolute positions) in head `h`
of sequence `b`, on the flex, blockwise and dense paths.
"""

import torch


class GymALiBi(torch.nn.Module):
    """attention-gym's ALiBi score_mod: score + (kv_idx - q_idx) * 2^(-8 (h + 1) / H)."""

    def __init__(self, config):
        super().__init__()
        from attn_gym.mods.alibi import generate_alibi_bias

        self.mod = generate_alibi_bias(config.n_heads)

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return self.mod(score, b, h, q_idx, kv_idx)


class GymSoftcapALiBi(GymALiBi):
    """ALiBi's new score, then attention-gym's tanh soft-capping of it at 20 (Gemma 2's cap is 50)."""

    def __init__(self, config, cap: float = 20.0):
        super().__init__(config)
        from attn_gym.mods.softcapping import generate_tanh_softcap

        self.cap = generate_tanh_softcap(cap, approx=False)

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return self.cap(self.mod(score, b, h, q_idx, kv_idx), b, h, q_idx, kv_idx)
