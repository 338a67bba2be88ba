"""RULER's needle-in-a-haystack family (NIAH), sized to the model's tokenizer.

Faithful to NVIDIA/RULER (``scripts/data/synthetic/niah.py``, ``constants.py``,
``synthetic.yaml``, ``prepare.py``): the same template, answer prefix and needle
sentence, the same singular rewording when one value is asked for, the same
haystacks (``noise``, ``essay``, ``needle``), key and value kinds (``words`` from
wonderwords' adjective and noun lists, 7-digit ``numbers``, ``uuids``), needle
placement (essay: Punkt sentence boundaries at 40 depths
``round(linspace(0, 100, 40))``, the essay text Punkt's sentences joined by one
space, byte for byte RULER's; noise and needle: random lines) and, with a chat
template, the template's tokens counted in the length and the answer prefix
opening the assistant turn.

Two sizings (``sizing``): ``exact`` (bamctl's) gives each sample the largest
haystack with ``len(input_ids) + max_new_tokens <= length``; ``ruler`` reproduces
RULER's: one binary search per length for the haystack size, then per sample
500 essay words (or 25 lines, 5 below 4096 tokens) fewer until it fits.

Where we differ, on purpose:
* Every random draw comes from a generator seeded by the sample's identity, and
  the placement generator also by the haystack size; RULER draws from one global
  stream, so its samples depend on the sizing search that ran before them (and a
  RULER retry draws new needles where ours keeps the sample's).
* The shipped essays are public-domain prose, not Paul Graham's essays
  (``--haystack`` reads RULER's own file).
* The singular rewording applies to the task text only; RULER's also rewrites the
  chat template around it ("You is a helpful AI assistant").
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from bamctl.errors import BamctlError
from bamctl.fingerprints import file_digest
from bamctl.tasks.haystacks import EssayHaystack, essay_haystack, token_counts
from bamctl.tasks.passkey import FILLER
from bamctl.tasks.sample import Sample, SampleSlot, sample_rng
from bamctl.tasks.sizing import PromptSizes, check_sizing, ruler_bisect, size_prompt
from bamctl.tasks.spans import tokens_at_chars
from bamctl.tasks.texts import ruler_words
from bamctl.tokenizer import Tokenizer

NEEDLE = "One of the special magic {type_v} for {key} is: {value}."
TEMPLATE = (
    "Some special magic {type_v} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {type_v} afterwards.\n{context}\n"
    "What are all the special magic {type_v} for {query} mentioned in the provided text?"
)
ANSWER_PREFIX = " The special magic {type_v} for {query} mentioned in the provided text are"
# RULER's rewording when exactly one value is asked for (num_queries * num_values == 1).
TEMPLATE_SINGULAR = (
    "A special magic {type_v} is hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {type_v} afterwards.\n{context}\n"
    "What is the special magic {type_v} for {query} mentioned in the provided text?"
)
ANSWER_PREFIX_SINGULAR = " The special magic {type_v} for {query} mentioned in the provided text is"
ESSAY_DEPTHS = tuple(int(round(100 * i / 39)) for i in range(40))  # RULER: np.round(np.linspace(0, 100, 40))
HAYSTACKS = ("noise", "essay", "needle")


def random_number(rng) -> str:
    return str(rng.randint(10**6, 10**7 - 1))


def random_word(rng) -> str:
    """An adjective-noun key, uniform over RULER's pairs (an adjective then a noun: each pair
    as likely as in RULER's draw from the sorted list of all of them)."""
    adjectives, nouns = ruler_words()
    return f"{rng.choice(adjectives)}-{rng.choice(nouns)}"


def random_uuid(rng) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


NEEDLE_KINDS: dict[str, Callable] = {"numbers": random_number, "words": random_word, "uuids": random_uuid}


@dataclass(frozen=True)
class NiahSpec:
    """One RULER variant: the arguments of its entry in ``bamctl/data/tasks/ruler.toml``."""

    haystack: str
    key_type: str
    value_type: str
    num_keys: int = 1
    num_values: int = 1
    num_queries: int = 1

    def __post_init__(self) -> None:
        if self.haystack not in HAYSTACKS:
            raise BamctlError(f"unknown haystack {self.haystack!r}; known: {', '.join(HAYSTACKS)}")
        for kind in (self.key_type, self.value_type):
            if kind not in NEEDLE_KINDS:
                raise BamctlError(f"unknown needle kind {kind!r}; known: {', '.join(NEEDLE_KINDS)}")
        if min(self.num_keys, self.num_values, self.num_queries) < 1:
            raise BamctlError("num_keys, num_values and num_queries must be at least 1")

    @property
    def singular(self) -> bool:
        return self.num_queries * self.num_values == 1

    @property
    def n_needles(self) -> int:
        return self.n_keys * self.num_values

    @property
    def n_keys(self) -> int:
        return max(self.num_keys, self.num_queries)  # RULER asks about distinct keys


