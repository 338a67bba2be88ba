"""Which tokenizer ids a small model gets rows for: every passkey piece, then frequent text.

The passkey prompt must be representable in full (task line, filler, needle, question,
both spellings of every digit), whatever the budget; the rest of the budget goes to the
most frequent ids of the training text, ties broken by id so the subset is the same
on every machine.
"""

from __future__ import annotations

import numpy as np

from bamctl.errors import BamctlError
from bamctl.tasks.passkey import FILLER, passkey_pieces
from bamctl.tokenizer import Tokenizer
from bamctl.train.data import TokenShards

FREQUENCY_SAMPLE = 20_000_000  # tokens counted from the start of a large --data folder


def passkey_token_ids(tokenizer: Tokenizer) -> list[int]:
    """Sorted ids of every piece of a passkey prompt, both protocols, any key."""
    ids: set[int] = set()
    for join in (" ", "\n"):
        for key in ("01234", "56789"):
            pieces = passkey_pieces(tokenizer, key, join)
            ids.update(pieces.task + pieces.needle + pieces.question)
    for lead in ("", " "):
        ids.update(tokenizer.encode(lead + FILLER))
    for digit in "0123456789":
        ids.update(tokenizer.encode(digit) + tokenizer.encode(" " + digit))
    return sorted(ids)


def build_token_subset(tokenizer: Tokenizer, text: TokenShards | None, budget: int) -> list[int] | None:
    """Passkey ids first, then the most frequent text ids, up to ``budget`` ids; None: budget 0 (all ids)."""
    if budget == 0:
        return None
    subset = passkey_token_ids(tokenizer)
    if budget < len(subset):
        raise BamctlError(f"[data] vocab_size {budget} is below the {len(subset)} ids a passkey prompt needs")
    if text is not None:
        counts = np.bincount(text.head(FREQUENCY_SAMPLE), minlength=tokenizer.vocab_size)
        order = np.lexsort((np.arange(len(counts)), -counts))  # by count descending, then id
        have = set(subset)
        for token in order:
            if len(subset) >= budget or counts[token] == 0:
                break
            if int(token) not in have:
                subset.append(int(token))
    return subset
