"""The essay haystack: shipped prose as a word sequence with sentence ends and token counts.

RULER collapses whitespace in its essays, splits on spaces into words (its
haystack unit) and inserts needles at sentence boundaries. We precompute, once
per tokenizer, where sentences end and how many tokens each word prefix holds,
so sizing a 128k prompt is a binary search over integers rather than over
encodes. When a prompt needs more words than the corpus has, the word sequence
repeats from the start (a sample records how many times).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate

from bamctl.tasks.texts import shipped_corpus
from bamctl.tokenizer import Tokenizer

# Words ending in . ! ? (optionally closed by quotes or brackets) end a sentence
# when the next word starts one; initials and these abbreviations do not.
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*$")
_SENTENCE_START = re.compile(r"^[\"'(\[]*[A-Z0-9]")
_NOT_AN_END = re.compile(r"^[\"'(\[]*([A-Za-z]|Mr|Mrs|Ms|Dr|St|Mt|vs|cf|etc|viz|No|Vol|pp?|ch|ed|i\.e|e\.g)\.$")


def sentence_ends(words: tuple[str, ...]) -> tuple[int, ...]:
    """Indices of words after which a sentence ends; the last word always ends one."""
    ends = [
        i
        for i in range(len(words) - 1)
        if _SENTENCE_END.search(words[i]) and not _NOT_AN_END.match(words[i]) and _SENTENCE_START.match(words[i + 1])
    ]
    ends.append(len(words) - 1)
    return tuple(ends)


def token_counts(tokenizer: Tokenizer, texts: list[str]) -> list[int]:
    """Tokens in each text, encoding each distinct text once."""
    unique = sorted(set(texts))
    encode_batch = getattr(tokenizer, "encode_batch", None)
    encoded = encode_batch(unique) if encode_batch else [tokenizer.encode(text) for text in unique]
    sizes = {text: len(ids) for text, ids in zip(unique, encoded)}
    return [sizes[text] for text in texts]


@dataclass(frozen=True)
class EssayHaystack:
    """Whitespace-separated words of the essay corpus, cycled when more are asked for."""

    words: tuple[str, ...]
    ends: tuple[int, ...]  # see sentence_ends
    token_prefix: tuple[int, ...]  # token_prefix[i]: tokens of words[:i], each after a space
    end_set: frozenset[int]

    @property
    def size(self) -> int:
        return len(self.words)

    def repeats(self, n_words: int) -> int:
        """How many times the corpus is started to supply ``n_words`` (1 = no repetition)."""
        return max(1, -(-n_words // self.size))

    def text(self, begin: int, end: int) -> str:
        """Words ``[begin, end)`` of the cycled sequence joined by single spaces."""
        parts, position = [], begin
        while position < end:
            offset = position % self.size
            stop = min(end - position, self.size - offset)
            parts.append(" ".join(self.words[offset : offset + stop]))
            position += stop
        return " ".join(parts)

    def estimate_tokens(self, n_words: int) -> int:
        """Tokens of the first ``n_words`` words: exact for GPT-2 up to the first word's space."""
        laps, rest = divmod(n_words, self.size)
        return laps * self.token_prefix[-1] + self.token_prefix[rest]

    def sentence_count(self, n_words: int) -> int:
        """Sentences in the first ``n_words`` words, a trailing unfinished one included."""
        if n_words <= 0:
            return 0
        laps, rest = divmod(n_words, self.size)
        complete = laps * len(self.ends) + bisect_right(self.ends, rest - 1)
        last_word_ends = (n_words - 1) % self.size in self.end_set
        return complete + (0 if last_word_ends else 1)

    def sentence_start(self, sentence: int, n_words: int) -> int:
        """Word index where sentence ``sentence`` begins, within the first ``n_words`` words."""
        if sentence <= 0:
            return 0
        if sentence >= self.sentence_count(n_words):
            return n_words
        laps, k = divmod(sentence - 1, len(self.ends))
        return laps * self.size + self.ends[k] + 1


@lru_cache(maxsize=4)
def essay_haystack(tokenizer: Tokenizer, corpus: str = "essays") -> EssayHaystack:
    words = tuple(re.sub(r"\s+", " ", shipped_corpus(corpus).text).strip().split(" "))
    counts = token_counts(tokenizer, [" " + word for word in words])
    ends = sentence_ends(words)
    return EssayHaystack(words, ends, (0, *accumulate(counts)), frozenset(ends))
