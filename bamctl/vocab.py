"""A model's vocabulary as a subset of its tokenizer's: small models, same prompts.

A reference model trained on a narrow corpus only ever sees a few thousand of GPT-2's
50,257 tokens; giving it the full embedding and output matrices would make a 100k-
parameter model weigh 25 MB. Such a model keeps the GPT-2 tokenizer — so its prompts
and lengths are token for token those of every other model — and maps tokenizer ids
to its own rows: the ids it knows in order, then one row for all the others (UNK).
"""

from __future__ import annotations

from typing import Sequence

import torch


class VocabSubset:
    def __init__(self, token_ids: Sequence[int], tokenizer_vocab_size: int):
        self.token_ids = list(token_ids)
        if len(set(self.token_ids)) != len(self.token_ids):
            raise ValueError("token_subset has repeated ids")
        self.unk = len(self.token_ids)  # model id of every token outside the subset
        self.size = self.unk + 1
        to_model = torch.full((tokenizer_vocab_size,), self.unk, dtype=torch.long)
        to_model[torch.tensor(self.token_ids, dtype=torch.long)] = torch.arange(self.unk)
        self._to_model = to_model
        # UNK maps back to itself as an id no tokenizer token has, so it never matches a target.
        self._to_tokenizer = torch.tensor([*self.token_ids, -1], dtype=torch.long)

    def to_model(self, ids: torch.Tensor) -> torch.Tensor:
        return self._to_model.to(ids.device)[ids]

    def to_tokenizer(self, ids: torch.Tensor) -> torch.Tensor:
        return self._to_tokenizer.to(ids.device)[ids]
