"""RoPE told randomized positions while it trains: a PE plugin through the position-index hook.

    bamctl new --pe examples/positional/randomized_rope.py:RandomizedRoPE --preset tiny --out models/rrope
"""

import torch

from bamctl.positional import RoPE


class RandomizedRoPE(RoPE):
    """Randomized positions (Ruoss et al. 2023, "Randomized Positional Encodings Boost Length
    Generalization of Transformers", arXiv 2305.16843): in training, a prompt's T tokens are told
    T positions drawn without replacement from 0 .. spread * train_length - 1 and sorted, so the
    model meets the angles of long contexts on short prompts; in evaluation, their own indices.
    The rotation is the zoo's RoPE, which this class extends."""

    def __init__(self, config, spread: int = 8):
        super().__init__(config)
        self.longest = spread * config.train_length

    def position_ids(self, token_indices):
        if not self.training:
            return token_indices
        n = token_indices.shape[0]
        drawn = torch.randperm(max(self.longest, n), device=token_indices.device)[:n]
        return drawn.sort().values
