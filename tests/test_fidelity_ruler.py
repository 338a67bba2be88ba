"""RULER's NIAH, score for score: its word lists, its sizing, its sentence splitter, its chat layout.

Expectations come from RULER's documented algorithms (``niah.py``, ``prepare.py``) written
here; bamctl's generator is only asked for samples.
"""

from __future__ import annotations

import json
import re

import pytest

from bamctl.tasks import generate_samples, get_task
from bamctl.tasks.haystacks import sentence_ends
from bamctl.tasks.ruler import ANSWER_PREFIX_SINGULAR, niah_sample
from bamctl.tokenizer import get_tokenizer

wonderwords = pytest.importorskip("wonderwords", reason="wonderwords is a dependency of bamctl (RULER's word lists)")


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer("gpt2")


def ruler_keys() -> set[str]:
    """RULER: words = sorted(set(f"{adj}-{noun}")) over wonderwords' adjective and noun files."""
    from wonderwords.random_word import _get_words_from_text_file

    nouns, adjs = _get_words_from_text_file("nounlist.txt"), _get_words_from_text_file("adjectivelist.txt")
    return set(f"{adj}-{noun}" for adj in adjs for noun in nouns)


def test_word_keys_are_rulers_wonderwords_pairs(tok):
    keys = ruler_keys()
    assert len(keys) > 6_000_000
    drawn = []
    for task in ("niah_single_1", "niah_multikey_2", "niah_multiquery"):
        for sample in generate_samples(task, [1024], 4, 0, tok):
            drawn += sample.meta["keys"]
    assert drawn and all(key in keys for key in drawn)
    assert len(set(drawn)) == len(drawn)


def test_decoys_rarely_share_a_word_with_the_asked_key(tok):
    """With RULER's 6.2M keys, a 16k niah_multikey_2 haystack holds about one decoy sharing the
    asked key's adjective and almost none sharing its noun (with 233 x 213 keys: 3.7 and 5)."""
    shared_adjective = shared_noun = 0
    samples = list(generate_samples("niah_multikey_2", [16384], 4, 0, tok))
    for sample in samples:
        adjective, noun = sample.meta["queries"][0].rsplit("-", 1)[0], sample.meta["queries"][0].split("-", 1)[1]
        decoys = re.findall(r"magic numbers for (\S+) is:", sample.prompt)
        shared_adjective += sum(d.startswith(adjective + "-") for d in decoys) - 1  # minus the needle itself
        shared_noun += sum(d.endswith("-" + noun) for d in decoys) - 1
    assert shared_adjective / len(samples) < 3 and shared_noun / len(samples) < 1


def test_sentences_split_as_nltk_punkt_splits_them():
    """NLTK's sent_tokenize (English Punkt) on text with abbreviations and stray marks, as documented."""
    text = "Mr. Smith went to Washington. He said hi! Is it? ? No. The U.S. economy grew 3.5 percent in 2020. Then it fell."
    words = tuple(text.split(" "))
    ends = sentence_ends(words)
    sentences, start = [], 0
    for end in ends:
        sentences.append(" ".join(words[start : end + 1]))
        start = end + 1
    assert sentences == ["Mr. Smith went to Washington.", "He said hi!", "Is it?", "?", "No.",
                         "The U.S. economy grew 3.5 percent in 2020.", "Then it fell."]


def _ruler_units(tok, task: str, length: int, sample) -> int:
    """RULER's sizing (niah.py): binary search once per length, then steps of 500 words or 25 lines
    (5 below 4096 tokens) fewer per sample until prompt plus 128 tokens fit; sizes come from the
    sample's own prompts at each size."""
    spec = get_task(task)
    step = 500 if spec.args["haystack"] == "essay" else (5 if length < 4096 else 25)

    def total(slot, n):
        return len(niah_sample(slot=slot, tokenizer=tok, n_units=n, **spec.args).input_ids) + 128

    probe = spec.slot(length=length, depth=None, seed=sample.seed, index=-1)
    per_unit = (total(probe, step) - 128) / step
    lower, upper, best = step, max(int(length / per_unit * 3), step * 2), None
    while lower <= upper:
        middle = (lower + upper) // 2
        lower, upper, best = (middle + 1, upper, middle) if total(probe, middle) <= length else (lower, middle - 1, best)
    used = best or step
    slot = spec.slot(length=length, depth=None, seed=sample.seed, index=sample.index)
    while total(slot, used) > length:
        used -= step
    return used


@pytest.mark.parametrize("task, length", [("niah_single_1", 2048), ("niah_single_2", 4096), ("niah_multikey_2", 4096)])
def test_ruler_sizing_is_rulers_search_and_retries(tok, task, length):
    for sample in generate_samples(task, [length], 2, 0, tok, sizing="ruler"):
        assert sample.meta["haystack_units"] == _ruler_units(tok, task, length, sample)
        assert sample.n_tokens + 128 <= length


def test_ruler_sizing_is_often_shorter_than_exact(tok):
    exact = [s.n_tokens for s in generate_samples("niah_single_2", [4096], 3, 0, tok)]
    ruler = [s.n_tokens for s in generate_samples("niah_single_2", [4096], 3, 0, tok, sizing="ruler")]
    assert all(r <= e for r, e in zip(ruler, exact)) and sum(ruler) < sum(exact)


def test_haystack_file_in_rulers_json_format(tok, tmp_path):
    essay = tmp_path / "PaulGrahamEssays.json"
    text = " ".join(f"Zebra number {i} grazes quietly near the river bank." for i in range(400))
    essay.write_text(json.dumps({"text": text}))
    sample = next(generate_samples("niah_single_2", [1024], 1, 0, tok, haystack_path=str(essay)))
    assert "Zebra number" in sample.prompt and "grass is green" not in sample.prompt


def test_chat_template_counts_and_the_answer_prefix_opens_the_assistant_turn(tok, chat_tok):
    sample = next(generate_samples("niah_single_1", [1024], 1, 0, chat_tok, chat_template=True))
    query = sample.meta["queries"][0]
    assert sample.prompt.startswith("<|user|>\nA special magic number is hidden")
    prefix = ANSWER_PREFIX_SINGULAR.format(type_v="number", query=query)
    assert sample.prompt.endswith("mentioned in the provided text?<|end|>\n<|assistant|>\n" + prefix)
    assert sample.n_tokens + 128 <= 1024 and sample.n_tokens == len(tok.encode(sample.prompt))
