"""RULER's variable tracking (``vt``): follow chains of ``VAR B = VAR A`` assignments hidden in noise.

Faithful to NVIDIA/RULER (``scripts/data/synthetic/variable_tracking.py``,
``constants.py``, ``synthetic.yaml``):

* the template and answer prefix (``{num_v}`` = hops + 1 variables, the chain's value as
  the query), a 30-token answer budget inside the length, ``string_match_all``;
* ``num_chains`` chains (1 by default) of ``num_hops`` + 1 distinct names (4 hops: 5
  names) of 5 uppercase letters: ``VAR A = 12345`` with a 5-digit value from 10000 to
  99998 (RULER's numpy ``randint(10000, 99999)`` excludes its high end), then
  ``VAR B = VAR A `` per hop, RULER's trailing space included; the answer is every name
  of chain 0;
* the ``noise`` haystack, RULER's default: its filler line repeated, each chain's lines
  put in order at a sorted random sample of line positions (RULER's sample-and-insert);
* RULER's one-shot example: a chain of 3-letter names with value 12345 in noise, sized
  by RULER's own search to 500 tokens (no answer budget, no chat template), written
  with its answer (``example + " " + names + "\\n"``) before the task text, after a
  chat template's head, followed by ``"\\n"``; each sample renames its variables and
  redraws its value, as RULER's ``randomize_icl`` does. It counts toward the length.
* ``sizing="ruler"``: RULER's binary search once per length (steps of 10 lines, 5
  below 4096 tokens; bounds from the tokens per line, three times over; counting the
  task text, the example's tokens and the answer budget), then per sample one step of
  lines fewer until the whole prompt fits.

Where we differ, on purpose:

* Every draw comes from a generator seeded by the sample's identity (the line positions
  also by the number of lines), never from one global stream, so a sample does not
  depend on the sizing search run before it, and an overflowing sample keeps its chains.
* The example's layout (its number of noise lines, where its lines go) is drawn once per
  seed, as RULER draws it once per run; its names are drawn fresh and distinct for each
  sample where RULER replaces each old name as a substring of the example text, and with
  several chains all of the example's chains are renamed (RULER renames chain 0's only).
* RULER's ``essay`` haystack for vt is not offered.
* The answer prefix reads "assigned", as RULER's constants have read since May 2025
  (before then: "assgined").
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from functools import lru_cache

from bamctl.errors import BamctlError
from bamctl.tasks.passkey import FILLER
from bamctl.tasks.ruler import chat_frame
from bamctl.tasks.sample import Sample, SampleSlot, sample_rng
from bamctl.tasks.sizing import PromptSizes, check_sizing, ruler_bisect, ruler_step_down, size_prompt
from bamctl.tasks.spans import tokens_at_chars
from bamctl.tokenizer import Tokenizer

TEMPLATE = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
    "Question: Find all variables that are assigned the value {query} in the text above."
)
ANSWER_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, "
    "{num_v} variables are assigned the value {query}, they are: "
)
NAME_LENGTH = 5
EXAMPLE_NAME_LENGTH = 3
EXAMPLE_MAX_HOPS = 10  # RULER caps the example's hops
EXAMPLE_TOKENS = 500  # RULER sizes its example to this many tokens ...
EXAMPLE_STEP = 5  # ... in steps of this many noise lines
EXAMPLE_VALUE = "12345"  # the example's value before each sample redraws it
TASK_HEAD = TEMPLATE.split("{context}")[0]


def ruler_step(length: int) -> int:
    """RULER's step of noise lines for vt: 10, or 5 below 4096 tokens."""
    return 5 if length < 4096 else 10


@dataclass(frozen=True)
class Chains:
    """The variable names of each chain and the value each chain starts from."""

    names: tuple[tuple[str, ...], ...]
    values: tuple[str, ...]

    def lines(self) -> list[list[str]]:
        return [
            [f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(len(names) - 1)]
            for names, value in zip(self.names, self.values)
        ]

    @property
    def answers(self) -> list[str]:
        return list(self.names[0])

    @property
    def query(self) -> str:
        return self.values[0]


def random_value(rng) -> str:
    return str(rng.randint(10000, 99998))


