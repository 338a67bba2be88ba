"""Map character offsets in a prompt to the tokens that hold them."""

from __future__ import annotations

from bisect import bisect_right
from typing import Sequence

from bamctl.tokenizer import Tokenizer


def token_starts(tokenizer: Tokenizer, ids: Sequence[int]) -> list[int] | None:
    """Character offset where each token starts, when the tokenizer can say so cheaply."""
    encoding = getattr(tokenizer, "encoding", None)
    decode_with_offsets = getattr(encoding, "decode_with_offsets", None)
    if decode_with_offsets is None:
        return None
    _, offsets = decode_with_offsets(list(ids))
    return offsets


def tokens_at_chars(tokenizer: Tokenizer, prompt: str, ids: Sequence[int], chars: Sequence[int]) -> list[int]:
    """For each character offset, the index of the token that contains it.

    A needle that follows a space starts inside the token " One", so its position
    is that token's index. Tokenizers without offsets fall back to encoding the
    prefix, which is exact for the byte-level BPEs we ship and close elsewhere.
    """
    starts = token_starts(tokenizer, ids)
    if starts is None:
        return [len(tokenizer.encode(prompt[:char].rstrip(" "))) for char in chars]
    return [bisect_right(starts, char) - 1 for char in chars]