@dataclass(frozen=True)
class NiahDraw:
    """Everything random about a sample except where the needles go."""

    keys: list[str]
    values: list[list[str]]
    needles: list[str]  # shuffled, in the order they will appear
    query_keys: list[str]
    answers: list[str]


def niah_takes_depths(args: dict) -> bool:
    """Whether ``--depths`` applies: it places one needle, so only a variant that hides one."""
    return NiahSpec(**args).n_needles == 1


def draw_needles(spec: NiahSpec, rng) -> NiahDraw:
    """Keys, values and queries in RULER's order of draws."""
    keys, values, needles = [], [], []
    for _ in range(spec.n_keys):
        key = NEEDLE_KINDS[spec.key_type](rng)
        while key in keys:
            key = NEEDLE_KINDS[spec.key_type](rng)
        keys.append(key)
        values.append([NEEDLE_KINDS[spec.value_type](rng) for _ in range(spec.num_values)])
        needles += [NEEDLE.format(type_v=spec.value_type, key=key, value=value) for value in values[-1]]
    rng.shuffle(needles)
    chosen = rng.sample(range(spec.n_keys), spec.num_queries)
    query_keys = [keys[i] for i in chosen]
    answers = [value for i in chosen for value in values[i]]
    return NiahDraw(keys, values, needles, query_keys, answers)


def join_queries(keys: list[str]) -> str:
    """RULER's list: "a", "a, and b", "a, b, and c"."""
    return keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + ", and " + keys[-1]


def niah_frame(spec: NiahSpec, query_keys: list[str], chat: tuple[str, str] | None = None) -> tuple[str, str, str]:
    """(text before the context, text after it, answer prefix) for this variant; with a chat
    template's (head, tail), the task text is the user turn and the answer prefix opens the
    assistant's, as RULER's ``prepare.py`` builds it."""
    template, prefix = (TEMPLATE_SINGULAR, ANSWER_PREFIX_SINGULAR) if spec.singular else (TEMPLATE, ANSWER_PREFIX)
    type_v = spec.value_type[:-1] if spec.singular else spec.value_type
    query = join_queries(query_keys)
    head, tail = template.format(type_v=type_v, query=query, context="\x00").split("\x00")
    if chat is not None:
        head, tail = chat[0] + head, tail + chat[1]
    return head, tail, prefix.format(type_v=type_v, query=query)


class Distractors:
    """The ``needle`` haystack: an endless, prefix-stable list of decoy needles.

    Decoy i is the same however many are used, so growing the haystack during
    sizing never changes the decoys already placed.
    """

    def __init__(self, spec: NiahSpec, rng, avoid: set[str], tokenizer: Tokenizer):
        self.spec, self.rng, self.avoid, self.tokenizer = spec, rng, avoid, tokenizer
        self.lines: list[str] = []
        self.prefix_tokens: list[int] = [0]

    def ensure(self, count: int) -> None:
        new = []
        while len(self.lines) + len(new) < count:
            key = NEEDLE_KINDS[self.spec.key_type](self.rng)
            if key in self.avoid:
                continue
            value = NEEDLE_KINDS[self.spec.value_type](self.rng)
            new.append(NEEDLE.format(type_v=self.spec.value_type, key=key, value=value))
        if new:
            for size in token_counts(self.tokenizer, ["\n" + line for line in new]):
                self.prefix_tokens.append(self.prefix_tokens[-1] + size)
            self.lines += new


@dataclass(frozen=True)
class Context:
    text: str
    needle_chars: list[int]  # offset of each needle inside `text`
    depth: float  # of the first needle, as a fraction of the haystack
    repeats: int  # times the essay corpus was started (1 = no repetition)
    depths: tuple[float, ...] = ()  # essay: each needle's depth in percent of the sentences, ascending


def _identity(slot: SampleSlot) -> tuple:
    # The identity the draws are seeded by; the task twice, as when RULER's tasks were
    # variants named like the task, so samples drawn then are drawn again now.
    return (slot.task, slot.task, slot.length, slot.index)


