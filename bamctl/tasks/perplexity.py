"""Perplexity: the corpus, documents of each length, and pure plans of what to score.

Two protocols:

* Sliding window (ALiBi paper, Hugging Face docs): a window feeds at most W
  tokens; its logits predict the tokens after its first one. The first window
  scores tokens 1..W-1; each later window ends S tokens further on and scores
  only tokens no window scored before, so every token 1..N-1 is scored exactly
  once. Counting is direct: ``sum(w.n_scored) == N - 1`` for every N, W, S.
  A window's first token is context only, so consecutive windows must share at
  least one token: the advance is ``min(S, W - 1)``. S = W therefore means
  back-to-back windows sharing that one token (nothing is scored twice, nothing
  skipped — the Hugging Face recipe instead loses one token per window); S = 1
  is the strict sliding evaluation, every token with W - 1 tokens of context.
* Position buckets (BAM authors): one pass, mean loss per block of W = ``bucket``
  predictions, as their evaluator cuts them. For a length L it feeds L + 1 tokens
  and scores the L predictions after the first, W at a time: bucket k holds
  predictions k*W .. (k+1)*W-1 (its row's ``position`` is k*W). With a BOS in front
  (their Wikipedia evaluation) the document is L tokens and bucket k scores its
  tokens k*W .. (k+1)*W-1, token 0 predicted from the BOS; without one (their
  FineWeb validation) the document is L + 1 tokens, token 0 is context only and
  bucket k scores tokens k*W+1 .. (k+1)*W. Either way every bucket scores W tokens
  (the last fewer when W does not divide L), L in all.

Documents are chosen by the seed: the corpus is cut into ``len(corpus) // n`` places of
``n`` tokens (n: the document's length), and a seeded shuffle of those places gives
document ``index`` its place. One seed never reads a passage twice; two seeds may pick the
same place, and then read the same document, which its ``draw`` (``doc@START``) says, so
statistics count it once. A request for more documents than the corpus holds at that
length is told so when it is planned (``ppl_shortfall``): documents past the distinct ones
repeat earlier ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from bamctl.errors import BamctlError
from bamctl.fingerprints import file_digest
from bamctl.tasks.sample import Sample, SampleSlot, ScoredSpan, sample_rng
from bamctl.tasks.texts import Corpus, file_corpus, shipped_corpus
from bamctl.tokenizer import Tokenizer


@dataclass(frozen=True)
class Window:
    """Feed ``tokens[begin:end]``; score the predictions of tokens ``[score_from, end)``.

    The prediction of token t comes from the logits at position t - 1 - begin.
    """

    begin: int
    end: int
    score_from: int

    @property
    def n_scored(self) -> int:
        return self.end - self.score_from


def sliding_windows(n_tokens: int, window: int, stride: int) -> list[Window]:
    """Windows covering a document of ``n_tokens`` tokens; see the module docstring."""
    if window < 2:
        raise BamctlError(f"window {window} is too small: a window needs 2 tokens to score one")
    if not 1 <= stride <= window:
        raise BamctlError(f"stride {stride} must be between 1 and the window ({window})")
    if n_tokens < 2:
        return []
    advance = min(stride, window - 1)
    end = min(window, n_tokens)
    windows = [Window(0, end, 1)]
    while end < n_tokens:
        previous, end = end, min(end + advance, n_tokens)
        windows.append(Window(max(0, end - window), end, previous))
    return windows


@dataclass(frozen=True)
class Bucket:
    """Bucket ``index``: the predictions ``[start, end)`` of one pass, which score the document's
    tokens ``[start + offset, end + offset)``."""

    index: int
    start: int
    end: int
    offset: int = 0  # 0: a BOS in front predicts token 0; 1: without one, token 0 is context only

    @property
    def first_token(self) -> int:
        return self.start + self.offset

    @property
    def stop_token(self) -> int:
        return self.end + self.offset

    @property
    def n_scored(self) -> int:
        return self.end - self.start


DEFAULT_BUCKET = 1024  # tokens per bucket, as the authors' evaluation groups them


def position_buckets(length: int, bucket: int, bos: bool = True) -> list[Bucket]:
    """The ``length`` predictions of one pass in blocks of ``bucket``, as the authors' evaluator
    cuts them (see the module docstring): bucket k holds predictions ``[k * bucket, (k + 1) *
    bucket)``, the last one shorter when ``bucket`` does not divide ``length``. ``bos``: whether
    one goes before the document, which is then ``length`` tokens (offset 0), else ``length + 1``
    (offset 1: token 0 only feeds the first prediction)."""
    if bucket < 1:
        raise BamctlError(f"bucket size {bucket} must be at least 1")
    offset = 0 if bos else 1
    return [Bucket(k, start, min(start + bucket, length), offset) for k, start in enumerate(range(0, length, bucket))]


def ppl_corpus(corpus_path: Path | None = None) -> Corpus:
    """The shipped perplexity corpus (see ``bamctl/data/tasks/README.md``) or a user's UTF-8 file."""
    return shipped_corpus("ppl") if corpus_path is None else file_corpus(Path(corpus_path))