def draw_chains(rng, num_chains: int, num_hops: int, name_length: int, value: str | None = None) -> Chains:
    """Distinct names for every chain, then each chain's value (``value`` for all when given)."""
    names: list[str] = []
    while len(names) < num_chains * (num_hops + 1):
        name = "".join(rng.choices(string.ascii_uppercase, k=name_length))
        if name not in names and name != "VAR":
            names.append(name)
    per_chain = tuple(tuple(names[i : i + num_hops + 1]) for i in range(0, len(names), num_hops + 1))
    values = tuple(value if value is not None else random_value(rng) for _ in per_chain)
    return Chains(per_chain, values)


@dataclass(frozen=True)
class Context:
    text: str
    chain_chars: list[int]  # where each chain line starts in `text`, in order


def noise_context(chains: Chains, n_lines: int, rng) -> Context:
    """RULER's noise haystack: ``n_lines`` filler lines, each chain's lines inserted in order at a
    sorted random sample of positions (with fewer lines than a chain has, the chain runs on at the end)."""
    lines = [FILLER] * n_lines
    for chain in chains.lines():
        positions = sorted(rng.sample(range(max(len(lines), len(chain))), len(chain)))
        for j, (position, line) in enumerate(zip(positions, chain)):
            lines.insert(position + j, line)
    starts, offset = [], 0
    for line in lines:
        if line.startswith("VAR "):  # filler lines never do
            starts.append(offset)
        offset += len(line) + 1
    return Context("\n".join(lines), starts)


def question(chains: Chains, context: str, num_hops: int) -> str:
    """The task text with its answer prefix, no chat template: what RULER's example is made of."""
    return TEMPLATE.format(context=context, query=chains.query) + ANSWER_PREFIX.format(num_v=num_hops + 1, query=chains.query)


@dataclass(frozen=True)
class Example:
    """RULER's one-shot example as its search left it: its noise lines and its text before renaming."""

    n_lines: int
    chains: Chains
    text: str  # question, " ", the answer names, "\n"


def _example_placement(seed: int, task: str, n_lines: int):
    return sample_rng(seed, task, "example placement", n_lines)


def _example_text(chains: Chains, n_lines: int, seed: int, task: str, num_hops: int) -> str:
    context = noise_context(chains, n_lines, _example_placement(seed, task, n_lines)).text
    return question(chains, context, num_hops) + " " + " ".join(chains.answers) + "\n"


@lru_cache(maxsize=16)
def rulers_example(tokenizer: Tokenizer, seed: int, task: str, num_chains: int, num_hops: int) -> Example:
    """RULER's example search, once per seed: the most noise lines (steps of 5 from 5, bounds three
    times the tokens per line) whose question fits 500 tokens."""
    chains = draw_chains(sample_rng(seed, task, "example"), num_chains, min(EXAMPLE_MAX_HOPS, num_hops),
                         EXAMPLE_NAME_LENGTH, EXAMPLE_VALUE)

    def tokens(n: int) -> int:
        context = noise_context(chains, n, _example_placement(seed, task, n)).text
        return len(tokenizer.encode(question(chains, context, num_hops)))

    per_line = tokens(EXAMPLE_STEP) / EXAMPLE_STEP
    upper = max(int(EXAMPLE_TOKENS / per_line * 3), EXAMPLE_STEP * 2)
    searched = ruler_bisect(tokens, EXAMPLE_TOKENS, EXAMPLE_STEP, upper, EXAMPLE_STEP)
    n_lines = ruler_step_down(tokens, EXAMPLE_TOKENS, searched, EXAMPLE_STEP, "vt's one-shot example")
    return Example(n_lines, chains, _example_text(chains, n_lines, seed, task, num_hops))


def renamed_example(example: Example, rng, seed: int, task: str, num_hops: int) -> str:
    """The example as one sample shows it: the same layout, new names and a new value (one for every chain)."""
    shape = example.chains
    fresh = draw_chains(rng, len(shape.names), len(shape.names[0]) - 1, EXAMPLE_NAME_LENGTH, random_value(rng))
    return _example_text(fresh, example.n_lines, seed, task, num_hops)


