"""RULER's common words extraction (``cwe``): name the words a long numbered list repeats most.

Faithful to NVIDIA/RULER (``scripts/data/synthetic/common_words_extraction.py``,
``constants.py``, ``synthetic.yaml``):

* the template and answer prefix, a 120-token answer budget inside the length,
  ``string_match_all`` over the common words;
* the vocabulary: ``sorted(set(nouns + adjectives + verbs))`` of the ``wonderwords``
  package's lists (8,166 words with wonderwords 3.0.1);
* a sample: ``num_words`` distinct words drawn without replacement; the first
  ``num_cw`` (10) are the answer and appear ``freq_cw`` (30) times each, the others
  ``freq_ucw`` (3) times; the list is shuffled and numbered ``"1. w 2. w ..."``. Below
  4096 tokens RULER asks for 6 and 1 repeats instead;
* RULER's one-shot example before the task, its own draw of 40 words repeated 10 and 3
  times (below 4096 tokens: 20 words, 3 and 1), written as the whole prompt (chat
  template and answer prefix included) followed by ``" "`` and its numbered answer,
  then ``"\\n"``; it counts toward the length;
* ``sizing="ruler"``: RULER's binary search once per length (tokens per word from a
  4096-word probe; bounds 10 and twice what that suggests, at least 20), then per sample
  10 words fewer until the prompt fits.

Where we differ, on purpose:

* Every draw comes from a generator seeded by the sample's identity (the list's order
  also by its size) where RULER draws from one global stream and shuffles each list
  with a fresh ``random.Random(seed)``, which gives every list of one length the same
  permutation.
* Past the 8,166 words, RULER draws every word from its own ``english_words.json``,
  which no package ships; bamctl keeps the wonderwords words and adds adjective-noun
  pairs of the same lists (RULER's NIAH keys). At the default frequencies that happens
  only above about 111k GPT-2 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from bamctl.errors import BamctlError
from bamctl.tasks.ruler import chat_frame, random_word
from bamctl.tasks.sample import Sample, SampleSlot, sample_rng
from bamctl.tasks.sizing import PromptSizes, check_sizing, ruler_bisect, size_prompt
from bamctl.tasks.texts import common_words
from bamctl.tokenizer import Tokenizer

TEMPLATE = (
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n{context}\nQuestion: What are the {num_cw} most common words in the above list?"
)
ANSWER_PREFIX = " Answer: The top {num_cw} words that appear most often in the list are:"
SHORT = 4096  # below this length RULER uses the smaller repeats and example below
SHORT_REPEATS = (6, 1)  # (common, uncommon) repeats of the task's list below SHORT
EXAMPLE = (40, 10, 3)  # (distinct words, common repeats, uncommon repeats) of the one-shot example
SHORT_EXAMPLE = (20, 3, 1)
RULER_STEP = 10  # RULER's step and lower bound, in distinct words
RULER_PROBE_WORDS = 4096  # RULER's tokens-per-word probe


def numbered(words: list[str]) -> str:
    """RULER's list: ``"1. w1 2. w2 ..."``."""
    return " ".join(f"{i + 1}. {word}" for i, word in enumerate(words))


def repeated(common: list[str], uncommon: list[str], repeats: tuple[int, int], rng) -> list[str]:
    """Every common word ``repeats[0]`` times and every other ``repeats[1]`` times, shuffled."""
    words = common * repeats[0] + uncommon * repeats[1]
    rng.shuffle(words)
    return words


class WordOrder:
    """A sample's words in the order they join its list: a random permutation of the
    vocabulary, then (only when asked for more) distinct adjective-noun pairs. Taking more
    words never changes the ones already taken, so a bigger list only adds words."""

    def __init__(self, rng, more_rng):
        vocabulary = common_words()
        self.words = rng.sample(vocabulary, len(vocabulary))
        self.known = set(vocabulary)
        self.more_rng = more_rng

    def take(self, count: int) -> list[str]:
        while len(self.words) < count:
            pair = random_word(self.more_rng)
            if pair not in self.known:
                self.known.add(pair)
                self.words.append(pair)
        return self.words[:count]


@dataclass(frozen=True)
class CweShape:
    """How a sample at one length is made: the task's repeats and the example's."""

    num_cw: int
    repeats: tuple[int, int]
    example: tuple[int, int, int]

    @classmethod
    def at(cls, length: int, num_cw: int, freq_cw: int, freq_ucw: int) -> "CweShape":
        if length < SHORT:
            return cls(num_cw, SHORT_REPEATS, SHORT_EXAMPLE)
        return cls(num_cw, (freq_cw, freq_ucw), EXAMPLE)