def _corpus_tokens(tokenizer: Tokenizer, corpus_path: str | None) -> tuple[int, ...]:
    """The corpus as tokens; a user's file is read again when its contents change."""
    return _encoded_corpus(tokenizer, corpus_path, file_digest(corpus_path) if corpus_path else None)


@lru_cache(maxsize=4)
def _encoded_corpus(tokenizer: Tokenizer, corpus_path: str | None, contents: str | None) -> tuple[int, ...]:
    corpus = ppl_corpus(Path(corpus_path) if corpus_path else None)
    ids = tuple(tokenizer.encode(corpus.text))
    if len(ids) < 2:
        raise BamctlError(f"corpus {corpus.name} has fewer than 2 tokens")
    return ids


def ppl_corpus_tokens(tokenizer: Tokenizer, corpus_path: Path | str | None = None) -> list[int]:
    """The perplexity corpus as one token sequence (encoded once per process)."""
    return list(_corpus_tokens(tokenizer, str(corpus_path) if corpus_path else None))


@lru_cache(maxsize=256)
def document_places(seed: int, n_tokens: int, places: int, count: int) -> tuple[int, ...]:
    """The places (multiples of ``n_tokens`` in the corpus, numbered 0 .. ``places`` - 1) of the
    first ``count`` documents of ``seed``: distinct, in a seeded shuffle drawn one by one
    (Fisher-Yates, the swaps kept in a dict), so the first k never depend on how many are asked."""
    rng = sample_rng(seed, "ppl documents", n_tokens, places)
    swapped: dict[int, int] = {}
    chosen = []
    for i in range(min(count, places)):
        j = rng.randrange(i, places)
        chosen.append(swapped.get(j, j))
        swapped[j] = swapped.get(i, i)
    return tuple(chosen)


