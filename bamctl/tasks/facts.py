"""Facts in a haystack (``facts_1``, ``facts_2``, ``facts_3``): a short bAbI-style story spread through the essays.

A story is a few sentences about people, places and objects, in order of time: people
move (``Mary moved to the bathroom.``) and pick objects up (``John picked up the
apple.``); a carried object goes where its carrier goes. One question follows the text:

* ``facts_1``, one supporting fact: ``Where is Mary?`` after her one move;
* ``facts_2``, two: ``Where is the apple?`` after John picked it up and then went somewhere;
* ``facts_3``, three: ``Where was the apple before the office?`` after John picked it up
  and carried it through two places.

The other sentences are distractors of the same kinds (other people moving, other objects
picked up by other people). A solver here reads the story as a list of events and proves,
for every sample, that the answer follows from the facts and that leaving out any one
supporting fact leaves the question unanswerable; a sample that failed either would be an
error, never a prompt.

The story's sentences go into the shipped essays at sentence boundaries, in story order, at
depths drawn for each sample from RULER's 40 evenly spaced depths (as RULER's essay NIAH
places several needles); ``--depths`` puts the first supporting fact at each depth asked
for, the sentences before it above and those after it below. A sample's ``needle_depth``
is its first supporting fact's. Each sample has the largest haystack whose prompt fits the length
with the answer budget. Two protocols: ``generate`` (greedy generation, the answer word
found in it) and ``teacher_forced`` (the answer fed after the prompt, every answer token the
argmax).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from bamctl.errors import BamctlError
from bamctl.tasks.haystacks import essay_haystack
from bamctl.tasks.ruler import ESSAY_DEPTHS, essay_context_at
from bamctl.tasks.sample import Sample, SampleSlot, sample_rng
from bamctl.tasks.sizing import size_exact
from bamctl.tasks.spans import tokens_at_chars
from bamctl.tokenizer import Tokenizer

PEOPLE = ("Mary", "John", "Sandra", "Daniel", "Fred", "Julie", "Bill", "Emma")
PLACES = ("bathroom", "bedroom", "garden", "hallway", "kitchen", "office", "cellar", "garage")
OBJECTS = ("apple", "football", "milk", "umbrella", "lantern", "basket")
MOVES = ("moved to", "went to", "journeyed to", "travelled to", "went back to")
TAKES = ("picked up", "got", "grabbed", "took")
TEMPLATE = (
    "Some facts about people, places and objects are hidden in the following text. Keep track of who went "
    "where and who took what; an object goes wherever the person carrying it goes.\n{context}\n"
    "Question: {question}"
)


@dataclass(frozen=True)
class Fact:
    """One event: ``person`` moves to ``target`` (a place) or takes ``target`` (an object)."""

    person: str
    kind: str  # "move" | "take"
    target: str
    verb: str  # how the sentence says it

    @property
    def text(self) -> str:
        return f"{self.person} {self.verb} the {self.target}."


@dataclass(frozen=True)
class Question:
    """``kind`` "person": where is ``subject``; "object": where is the ``subject``; "before": where
    was the ``subject`` before the ``place``."""

    kind: str
    subject: str
    place: str = ""

    @property
    def text(self) -> str:
        return {
            "person": f"Where is {self.subject}?",
            "object": f"Where is the {self.subject}?",
            "before": f"Where was the {self.subject} before the {self.place}?",
        }[self.kind]

    @property
    def answer_prefix(self) -> str:
        return {
            "person": f" Answer: {self.subject} is in the",
            "object": f" Answer: The {self.subject} is in the",
            "before": f" Answer: Before the {self.place}, the {self.subject} was in the",
        }[self.kind]


def solve(facts: list[Fact], question: Question) -> str | None:
    """The answer the facts give, or None when they do not give one: people are where they last
    moved, an object is where its carrier is, and its places are the ones it passed through."""
    where: dict[str, str] = {}
    carrier: dict[str, str] = {}
    passed: dict[str, list[str]] = {}
    for fact in facts:
        if fact.kind == "move":
            where[fact.person] = fact.target
            for thing, person in carrier.items():
                if person == fact.person:
                    passed[thing].append(fact.target)
        else:
            carrier[fact.target] = fact.person
            passed[fact.target] = [where[fact.person]] if fact.person in where else []
    if question.kind == "person":
        return where.get(question.subject)
    places = passed.get(question.subject, [])
    if question.kind == "object":
        return places[-1] if places else None
    entered = [i for i, place in enumerate(places) if place == question.place and i > 0]
    return places[entered[-1] - 1] if entered else None


@dataclass(frozen=True)
class Story:
    facts: list[Fact]
    supporting: list[int]  # indices into `facts`
    question: Question
    answer: str


def _move(rng, person: str, place: str | None = None) -> Fact:
    return Fact(person, "move", place or rng.choice(PLACES), rng.choice(MOVES))


def _take(rng, person: str, thing: str) -> Fact:
    return Fact(person, "take", thing, rng.choice(TAKES))


def _supporting(rng, n_supporting: int) -> tuple[list[Fact], Question, set[str], set[str]]:
    """The supporting facts in story order, the question, and the person and object they reserve."""
    person = rng.choice(PEOPLE)
    if n_supporting == 1:
        return [_move(rng, person)], Question("person", person), {person}, set()
    thing = rng.choice(OBJECTS)
    if n_supporting == 2:
        return [_take(rng, person, thing), _move(rng, person)], Question("object", thing), {person}, {thing}
    first, second = rng.sample(PLACES, 2)
    facts = [_take(rng, person, thing), _move(rng, person, first), _move(rng, person, second)]
    return facts, Question("before", thing, second), {person}, {thing}


def draw_story(rng, n_supporting: int, n_facts: int) -> Story:
    """``n_facts`` sentences: the supporting ones at random places in the story, in order, and
    distractors about other people and objects between them; checked by ``solve``."""
    if n_supporting not in (1, 2, 3) or not n_supporting <= n_facts <= len(ESSAY_DEPTHS):
        raise BamctlError(f"a facts task takes 1 to 3 supporting facts and {len(ESSAY_DEPTHS)} facts at most, at least as many "
                          f"(got {n_supporting} and {n_facts})")
    support, question, people, things = _supporting(rng, n_supporting)
    others = [p for p in PEOPLE if p not in people]
    free = [t for t in OBJECTS if t not in things]
    places = sorted(rng.sample(range(n_facts), n_supporting))
    facts, upcoming = [], iter(support)
    for i in range(n_facts):
        if i in places:
            facts.append(next(upcoming))
        elif n_supporting > 1 and free and rng.random() < 0.3:
            facts.append(_take(rng, rng.choice(others), free.pop(rng.randrange(len(free)))))
        else:
            facts.append(_move(rng, rng.choice(others)))
    story = Story(facts, places, question, solve(facts, question) or "")
    check_story(story)
    return story


def check_story(story: Story) -> None:
    """The answer follows from the facts, and from none of them less one supporting fact."""
    if not story.answer:
        raise RuntimeError(f"facts story without an answer: {[f.text for f in story.facts]}")
    for i in story.supporting:
        if solve(story.facts[:i] + story.facts[i + 1:], story.question) is not None:
            raise RuntimeError(f"supporting fact {story.facts[i].text!r} is not needed")


def fact_depths(rng, story: Story, depth: float | None) -> list[float]:
    """Each sentence's depth in percent, ascending in story order: without ``depth``, a sample of
    RULER's 40 depths; with it, the first supporting fact at ``depth`` and the sentences before and
    after it at depths of that grid above and below it."""
    n_facts = len(story.facts)
    if depth is None:
        return sorted(rng.sample(ESSAY_DEPTHS, n_facts))
    at, first = depth * 100, story.supporting[0]
    above = [d for d in ESSAY_DEPTHS if d <= at]
    below = [d for d in ESSAY_DEPTHS if d >= at]
    before = sorted(rng.choice(above) for _ in range(first))
    after = sorted(rng.choice(below) for _ in range(n_facts - first - 1))
    return [*before, at, *after]


@dataclass(frozen=True)
class FactsParts:
    story: Story
    head: str
    build: Callable[[int], tuple[object, list[int], str]]  # words -> (context, ids, prompt)


def _facts_parts(slot: SampleSlot, tokenizer: Tokenizer, supporting: int, n_facts: int) -> FactsParts:
    story = draw_story(sample_rng(slot.seed, slot.task, slot.length, slot.index), supporting, n_facts)
    haystack = essay_haystack(tokenizer)
    head, tail = TEMPLATE.format(context="\x00", question=story.question.text).split("\x00")
    needles = [fact.text for fact in story.facts]

    def build(n_words: int):
        rng = sample_rng(slot.seed, slot.task, slot.length, slot.index, "placement", n_words)
        depths = fact_depths(rng, story, slot.depth)
        context = essay_context_at(haystack, needles, n_words, depths, depths[story.supporting[0]] / 100)
        prompt = head + context.text + tail + story.question.answer_prefix
        return context, tokenizer.encode(prompt), prompt

    return FactsParts(story, head, build)


def facts_sample(*, slot: SampleSlot, tokenizer: Tokenizer, supporting: int, n_facts: int, n_units: int | None = None) -> Sample:
    """One facts prompt with the most essay words that fit ``slot.length`` (or exactly ``n_units``)."""
    parts = _facts_parts(slot, tokenizer, supporting, n_facts)
    if n_units is None:
        haystack = essay_haystack(tokenizer)
        n_units = size_exact(
            lambda n: len(parts.build(n)[1]), haystack.estimate_tokens, slot.length - slot.max_new_tokens,
            f"length {slot.length} is too short for {slot.task}: the prompt without haystack already needs "
            f"{{needed}} tokens besides the {slot.max_new_tokens}-token answer budget",
        )
    context, input_ids, prompt = parts.build(n_units)
    story = parts.story
    positions = tokens_at_chars(tokenizer, prompt, input_ids, [len(parts.head) + c for c in context.needle_chars])
    answer_ids = list(tokenizer.encode(" " + story.answer)) if slot.scoring == "teacher_forced" else []
    return slot.sample(
        input_ids=input_ids,
        prompt=prompt,
        needle_depth=round(context.depth, 6),
        answers=[story.answer],
        needle_positions=sorted(positions),
        answer_ids=answer_ids,
        target_ids=answer_ids,
        meta={
            "answer_prefix": story.question.answer_prefix,
            "question": story.question.text,
            "facts": [fact.text for fact in story.facts],
            "supporting": story.supporting,
            "depths": list(context.depths),
            "haystack": "essay",
            "haystack_units": n_units,
            "haystack_repeats": context.repeats,
        },
    )