class CweParts:
    """One sample before its number of distinct words is known."""

    def __init__(self, slot: SampleSlot, tokenizer: Tokenizer, shape: CweShape, chat_template: bool):
        identity = (slot.task, slot.length, slot.index)
        self.slot, self.tokenizer, self.shape = slot, tokenizer, shape
        self.placement = (slot.seed, *identity, "placement")
        self.order = WordOrder(sample_rng(slot.seed, *identity), sample_rng(slot.seed, *identity, "more words"))
        chat = chat_frame(tokenizer) if chat_template else ("", "")
        head, tail = TEMPLATE.format(context="\x00", num_cw=shape.num_cw).split("\x00")
        self.head, self.tail = chat[0] + head, tail + chat[1]
        self.answer_prefix = ANSWER_PREFIX.format(num_cw=shape.num_cw)
        self.example = self._example(sample_rng(slot.seed, *identity, "example"))
        self._word_tokens: list[int] = [0]  # prefix sums of the tokens of " word" in order

    @property
    def answers(self) -> list[str]:
        return self.order.take(self.shape.num_cw)

    def _example(self, rng) -> str:
        count, common_repeats, uncommon_repeats = self.shape.example
        words = rng.sample(common_words(), count)
        listed = repeated(words[: self.shape.num_cw], words[self.shape.num_cw :], (common_repeats, uncommon_repeats), rng)
        return self.head + numbered(listed) + self.tail + self.answer_prefix + " " + numbered(words[: self.shape.num_cw])

    def words(self, n_words: int) -> list[str]:
        if n_words < self.shape.num_cw:
            raise BamctlError(f"{self.slot.task} needs at least {self.shape.num_cw} distinct words (got {n_words})")
        words = self.order.take(n_words)
        rng = sample_rng(*self.placement, n_words)
        return repeated(words[: self.shape.num_cw], words[self.shape.num_cw :], self.shape.repeats, rng)

    def build(self, n_words: int) -> tuple[list[int], str]:
        prompt = self.example + "\n" + self.head + numbered(self.words(n_words)) + self.tail + self.answer_prefix
        return self.tokenizer.encode(prompt), prompt

    def list_tokens(self, extra: int) -> int:
        """Tokens of the list with ``num_cw + extra`` distinct words: the numbers' and the words'
        (each after a space), which is what a byte-level BPE gives, in any order."""
        n_words = self.shape.num_cw + extra
        words = self.order.take(n_words)
        if len(self._word_tokens) <= n_words:
            for word in words[len(self._word_tokens) - 1 :]:
                self._word_tokens.append(self._word_tokens[-1] + len(self.tokenizer.encode(" " + word)))
        common, uncommon = self.shape.repeats
        entries = self.shape.num_cw * common + extra * uncommon
        listed = common * self._word_tokens[self.shape.num_cw] + uncommon * (self._word_tokens[n_words] - self._word_tokens[self.shape.num_cw])
        return number_tokens(self.tokenizer, entries) + listed


@lru_cache(maxsize=8)
def _number_prefix(tokenizer: Tokenizer) -> list[int]:
    return [0]  # grown by number_tokens


def number_tokens(tokenizer: Tokenizer, entries: int) -> int:
    """Tokens of the numbers ``" 1."`` to ``" {entries}."``, each encoded once per tokenizer
    (one call per short text: faster than a batch call's thread hand-offs)."""
    prefix = _number_prefix(tokenizer)
    for i in range(len(prefix), entries + 1):
        prefix.append(prefix[-1] + len(tokenizer.encode(f" {i}.")))
    return prefix[entries]


def cwe_sample(
    *,
    slot: SampleSlot,
    tokenizer: Tokenizer,
    num_cw: int = 10,
    freq_cw: int = 30,
    freq_ucw: int = 3,
    sizing: str = "exact",
    chat_template: bool = False,
    n_units: int | None = None,
) -> Sample:
    """One common-words prompt sized to ``slot.length`` by ``sizing`` (or with ``n_units`` distinct words)."""
    check_sizing(sizing)
    if num_cw < 1 or freq_cw <= freq_ucw or freq_ucw < 1:
        raise BamctlError("cwe needs num_cw >= 1 and freq_cw > freq_ucw >= 1")
    shape = CweShape.at(slot.length, num_cw, freq_cw, freq_ucw)
    parts = CweParts(slot, tokenizer, shape, chat_template)
    if n_units is None:
        n_units = size_prompt(sizing, PromptSizes(
            slot, lambda n: len(parts.build(n)[0]), lambda n: parts.list_tokens(n - num_cw), f"with only its {num_cw} common words",
            lambda probe: _ruler_search(probe, tokenizer, shape, chat_template), RULER_STEP, smallest=num_cw,
        ))
    input_ids, prompt = parts.build(n_units)
    return slot.sample(
        input_ids=input_ids,
        prompt=prompt,
        answers=parts.answers,
        meta={
            "answer_prefix": parts.answer_prefix,
            "repeats": list(shape.repeats),
            "haystack_units": n_units,
        },
    )


@lru_cache(maxsize=64)
def _ruler_search(probe: SampleSlot, tokenizer: Tokenizer, shape: CweShape, chat_template: bool) -> int:
    """RULER's search: tokens per word from a 4096-word prompt, bounds 10 and twice the words that
    suggests (at least 20), then the most words whose prompt and answer budget fit."""
    parts = CweParts(probe, tokenizer, shape, chat_template)
    per_word = len(parts.build(RULER_PROBE_WORDS)[0]) / RULER_PROBE_WORDS
    upper = max(int(probe.length // per_word) * 2, RULER_STEP * 2)
    total = lambda n: len(parts.build(n)[0]) + probe.max_new_tokens  # noqa: E731
    return ruler_bisect(total, probe.length, RULER_STEP, upper, RULER_STEP)
