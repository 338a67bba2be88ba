"""RULER's frequent words extraction (``fwe``): name the most frequent coded words of a Zipf-distributed text.

Faithful to NVIDIA/RULER (``scripts/data/synthetic/freq_words_extraction.py``,
``constants.py``, ``synthetic.yaml``):

* the template and answer prefix, a 50-token answer budget inside the length,
  ``string_match_all``;
* a vocabulary of ``(length - 50) // 50`` distinct coded words of 6 random lowercase
  letters in random rank order, the top rank replaced by ``...`` (noise the question
  says to ignore);
* word of rank k appears ``int(num_words * k**-alpha / zeta(alpha))`` times (alpha 2.0),
  the words shuffled and joined by spaces; the answer is ranks 2 to 4;
* no example (RULER's ``--add_fewshot`` is unused for fwe);
* ``sizing="ruler"``: RULER's calibration once per length, on a draw of its own (from
  ``budget // 6`` words, ``budget // 32`` more until the text reaches the budget, then
  one step back, where the budget is the length less the answer budget), then per
  sample ``budget // 32`` fewer until the prompt fits the budget.

Where we differ, on purpose:

* Every draw comes from a generator seeded by the sample's identity (the text's order
  also by its size) where RULER draws the vocabulary from one global stream and shuffles
  the text with a fresh ``random.Random(seed)``, which gives every text of one size the
  same permutation.
* ``zeta(alpha)`` is computed here (Euler-Maclaurin), not by scipy or mpmath; it agrees
  with ``scipy.special.zeta`` to a few units in the last place.
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass
from functools import lru_cache

from bamctl.errors import BamctlError
from bamctl.tasks.ruler import chat_frame
from bamctl.tasks.sample import Sample, SampleSlot, sample_rng
from bamctl.tasks.sizing import PromptSizes, check_sizing, size_prompt
from bamctl.tokenizer import Tokenizer

TEMPLATE = (
    "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
    "appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. "
    "What are the three most frequently appeared words in the above coded text?"
)
ANSWER_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"
NOISE = "..."  # the top rank's word
TOKENS_PER_WORD = 50  # RULER's vocabulary: one coded word per 50 tokens of budget
ANSWER_RANKS = slice(1, 4)  # ranks 2, 3 and 4
RULER_STEPS = 32  # RULER's step: the budget // 32 words

# Bernoulli numbers B2, B4, ..., B12 over (2j)!, for the Euler-Maclaurin tail of zeta.
_EULER_MACLAURIN = (1 / 12, -1 / 720, 1 / 30240, -1 / 1209600, 1 / 47900160, -691 / 1307674368000)


def zeta(alpha: float, terms: int = 16) -> float:
    """Riemann zeta(alpha) for alpha > 1: the first ``terms - 1`` terms summed exactly (smallest
    first), the rest by Euler-Maclaurin, an error far below a double's precision at ``terms`` 16."""
    if not alpha > 1:
        raise BamctlError(f"fwe's alpha must be greater than 1 (got {alpha})")
    n = terms
    head = math.fsum(k**-alpha for k in range(n - 1, 0, -1))
    tail = n ** (1 - alpha) / (alpha - 1) + n**-alpha / 2
    rising = alpha  # alpha (alpha + 1) ... (alpha + 2j - 2)
    for j, coefficient in enumerate(_EULER_MACLAURIN, start=1):
        tail += coefficient * rising * n ** (-alpha - 2 * j + 1)
        rising *= (alpha + 2 * j - 1) * (alpha + 2 * j)
    return head + tail


def zipf_counts(num_words: int, vocab_size: int, alpha: float) -> list[int]:
    """RULER's counts: rank k appears ``int(num_words * k**-alpha / zeta(alpha))`` times."""
    z = zeta(alpha)
    return [int(num_words * (k**-alpha) / z) for k in range(1, vocab_size + 1)]


def draw_vocabulary(rng, size: int, word_length: int) -> list[str]:
    """``size`` distinct coded words in random rank order, the first replaced by the noise word."""
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < size:
        word = "".join(rng.choices(string.ascii_lowercase, k=word_length))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return [NOISE] + words[1:]


def vocabulary_size(length: int, max_new_tokens: int) -> int:
    """RULER's ``vocab_size = -1``: one word per 50 tokens of the budget left for the prompt."""
    return (length - max_new_tokens) // TOKENS_PER_WORD