@dataclass(frozen=True)
class VtParts:
    """What one sample is made of before its number of noise lines is known."""

    chains: Chains
    chat_head: str  # what a chat template puts before the user turn ("" without one)
    tail: str  # the task's text after the context and the chat template's tail
    answer_prefix: str
    example: str  # this sample's renamed example, its "\n" included
    plain_example: str  # the example before renaming (RULER's search counts it)
    placement_seed: tuple
    tokenizer: Tokenizer

    def lead(self, with_example: bool = True) -> str:
        """Everything before the context: RULER puts the example after a chat template's head."""
        return self.chat_head + (self.example + "\n" if with_example else "") + TASK_HEAD

    def build(self, n_lines: int, with_example: bool = True) -> tuple[Context, list[int], str]:
        context = noise_context(self.chains, n_lines, sample_rng(*self.placement_seed, n_lines))
        prompt = self.lead(with_example) + context.text + self.tail + self.answer_prefix
        return context, self.tokenizer.encode(prompt), prompt


def _vt_parts(slot: SampleSlot, tokenizer: Tokenizer, num_chains: int, num_hops: int, chat_template: bool) -> VtParts:
    identity = (slot.task, slot.length, slot.index)
    rng = sample_rng(slot.seed, *identity)
    chains = draw_chains(rng, num_chains, num_hops, NAME_LENGTH)
    example = rulers_example(tokenizer, slot.seed, slot.task, num_chains, num_hops)
    renamed = renamed_example(example, rng, slot.seed, slot.task, num_hops)
    chat = chat_frame(tokenizer) if chat_template else ("", "")
    tail = TEMPLATE.format(context="\x00", query=chains.query).split("\x00")[1]
    return VtParts(
        chains, chat[0], tail + chat[1], ANSWER_PREFIX.format(num_v=num_hops + 1, query=chains.query),
        renamed, example.text, (slot.seed, *identity, "placement"), tokenizer,
    )


def vt_sample(
    *,
    slot: SampleSlot,
    tokenizer: Tokenizer,
    num_chains: int = 1,
    num_hops: int = 4,
    sizing: str = "exact",
    chat_template: bool = False,
    n_units: int | None = None,
) -> Sample:
    """One variable-tracking prompt sized to ``slot.length`` by ``sizing`` (or with ``n_units`` noise lines)."""
    check_sizing(sizing)
    if num_chains < 1 or num_hops < 1:
        raise BamctlError("vt needs num_chains and num_hops of at least 1")
    parts = _vt_parts(slot, tokenizer, num_chains, num_hops, chat_template)
    if n_units is None:
        line = len(tokenizer.encode("\n" + FILLER))
        n_units = size_prompt(sizing, PromptSizes(
            slot, lambda n: len(parts.build(n)[1]), lambda n: n * line, "without noise",
            lambda probe: _ruler_search(probe, tokenizer, num_chains, num_hops, chat_template), ruler_step(slot.length),
        ))
    context, input_ids, prompt = parts.build(n_units)
    lead = len(parts.lead())
    positions = tokens_at_chars(tokenizer, prompt, input_ids, [lead + c for c in context.chain_chars])
    return slot.sample(
        input_ids=input_ids,
        prompt=prompt,
        answers=parts.chains.answers,
        needle_positions=sorted(positions),
        meta={
            "answer_prefix": parts.answer_prefix,
            "query": parts.chains.query,
            "chains": parts.chains.lines(),
            "haystack": "noise",
            "haystack_units": n_units,
        },
    )


@lru_cache(maxsize=64)
def _ruler_search(probe: SampleSlot, tokenizer: Tokenizer, num_chains: int, num_hops: int, chat_template: bool) -> int:
    """RULER's search: tokens per line from one step of lines (no example), an upper bound of three
    times what that suggests, then the most lines whose task text, example and answer budget fit."""
    parts = _vt_parts(probe, tokenizer, num_chains, num_hops, chat_template)
    step = ruler_step(probe.length)
    example = len(tokenizer.encode(parts.plain_example))
    without_example = lambda n: len(parts.build(n, with_example=False)[1])  # noqa: E731
    per_line = without_example(step) / step
    upper = max(int(probe.length / per_line * 3), step * 2)
    total = lambda n: without_example(n) + example + probe.max_new_tokens  # noqa: E731
    return ruler_bisect(total, probe.length, step, upper, step)