def ppl_document(
    tokenizer: Tokenizer, corpus_path: Path | str | None, n_tokens: int, index: int, seed: int = 0,
) -> tuple[list[int], dict]:
    """Document ``index`` of seed ``seed``: ``n_tokens`` consecutive corpus tokens at the place
    the seed's shuffle gives it (see the module docstring); ``meta["start"]`` is its first token.

    Past the corpus's distinct places, a seed's documents repeat its first ones. A corpus
    shorter than one document repeats from its start; ``meta["corpus_repeats"]`` says how
    often (1 = no repetition), because a model can copy a repeated passage and its
    perplexity then means little.
    """
    corpus = _corpus_tokens(tokenizer, str(corpus_path) if corpus_path else None)
    size = len(corpus)
    places = size // n_tokens
    start = 0
    if places:
        order = document_places(seed, n_tokens, places, min(index + 1, places))
        start = order[index % places] * n_tokens
    ids: list[int] = []
    while len(ids) < n_tokens:
        offset = (start + len(ids)) % size
        ids.extend(corpus[offset : offset + min(n_tokens - len(ids), size - offset)])
    meta = {
        "corpus": "ppl" if corpus_path is None else str(corpus_path),
        "corpus_tokens": size,
        "start": start,
        "documents": max(places, 1),  # distinct documents of this length the corpus holds
        "corpus_repeats": -(-n_tokens // size),  # 1 wherever the corpus holds a whole document
    }
    return ids, meta


def bucket_document_length(length: int, bos: bool) -> int:
    """A buckets document's tokens for ``length`` predictions: one more without a BOS in front,
    where its first token is context only (the module docstring)."""
    return length + (0 if bos else 1)


def document_length(spec, length: int, options: dict) -> int:
    """The tokens of one document: the sliding protocol's ``doc_tokens``, a buckets document's (the
    plan's options say whether a BOS goes in front)."""
    return options["doc_tokens"] if spec.protocol == "sliding" else bucket_document_length(length, options["bos"])


def ppl_shortfall(spec, lengths: list[int], n_samples: int, tokenizer: Tokenizer, options: dict) -> str | None:
    """One line when the corpus holds fewer distinct documents of some length than ``n_samples``."""
    corpus_path = options.get("corpus_path")
    size = len(_corpus_tokens(tokenizer, str(corpus_path) if corpus_path else None))
    for n in sorted({document_length(spec, length, options) for length in lengths}, reverse=True):
        if size // n < n_samples:
            name = "the perplexity corpus" if corpus_path is None else str(corpus_path)
            return (f"{name} holds {max(size // n, 1)} distinct document(s) of {n:,} tokens ({size:,} tokens with "
                    f"{tokenizer.name}); --samples {n_samples} asks for more, so documents repeat and each "
                    "counts once in the statistics")
    return None


def ppl_options(spec, lengths: list[int], options: dict) -> dict:
    """Defaults that depend on the request: a sliding run's document is its longest window."""
    if spec.protocol == "sliding":
        doc_tokens = options.get("doc_tokens") or max(lengths)
        if doc_tokens < max(lengths):
            # a window holds at most its document: every length past it would repeat its numbers
            raise BamctlError(f"--doc-tokens {doc_tokens:,} is shorter than the {max(lengths):,}-token window of "
                              f"--lengths: a window never holds more than its document; give --doc-tokens at least "
                              f"{max(lengths):,} (its default) or shorter lengths")
        return {**options, "doc_tokens": doc_tokens}  # a bad stride: ppl_plan's sliding_windows says which
    for key in ("stride", "doc_tokens"):
        if key in options:
            raise BamctlError(f"--{key.replace('_', '-')} applies to sliding windows only, not to {spec.protocol}")
    return {**options, "bucket": options.get("bucket", DEFAULT_BUCKET)}


def ppl_setting(spec, lengths: list[int], options: dict) -> str:
    """What sets a run apart from the protocol's defaults: ``stride=256``, ``bucket=512``,
    ``doc_tokens=…`` (when not the longest window), ``corpus=FILE``."""
    parts = []
    if options.get("corpus_path") is not None:
        parts.append(f"corpus={Path(options['corpus_path']).name}")
    if options.get("doc_tokens") not in (None, max(lengths)):
        parts.append(f"doc_tokens={options['doc_tokens']}")
    if options.get("stride") is not None:
        parts.append(f"stride={options['stride']}")
    if options.get("bucket") not in (None, DEFAULT_BUCKET):
        parts.append(f"bucket={options['bucket']}")
    return " ".join(parts)


def ppl_plan(
    *, spec, lengths: list[int], n_samples: int, seed: int, doc_tokens: int | None = None,
    stride: int | None = None, bucket: int = 0, **_,
) -> list[SampleSlot]:
    """sliding: for each document, every window of every length (a sample per window, scoring
    the tokens no earlier window scored); buckets: one sample per document of each length,
    one row per bucket of positions."""
    if spec.protocol == "sliding":
        return [
            spec.slot(length=window, depth=None, seed=seed, index=index, position=w.score_from, rows=(w.score_from,))
            for index in range(n_samples)
            for window in lengths
            for w in sliding_windows(doc_tokens, window, window if stride is None else stride)
        ]
    return [
        spec.slot(length=length, depth=None, seed=seed, index=index, rows=tuple(b.start for b in position_buckets(length, bucket)))
        for length in lengths
        for index in range(n_samples)
    ]


def ppl_sample(
    *, slot: SampleSlot, tokenizer: Tokenizer, corpus_path: Path | str | None = None,
    doc_tokens: int | None = None, stride: int | None = None, bucket: int = 0, bos: bool = False,
) -> Sample:
    """sliding: the window of ``slot.length`` tokens of document ``slot.index`` that scores from
    ``slot.position`` on; buckets: the whole document, its buckets scored separately (``bos``:
    whether the back-end puts a BOS before it, which decides its length)."""
    if slot.protocol == "sliding":
        document, meta = ppl_document(tokenizer, corpus_path, doc_tokens, slot.index, slot.seed)
        windows = sliding_windows(doc_tokens, slot.length, slot.length if stride is None else stride)
        window = next(w for w in windows if w.score_from == slot.position)
        ids = document[window.begin : window.end]
        scored = [ScoredSpan(window.score_from - window.begin, window.end - window.begin, window.score_from)]
    else:
        buckets = position_buckets(slot.length, bucket, bos)
        ids, meta = ppl_document(tokenizer, corpus_path, bucket_document_length(slot.length, bos), slot.index, slot.seed)
        scored = [ScoredSpan(b.first_token, b.stop_token, b.start) for b in buckets]
    return slot.sample(input_ids=ids, prompt=tokenizer.decode(ids), scored=scored, meta=meta, draw=f"doc@{meta['start']}")