@dataclass
class FweParts:
    """One sample before its number of words is known."""

    vocabulary: list[str]
    alpha: float
    head: str
    tail: str
    placement: tuple
    tokenizer: Tokenizer

    @property
    def answers(self) -> list[str]:
        return self.vocabulary[ANSWER_RANKS]

    def words(self, num_words: int) -> list[str]:
        counts = zipf_counts(num_words, len(self.vocabulary), self.alpha)
        text = [word for word, count in zip(self.vocabulary, counts) for _ in range(count)]
        sample_rng(*self.placement, num_words).shuffle(text)
        return text

    def build(self, num_words: int) -> tuple[list[int], str]:
        prompt = self.head + " ".join(self.words(num_words)) + self.tail + ANSWER_PREFIX
        return self.tokenizer.encode(prompt), prompt

    def text_tokens(self, num_words: int) -> int:
        """Tokens of the coded text alone, each word after a space (a byte-level BPE's count, in any order)."""
        sizes = _word_sizes(self.tokenizer, tuple(self.vocabulary))
        counts = zipf_counts(num_words, len(self.vocabulary), self.alpha)
        return sum(count * size for count, size in zip(counts, sizes))


@lru_cache(maxsize=4)
def _word_sizes(tokenizer: Tokenizer, vocabulary: tuple[str, ...]) -> list[int]:
    return [len(tokenizer.encode(" " + word)) for word in vocabulary]


def _fwe_parts(slot: SampleSlot, tokenizer: Tokenizer, alpha: float, coded_wordlen: int, chat_template: bool) -> FweParts:
    identity = (slot.task, slot.length, slot.index)
    size = vocabulary_size(slot.length, slot.max_new_tokens)
    if size < ANSWER_RANKS.stop:
        raise BamctlError(f"length {slot.length} is too short for {slot.task}: its vocabulary needs at least {ANSWER_RANKS.stop} words")
    vocabulary = draw_vocabulary(sample_rng(slot.seed, *identity), size, coded_wordlen)
    chat = chat_frame(tokenizer) if chat_template else ("", "")
    head, tail = TEMPLATE.format(context="\x00").split("\x00")
    return FweParts(vocabulary, alpha, chat[0] + head, tail + chat[1], (slot.seed, *identity, "placement"), tokenizer)


def fwe_sample(
    *,
    slot: SampleSlot,
    tokenizer: Tokenizer,
    alpha: float = 2.0,
    coded_wordlen: int = 6,
    sizing: str = "exact",
    chat_template: bool = False,
    n_units: int | None = None,
) -> Sample:
    """One frequent-words prompt sized to ``slot.length`` by ``sizing`` (or of ``n_units`` words before
    RULER's rounding down of each count)."""
    check_sizing(sizing)
    if coded_wordlen < 1:
        raise BamctlError("fwe's coded_wordlen must be at least 1")
    parts = _fwe_parts(slot, tokenizer, alpha, coded_wordlen, chat_template)
    if n_units is None:
        n_units = size_prompt(sizing, PromptSizes(
            slot, lambda n: len(parts.build(n)[0]), parts.text_tokens, "without coded text",
            lambda probe: _ruler_calibration(probe, tokenizer, alpha, coded_wordlen, chat_template),
            max(1, (slot.length - slot.max_new_tokens) // RULER_STEPS),
        ))
    input_ids, prompt = parts.build(n_units)
    counts = zipf_counts(n_units, len(parts.vocabulary), alpha)
    return slot.sample(
        input_ids=input_ids,
        prompt=prompt,
        answers=parts.answers,
        meta={
            "answer_prefix": ANSWER_PREFIX,
            "top_counts": dict(zip(parts.vocabulary[:5], counts[:5])),
            "vocabulary_size": len(parts.vocabulary),
            "haystack_units": n_units,
        },
    )


@lru_cache(maxsize=64)
def _ruler_calibration(probe: SampleSlot, tokenizer: Tokenizer, alpha: float, coded_wordlen: int, chat_template: bool) -> int:
    """RULER's calibration: from ``budget // coded_wordlen`` words, ``budget // 32`` more until the
    prompt has at least the budget's tokens, then one step back."""
    parts = _fwe_parts(probe, tokenizer, alpha, coded_wordlen, chat_template)
    budget = probe.length - probe.max_new_tokens
    step = max(1, budget // RULER_STEPS)
    num_words = budget // coded_wordlen
    while len(parts.build(num_words)[0]) < budget:
        num_words += step
    return num_words - step
