"""Facts in a haystack (facts_1, facts_2, facts_3): every answer checked by a solver of this test's own.

The solver below reads the story's sentences as text, with its own patterns, and works out where
things are by replaying, for each question, the events that concern it; it shares no code with
the generator's solver (``bamctl/tasks/facts.py:solve``). For every sample it must find the
sample's answer, find none once any one supporting fact is left out, and find the same answer
once any one distractor is left out.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from bamctl.cli import main
from bamctl.tasks import generate_samples, get_task, score
from bamctl.tasks.facts import facts_sample
from bamctl.tokenizer import get_tokenizer

TASKS = {"facts_1": 1, "facts_2": 2, "facts_3": 3}  # task -> supporting facts its answer needs
MOVE = re.compile(r"^([A-Z][a-z]+) (?:moved|went|journeyed|travelled|went back) to the ([a-z]+)\.$")
TAKE = re.compile(r"^([A-Z][a-z]+) (?:picked up|got|grabbed|took) the ([a-z]+)\.$")
WHERE_PERSON = re.compile(r"^Where is ([A-Z][a-z]+)\?$")
WHERE_OBJECT = re.compile(r"^Where is the ([a-z]+)\?$")
WHERE_BEFORE = re.compile(r"^Where was the ([a-z]+) before the ([a-z]+)\?$")


def events(sentences: list[str]) -> list[tuple[str, str, str]]:
    """("move", person, place) and ("take", person, object), in story order; any other sentence fails."""
    parsed = []
    for sentence in sentences:
        move, take = MOVE.match(sentence), TAKE.match(sentence)
        assert move or take, sentence
        parsed.append(("move", *move.groups()) if move else ("take", *take.groups()))
    return parsed


def object_trail(story: list[tuple[str, str, str]], thing: str) -> list[str]:
    """The places ``thing`` was in, in order: from the last time someone took it, where the taker
    was then (if known) and each place the taker moved to afterwards."""
    takes = [i for i, (kind, _, target) in enumerate(story) if kind == "take" and target == thing]
    if not takes:
        return []
    start = takes[-1]
    carrier = story[start][1]
    before = [place for kind, person, place in story[:start] if kind == "move" and person == carrier]
    after = [place for kind, person, place in story[start + 1:] if kind == "move" and person == carrier]
    return before[-1:] + after


def answer(sentences: list[str], question: str) -> str | None:
    story = events(sentences)
    if match := WHERE_PERSON.match(question):
        places = [place for kind, person, place in story if kind == "move" and person == match.group(1)]
        return places[-1] if places else None
    if match := WHERE_OBJECT.match(question):
        trail = object_trail(story, match.group(1))
        return trail[-1] if trail else None
    match = WHERE_BEFORE.match(question)
    assert match, question
    trail = object_trail(story, match.group(1))
    arrivals = [i for i in range(1, len(trail)) if trail[i] == match.group(2)]
    return trail[arrivals[-1] - 1] if arrivals else None


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer("gpt2")


@pytest.fixture(scope="module")
def stories(tok):
    return {task: list(generate_samples(task, [512, 2048], 10, 0, tok)) for task in TASKS}


def question_of(sample) -> str:
    return sample.prompt.rsplit("\nQuestion: ", 1)[1].split(" Answer:")[0]


@pytest.mark.parametrize("task", TASKS)
def test_every_answer_follows_from_the_facts_and_needs_each_supporting_fact(stories, task):
    for sample in stories[task]:
        facts, question = sample.meta["facts"], question_of(sample)
        assert answer(facts, question) == sample.answers[0]
        needed = [i for i in range(len(facts)) if answer(facts[:i] + facts[i + 1:], question) != sample.answers[0]]
        assert needed == sample.meta["supporting"] and len(needed) == TASKS[task]
        for i in needed:  # without one supporting fact, the story does not say
            assert answer(facts[:i] + facts[i + 1:], question) is None


@pytest.mark.parametrize("task", TASKS)
def test_the_facts_are_in_the_prompt_in_story_order_among_the_essays(stories, tok, task):
    for sample in stories[task]:
        context = sample.prompt.split("goes.\n", 1)[1].rsplit("\nQuestion: ", 1)[0]
        found = [-1]  # each fact after the one before (a distractor may say the same twice)
        for fact in sample.meta["facts"]:
            found.append(context.find(fact, found[-1] + 1))
        assert all(at >= 0 for at in found[1:])
        assert len(context) > 4 * sum(map(len, sample.meta["facts"]))  # a haystack around them
        assert sample.meta["depths"] == sorted(sample.meta["depths"])
        for position, fact in zip(sample.needle_positions, sample.meta["facts"]):
            assert tok.decode(sample.input_ids[position:]).lstrip().startswith(fact)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("protocol", ["generate", "teacher_forced"])
@pytest.mark.parametrize("length", [256, 1024, 4096])
def test_the_largest_haystack_that_fits(tok, task, protocol, length):
    spec = get_task(task, protocol)
    for sample in generate_samples(task, [length], 2, 0, tok, protocol=protocol):
        assert sample.n_tokens == len(sample.input_ids) == len(tok.encode(sample.prompt))
        assert sample.n_tokens + spec.max_new_tokens <= length
        slot = spec.slot(length=length, depth=None, seed=0, index=sample.index)
        bigger = facts_sample(slot=slot, tokenizer=tok, n_units=sample.meta["haystack_units"] + 1, **spec.args)
        assert bigger.n_tokens + spec.max_new_tokens > length
        assert bigger.meta["facts"] == sample.meta["facts"]  # same story, one more word


def test_teacher_forced_feeds_the_answer_and_scores_every_token(tok):
    sample = next(generate_samples("facts_3", [1024], 1, 0, tok, protocol="teacher_forced"))
    assert sample.scoring == "teacher_forced" and sample.metric == "answer_exact"
    assert sample.answer_ids == sample.target_ids == tok.encode(" " + sample.answers[0])
    assert sample.prompt.endswith(" the")
    assert score("answer_exact", list(sample.target_ids), sample) == 1.0
    assert score("answer_exact", [tok.encode(" moon")[0]] * len(sample.target_ids), sample) == 0.0
    right = list(sample.target_ids)
    assert score("answer_exact", right[:-1] + [right[-1] + 1], sample) == 0.0  # only the last token wrong
    assert score("answer_exact", right[:-1], sample) == 0.0  # an answer cut short
    assert score("answer_exact", [], replace(sample, target_ids=[])) == 0.0  # nothing to score is no hit


def test_generation_is_scored_like_rulers_tasks(tok):
    sample = next(generate_samples("facts_1", [1024], 1, 0, tok))
    assert sample.scoring == "generate" and sample.metric == "string_match_all" and sample.max_new_tokens == 16
    assert score("string_match_all", f" {sample.answers[0]}.", sample) == 1.0
    assert score("string_match_all", " nowhere.", sample) == 0.0


def test_samples_are_pure_functions_of_their_identity(tok):
    once = [s.prompt for s in generate_samples("facts_2", [512], 3, 0, tok)]
    again = [s.prompt for s in generate_samples("facts_2", [512], 3, 0, tok)]
    other_seed = [s.prompt for s in generate_samples("facts_2", [512], 3, 1, tok)]
    assert once == again and once != other_seed and len(set(once)) == 3


@pytest.mark.parametrize("task", TASKS)
def test_depths_put_the_first_supporting_fact_there_and_keep_the_story(tok, task):
    placed = list(generate_samples(task, [4096], 2, 0, tok, depths=[0.0, 0.5, 1.0]))
    assert [s.depth for s in placed] == [0.0] * 2 + [0.5] * 2 + [1.0] * 2
    for sample in placed:
        facts, question = sample.meta["facts"], question_of(sample)
        assert answer(facts, question) == sample.answers[0] and sample.needle_depth == sample.depth
        context = sample.prompt.split("goes.\n", 1)[1].rsplit("\nQuestion: ", 1)[0]
        found = [-1]
        for fact in facts:
            found.append(context.find(fact, found[-1] + 1))
        assert all(at >= 0 for at in found[1:])
        k = sample.meta["supporting"][0]
        first = found[1 + k]
        essay_before, essay_after = context[:first], context[first + len(facts[k]):]
        for fact in facts:  # what is left is essay text alone
            essay_before, essay_after = essay_before.replace(fact, ""), essay_after.replace(fact, "")
        share = len(essay_before.strip()) / (len(essay_before.strip()) + len(essay_after.strip()))
        # RULER's rule counts sentences, not characters: at the ends exactly, in the middle roughly.
        assert share == sample.depth if sample.depth in (0.0, 1.0) else abs(share - sample.depth) < 0.15
    same_story = {s.index: s.meta["facts"] for s in placed if s.depth == 0.0}
    assert all(s.meta["facts"] == same_story[s.index] for s in placed)  # the depth moves the story, never redraws it


def test_a_short_run_writes_rows_for_both_protocols(tmp_path):
    import pandas as pd

    for protocol in ("generate", "teacher_forced"):
        with pytest.raises(SystemExit) as done:
            main(["ruler", "lm-bam", "--task", "facts_1,facts_3", "--protocol", protocol, "--lengths", "256",
                  "--samples", "2", "--dir", str(tmp_path), "--quiet"])
        assert done.value.code == 0
    rows = pd.concat(pd.read_parquet(path) for path in tmp_path.rglob("*.parquet"))
    assert sorted(set(zip(rows["task"], rows["protocol"]))) == [
        ("facts_1", "generate"), ("facts_1", "teacher_forced"), ("facts_3", "generate"), ("facts_3", "teacher_forced")]
    assert len(rows) == 8 and rows["expected"].notna().all() and rows["n_tokens"].le(256).all()