def niah_draw(slot: SampleSlot, spec: NiahSpec) -> NiahDraw:
    """The sample's keys, values, shuffled needles and queries: the same at every haystack size."""
    return draw_needles(spec, sample_rng(slot.seed, *_identity(slot)))


def placement_rng(slot: SampleSlot, n_units: int):
    """The generator that places the sample's needles in a haystack of ``n_units`` units."""
    return sample_rng(slot.seed, *_identity(slot), "placement", n_units)


def essay_context(haystack: EssayHaystack, needles: list[str], n_words: int, rng, depth: float | None) -> Context:
    """RULER's essay context: Punkt's sentences of the first ``n_words`` words, a needle before
    sentence ``int(count * depth / 100)`` for each drawn depth, every piece joined by one space,
    empty ones included (a needle first or last thus has a space before or after it)."""
    if depth is None:
        depths = sorted(rng.sample(ESSAY_DEPTHS, len(needles)))
        return essay_context_at(haystack, needles, n_words, depths, depths[0] / 100)
    return essay_context_at(haystack, needles, n_words, [depth * 100], depth)


def essay_context_at(haystack: EssayHaystack, needles: list[str], n_words: int, depths: list[float], first_depth: float) -> Context:
    """The essay context with needle ``i`` before sentence ``int(count * depths[i] / 100)`` (``depths``
    ascending, in percent), RULER's way (see ``essay_context``)."""
    bounds = haystack.sentences(n_words)
    n_sents = len(bounds) - 1
    cuts = [0, *(int(n_sents * (d / 100)) for d in depths), n_sents]
    pieces, starts, length = [], [], 0
    for i, needle in enumerate(needles):
        pieces += [haystack.sentence_text(bounds, cuts[i], cuts[i + 1]), needle]
        length += len(pieces[-2]) + 1
        starts.append(length)
        length += len(needle) + 1
    pieces.append(haystack.sentence_text(bounds, cuts[len(needles)], n_sents))
    return Context(" ".join(pieces), starts, first_depth, haystack.repeats(n_words), tuple(depths))


def line_context(lines: list[str], needles: list[str], rng, depth: float | None) -> Context:
    n_lines = len(lines)
    if depth is None:
        slots = sorted(rng.sample(range(n_lines), len(needles))) if n_lines >= len(needles) else [n_lines] * len(needles)
        first_depth = slots[0] / n_lines if n_lines else 0.0
    else:
        slots, first_depth = [min(n_lines, int(depth * n_lines))], depth
    merged, starts, length, previous = [], [], 0, 0
    for slot, needle in zip(slots, needles):
        merged += lines[previous:slot]
        length += sum(len(line) + 1 for line in lines[previous:slot])
        starts.append(length)
        merged.append(needle)
        length += len(needle) + 1
        previous = slot
    merged += lines[previous:]
    return Context("\n".join(merged), starts, first_depth, 1)


class Haystack:
    """The context of one sample as a function of its size ``n`` (essay words, noise lines or
    decoy needles), with a cheap monotone estimate of its tokens for the sizing search."""

    def __init__(self, spec: NiahSpec, draw: NiahDraw, tokenizer: Tokenizer, placement, depth: float | None, decoy_rng,
                 essay_path: str | None = None):
        self.spec, self.draw, self.placement, self.depth = spec, draw, placement, depth
        self.essay = essay_haystack(tokenizer, essay_path) if spec.haystack == "essay" else None
        self.decoys = Distractors(spec, decoy_rng, set(draw.keys), tokenizer) if spec.haystack == "needle" else None
        self.noise_line = token_counts(tokenizer, ["\n" + FILLER])[0]

    def context(self, n: int) -> Context:
        rng = self.placement(n)
        if self.essay is not None:
            return essay_context(self.essay, self.draw.needles, n, rng, self.depth)
        if self.decoys is not None:
            self.decoys.ensure(n)
            return line_context(self.decoys.lines[:n], self.draw.needles, rng, self.depth)
        return line_context([FILLER] * n, self.draw.needles, rng, self.depth)

    def estimate(self, n: int) -> int:
        if self.essay is not None:
            return self.essay.estimate_tokens(n)
        if self.decoys is not None:
            self.decoys.ensure(n)
            return self.decoys.prefix_tokens[n]
        return n * self.noise_line


def niah_sample(
    *,
    slot: SampleSlot,
    tokenizer: Tokenizer,
    haystack: str,
    key_type: str,
    value_type: str,
    num_keys: int = 1,
    num_values: int = 1,
    num_queries: int = 1,
    sizing: str = "exact",
    haystack_path: str | None = None,
    chat_template: bool = False,
    n_units: int | None = None,
) -> Sample:
    """One NIAH prompt sized to ``slot.length`` by ``sizing`` (or with exactly ``n_units``).

    ``n_units`` counts haystack units: essay words, noise lines or decoy needles.
    ``haystack_path`` replaces the shipped essays; ``chat_template`` wraps the task in the
    tokenizer's chat template, the answer prefix opening the assistant turn.
    """
    spec = NiahSpec(haystack, key_type, value_type, num_keys, num_values, num_queries)
    check_sizing(sizing)
    parts = _niah_parts(slot, tokenizer, spec, haystack_path, chat_template)
    if n_units is None:
        contents = file_digest(haystack_path) if haystack_path else None  # a changed file is searched again
        n_units = size_prompt(sizing, PromptSizes(
            slot, lambda n: len(parts.build(n)[1]), parts.estimate, "without haystack",
            lambda probe: _ruler_search(probe, tokenizer, spec, haystack_path, contents, chat_template),
            ruler_increment(haystack, slot.length),
        ))
    draw, head, answer_prefix, build = parts.draw, parts.head, parts.answer_prefix, parts.build
    context, input_ids, prompt = build(n_units)
    positions = tokens_at_chars(tokenizer, prompt, input_ids, [len(head) + c for c in context.needle_chars])
    return slot.sample(
        input_ids=input_ids,
        prompt=prompt,
        needle_depth=round(context.depth, 6),
        answers=draw.answers,
        needle_positions=sorted(positions),
        meta={
            "answer_prefix": answer_prefix,
            "queries": draw.query_keys,
            "keys": draw.keys,
            "values": draw.values,
            "haystack": haystack,
            "haystack_units": n_units,
            "haystack_repeats": context.repeats,
            **({"depths": list(context.depths)} if haystack == "essay" else {}),
        },
    )


def chat_frame(tokenizer: Tokenizer) -> tuple[str, str]:
    """The text a chat template puts before and after one user turn, up to the assistant's reply."""
    frame = getattr(tokenizer, "chat_frame", None)
    if frame is None:
        raise BamctlError(f"--chat-template: tokenizer {tokenizer.name} has no chat template")
    return frame()


@dataclass(frozen=True)
class NiahParts:
    """What one sample is made of before its size is known."""

    draw: NiahDraw
    head: str  # before the context (chat template head included)
    answer_prefix: str
    build: Callable[[int], tuple[Context, list[int], str]]  # units -> (context, ids, prompt)
    estimate: Callable[[int], int]  # units -> tokens of the haystack alone (monotone, cheap)


def _niah_parts(slot: SampleSlot, tokenizer: Tokenizer, spec: NiahSpec, haystack_path, chat_template: bool) -> NiahParts:
    draw = niah_draw(slot, spec)
    if slot.depth is not None and len(draw.needles) != 1:
        raise BamctlError(f"--depths places a single needle; {slot.task} hides {len(draw.needles)}")
    head, tail, answer_prefix = niah_frame(spec, draw.query_keys, chat_frame(tokenizer) if chat_template else None)
    hay = Haystack(
        spec, draw, tokenizer, lambda n: placement_rng(slot, n), slot.depth,
        sample_rng(slot.seed, *_identity(slot), "decoys"), haystack_path,
    )

    def build(n: int) -> tuple[Context, list[int], str]:
        context = hay.context(n)
        prompt = head + context.text + tail + answer_prefix
        return context, tokenizer.encode(prompt), prompt

    return NiahParts(draw, head, answer_prefix, build, hay.estimate)


def ruler_increment(haystack: str, length: int) -> int:
    """RULER's step: 500 essay words, else 25 lines (5 below 4096 tokens)."""
    if haystack == "essay":
        return 500
    return 5 if length < 4096 else 25


@lru_cache(maxsize=64)
def _ruler_search(probe: SampleSlot, tokenizer: Tokenizer, spec: NiahSpec, haystack_path, contents, chat_template: bool) -> int:
    """RULER's search (``niah.py``), once per length: tokens per unit from one step of units, an
    upper bound of three times what that suggests, then the largest size whose prompt and answer
    budget fit."""
    parts = _niah_parts(probe, tokenizer, spec, haystack_path, chat_template)
    step = ruler_increment(spec.haystack, probe.length)
    total = lambda n: len(parts.build(n)[1]) + probe.max_new_tokens  # noqa: E731
    per_unit = (total(step) - probe.max_new_tokens) / step
    return ruler_bisect(total, probe.length, step, max(int(probe.length / per_unit * 3), step * 2), step)
