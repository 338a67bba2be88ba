"""RULER NIAH: sizing, RULER's wording, needle/query/answer consistency, metrics."""

import re

import pytest

from bamctl.errors import BamctlError
from bamctl.tasks import generate_samples, score, string_match_all, string_match_part
from bamctl.tasks.haystacks import essay_haystack
from bamctl.tasks.registry import get_task
from bamctl.tasks.ruler import ESSAY_DEPTHS, NiahSpec, draw_needles, niah_sample
from bamctl.tasks.sample import Sample
from bamctl.tasks.texts import ruler_words
from bamctl.tokenizer import get_tokenizer
from mutation_scope import Built, shared_unless_mutating

VARIANTS = [
    "niah_single_1",
    "niah_single_2",
    "niah_single_3",
    "niah_multikey_1",
    "niah_multikey_2",
    "niah_multikey_3",
    "niah_multivalue",
    "niah_multiquery",
]
# RULER's templates (constants.py + niah.py), written out for both wordings.
PLURAL_HEAD = (
    "Some special magic {t} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {t} afterwards.\n"
)
PLURAL_TAIL = (
    "\nWhat are all the special magic {t} for {q} mentioned in the provided text? "
    "The special magic {t} for {q} mentioned in the provided text are"
)
SINGULAR_HEAD = (
    "A special magic {t} is hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {t} afterwards.\n"
)
SINGULAR_TAIL = (
    "\nWhat is the special magic {t} for {q} mentioned in the provided text? "
    "The special magic {t} for {q} mentioned in the provided text is"
)
NUMBER = re.compile(r"[1-9]\d{6}")
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer("gpt2")


@pytest.fixture(scope=shared_unless_mutating)
def samples(tok):
    """Two samples per variant at a length: ``samples[variant, 1024]``, made when first read."""
    return Built(lambda key: list(generate_samples(key[0], [key[1]], 2, 3, tok)))


def _matches(kind: str, text: str) -> bool:
    if kind == "numbers":
        return bool(NUMBER.fullmatch(text))
    if kind == "uuids":
        return bool(UUID.fullmatch(text))
    adjectives, nouns = ruler_words()
    return any(text == f"{a}-{text[len(a) + 1:]}" and text[len(a) + 1:] in set(nouns) for a in adjectives if text.startswith(a + "-"))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("length", [1024, 4096])
def test_sizing_is_the_largest_haystack_that_fits(tok, samples, variant, length):
    spec = get_task(variant)
    for sample in samples[variant, length]:
        assert sample.n_tokens == len(sample.input_ids)
        assert tok.decode(sample.input_ids) == sample.prompt
        assert sample.n_tokens + sample.max_new_tokens <= length
        assert sample.max_new_tokens == 128
        slot = spec.slot(length=length, depth=None, seed=sample.seed, index=sample.index)
        bigger = niah_sample(slot=slot, tokenizer=tok, n_units=sample.meta["haystack_units"] + 1, **spec.args)
        assert bigger.n_tokens + 128 > length
        assert bigger.answers == sample.answers  # same draw, one more unit


@pytest.mark.parametrize("variant", VARIANTS)
def test_wording_follows_ruler_templates(samples, variant):
    args = get_task(variant).args
    singular = args["num_values"] * args["num_queries"] == 1
    kind = args["value_type"]
    t = kind[:-1] if singular else kind
    for sample in samples[variant, 4096]:
        q = sample.meta["queries"]
        query = q[0] if len(q) == 1 else ", ".join(q[:-1]) + ", and " + q[-1]
        head, tail = (SINGULAR_HEAD, SINGULAR_TAIL) if singular else (PLURAL_HEAD, PLURAL_TAIL)
        assert sample.prompt.startswith(head.format(t=t))
        assert sample.prompt.endswith(tail.format(t=t, q=query))
        prefix = sample.meta["answer_prefix"]
        assert prefix == tail.format(t=t, q=query).split("?", 1)[1]
        assert sample.prompt.endswith(prefix)


def test_multiquery_lists_four_keys_the_ruler_way(samples):
    sample = samples["niah_multiquery", 4096][0]
    q = sample.meta["queries"]
    assert len(q) == 4
    assert f"for {q[0]}, {q[1]}, {q[2]}, and {q[3]} mentioned" in sample.prompt


@pytest.mark.parametrize("variant", VARIANTS)
def test_needles_queries_and_answers_agree(tok, samples, variant):
    args = get_task(variant).args
    for sample in samples[variant, 4096]:
        keys, values, queries = sample.meta["keys"], sample.meta["values"], sample.meta["queries"]
        assert len(keys) == max(args["num_keys"], args["num_queries"]) == len(set(keys))
        assert all(len(v) == args["num_values"] for v in values)
        assert len(queries) == args["num_queries"] and set(queries) <= set(keys)
        assert sample.answers == [v for k in queries for v in values[keys.index(k)]]
        assert all(_matches(args["key_type"], k) for k in keys)
        assert all(_matches(args["value_type"], v) for vs in values for v in vs)
        needles = [
            f"One of the special magic {args['value_type']} for {k} is: {v}."
            for k, vs in zip(keys, values)
            for v in vs
        ]
        for needle in needles:
            assert sample.prompt.count(needle) == 1
        # Each queried key appears in exactly one needle per value, even among decoys.
        for k in queries:
            assert sample.prompt.count(f" for {k} is: ") == args["num_values"]
        # needle_positions point at the needles, in prompt order.
        assert len(sample.needle_positions) == len(needles)
        assert sample.needle_positions == sorted(sample.needle_positions)
        found = {tok.decode(sample.input_ids[p:]).lstrip()[: len(needles[0]) + 40] for p in sample.needle_positions}
        for needle in needles:
            assert any(text.startswith(needle) for text in found)
        assert sample.depth is None and 0.0 <= sample.needle_depth <= 1.0  # placed by the task itself


@pytest.mark.parametrize("variant", ["niah_single_2", "niah_multikey_1", "niah_multivalue"])
def test_essay_needles_sit_at_sentence_boundaries(tok, samples, variant):
    for sample in samples[variant, 4096]:
        assert round(sample.needle_depth * 100) in ESSAY_DEPTHS
        for position in sample.needle_positions:
            before = tok.decode(sample.input_ids[:position]).rstrip()
            assert before.endswith("afterwards.") or re.search(r"[.!?][\"')\]]*$", before), before[-80:]


def test_noise_haystack_is_filler_lines(samples):
    sample = samples["niah_single_1", 4096][0]
    lines = sample.prompt.split("\n")[1:-1]
    filler = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
    assert sum(line == filler for line in lines) == sample.meta["haystack_units"]
    assert sum(line.startswith("One of the special magic") for line in lines) == 1


def test_samples_are_pure_functions_of_identity(tok):
    alone = next(iter(generate_samples("niah_multikey_2", [2048], 1, 5, tok)))
    mixed = [s for s in generate_samples("niah_multikey_2", [1024, 2048], 1, 5, tok) if s.length == 2048][0]
    assert alone.to_json() == mixed.to_json()
    other_seed = next(iter(generate_samples("niah_multikey_2", [2048], 1, 6, tok)))
    assert other_seed.prompt != alone.prompt


def test_depths_place_a_single_needle(tok):
    low, high = generate_samples("niah_single_1", [4096], 1, 0, tok, [0.0, 1.0])
    assert low.depth == 0.0 and high.depth == 1.0
    assert low.needle_positions[0] < 40 < 4000 - 200 < high.needle_positions[0]


def test_depths_place_the_needle_among_decoy_needles_too(tok):
    low, high = generate_samples("niah_multikey_2", [4096], 1, 0, tok, [0.0, 1.0])
    assert low.needle_depth == 0.0 and high.needle_depth == 1.0
    assert low.needle_positions[0] < 60 < 4000 - 200 < high.needle_positions[0]


def test_essay_needles_stand_where_their_depth_says(tok, samples):
    for sample in samples["niah_single_2", 4096]:  # depths drawn: the first needle's is the row's
        assert sample.needle_depth == sample.meta["depths"][0] / 100
    needle = "One of the special magic numbers for"
    at = generate_samples("niah_single_2", [4096], 1, 0, tok, [0.0, 0.5, 1.0])
    for sample, depth in zip(at, (0.0, 0.5, 1.0)):
        assert sample.depth == sample.needle_depth == depth and sample.meta["depths"] == [depth * 100]
        (position,) = sample.needle_positions
        assert tok.decode(sample.input_ids[position:]).lstrip().startswith(needle)
        assert tok.decode(sample.input_ids).count(needle) == 1  # one needle, before sentence int(count * depth)
        share = position / sample.n_tokens
        assert {0.0: share < 0.05, 0.5: 0.4 < share < 0.6, 1.0: share > 0.9}[depth], (depth, share)


def test_contexts_say_where_each_needle_starts_to_the_character(tok):
    import random

    from bamctl.tasks.haystacks import essay_haystack
    from bamctl.tasks.ruler import essay_context_at, line_context

    needles = ["One of the special magic numbers for a is: 1.", "One of the special magic numbers for b is: 2."]
    contexts = [essay_context_at(essay_haystack(tok), needles, 600, [0.0, 40.0], 0.0),
                essay_context_at(essay_haystack(tok), needles, 600, [25.0, 100.0], 0.25),
                line_context(["x" * 7, "yy", "z" * 5, "w"], needles, random.Random(0), None),
                line_context(["x" * 7, "yy", "z" * 5, "w"], needles[:1], random.Random(0), 0.0)]
    for context in contexts:
        placed = needles[:len(context.needle_chars)]
        assert [context.text[at:at + len(needle)] for at, needle in zip(context.needle_chars, placed)] == placed


def test_numbers_are_rulers_seven_digits_from_one_million_to_9999999():
    from bamctl.tasks.ruler import random_number

    class Edge:  # an rng that draws one end of the range it is asked for
        def __init__(self, top):
            self.top = top

        def randint(self, low, high):
            return high if self.top else low

    assert (random_number(Edge(False)), random_number(Edge(True))) == ("1000000", "9999999")


def test_essay_corpus_holds_128k_tokens_before_repeating(tok):
    haystack = essay_haystack(tok)
    assert haystack.estimate_tokens(haystack.size) >= 131072
    sample = next(iter(generate_samples("niah_single_2", [131072], 1, 0, tok)))
    assert sample.meta["haystack_repeats"] == 1
    assert sample.n_tokens + 128 <= 131072


@pytest.mark.slow
def test_repetition_is_recorded(tok):
    sample = next(iter(generate_samples("niah_single_2", [262144], 1, 0, tok)))
    assert sample.meta["haystack_repeats"] == 2
    assert sample.n_tokens + 128 <= 262144


def test_string_match_metrics_as_ruler_defines_them():
    preds = ["The numbers are 1234567 and 7654321.", "nothing here", "ABCDEF-12 is it"]
    refs = [["1234567", "7654321", "1111111"], ["2222222"], ["abcdef-12"]]
    # all: (2/3 + 0 + 1) / 3 * 100; part: (1 + 0 + 1) / 3 * 100
    assert string_match_all(preds, refs) == round((2 / 3 + 0 + 1) / 3 * 100, 2) == 55.56
    assert string_match_part(preds, refs) == 66.67
    assert string_match_all(["x"], [["x"]]) == 100.0


def test_per_sample_scores(tok, samples):
    sample = samples["niah_multivalue", 1024][0]
    a = sample.answers
    assert score("string_match_all", " " + ", ".join(a), sample) == 1.0
    assert score("string_match_all", f" {a[0]} and {a[1]}", sample) == 0.5
    assert score("string_match_part", f" {a[2]}", sample) == 1.0
    assert score("string_match_part", " 0000000", sample) == 0.0


def test_per_sample_scores_are_unrounded_and_only_rulers_aggregate_rounds():
    """RULER rounds the mean over samples (x 100, 2 decimals), never a sample: 19 samples with one
    of three words found and one with none are 31.67 in RULER's table; rounding each sample first
    (0.3333) would make the mean 31.6635."""
    sample = Sample(task="fwe", protocol="ruler", length=1024, n_tokens=0, depth=None, seed=0, index=0, prompt="",
                    input_ids=[], answers=["aaa", "bbb", "ccc"], needle_positions=[], scoring="generate")
    predictions = [" only bbb here"] * 19 + [" nothing"]
    per_sample = [score("string_match_all", prediction, sample) for prediction in predictions]
    assert per_sample[0] == 1 / 3
    assert sum(per_sample) / 20 * 100 == pytest.approx(100 * 19 / 60, abs=1e-12)
    assert string_match_all(predictions, [sample.answers] * 20) == round(sum(per_sample) / 20 * 100, 2) == 31.67


def _nll_sample() -> Sample:
    return Sample(task="ppl", protocol="sliding", length=8, n_tokens=0, depth=None, seed=0, index=0, prompt="",
                  input_ids=[], answers=[], needle_positions=[], scoring="nll")


def test_mean_nll_is_the_span_nll_per_scored_token_and_nan_without_tokens():
    import math

    assert score("mean_nll", (10.0, 4), _nll_sample()) == 2.5
    assert math.isnan(score("mean_nll", (0.0, 0), _nll_sample()))


def test_an_unknown_metric_is_refused_with_the_close_names():
    with pytest.raises(BamctlError, match=r"^unknown metric 'passkey_exac'; did you mean passkey_exact"):
        score("passkey_exac", [], _nll_sample())


def test_a_key_drawn_twice_is_drawn_again_from_the_same_rng_as_ruler_does():
    """RULER draws keys until each is new (its ``while key in keys``): a number drawn a second time
    is replaced by the rng's next draw, never kept twice or left empty. The rng here returns the first
    key again when the second is drawn (its draws: key, value, the same key), then draws as seeded."""
    import random

    class DrawsTheFirstKeyTwice(random.Random):
        def __init__(self, seed: int):
            super().__init__(seed)
            self.script = [1234567, 2345678, 1234567]

        def randint(self, a, b):
            return self.script.pop(0) if self.script else super().randint(a, b)

    draw = draw_needles(NiahSpec("noise", "numbers", "numbers", num_keys=2), DrawsTheFirstKeyTwice(5))
    seeded = random.Random(5)
    redrawn = str(seeded.randint(10**6, 10**7 - 1))
    assert draw.keys == ["1234567", redrawn]
    assert draw.values == [["2345678"], [str(seeded.randint(10**6, 10**7 - 1))]]


def test_a_niah_task_that_names_no_counts_hides_one_key_with_one_value(tok):
    """A task file's ``args`` may leave out num_keys, num_values and num_queries: the generator then
    hides one needle, one key with one value, as RULER's single variants do."""
    slot = get_task("niah_single_1").slot(length=1024, depth=None, seed=3, index=0)
    sample = niah_sample(slot=slot, tokenizer=tok, haystack="noise", key_type="words", value_type="numbers")
    assert len(sample.meta["keys"]) == 1 and len(sample.meta["queries"]) == 1 and len(sample.answers) == 1
    assert len(sample.needle_positions) == 1 and sample.prompt.count("One of the special magic numbers for") == 1


def test_a_length_too_short_for_a_needle_without_haystack_says_so(tok):
    """Exact sizing refuses a length whose prompt has no room even without haystack, and names it so."""
    with pytest.raises(BamctlError, match=r"^length 100 is too short for niah_single_1: the prompt without haystack "
                                          r"already needs \d+ tokens besides the 128-token answer budget$"):
        list(generate_samples("niah_single_1", [100], 1, 0, tok))


def test_a_sample_records_its_haystack_and_its_needle_depth_to_six_decimals(tok):
    """docs/SCHEMA.md's needle_depth, to six decimals (18 of 31 noise lines: 0.580645); the meta names
    the haystack, and only an essay haystack lists the depths its needles were drawn at."""
    samples = {}
    for task, length in (("niah_single_1", 1000), ("niah_single_2", 1024)):
        spec = get_task(task)
        samples[task] = niah_sample(slot=spec.slot(length=length, depth=None, seed=0, index=0), tokenizer=tok, **spec.args)
        assert samples[task].meta["haystack"] == spec.args["haystack"]
        assert ("depths" in samples[task].meta) == (spec.args["haystack"] == "essay")
    lines = samples["niah_single_1"]
    assert lines.meta["haystack_units"] == 31 and lines.needle_depth == 0.580645


def test_an_unknown_haystack_and_depths_for_several_needles_are_refused_by_name(tok):
    with pytest.raises(BamctlError, match=r"^unknown haystack 'hay'; known: noise, essay, needle$"):
        NiahSpec("hay", "words", "numbers")
    with pytest.raises(BamctlError, match=r"^unknown needle kind 'letters'; known: numbers, words, uuids$"):
        NiahSpec("noise", "words", "letters")
    for count in ("num_keys", "num_values", "num_queries"):
        with pytest.raises(BamctlError, match=r"^num_keys, num_values and num_queries must be at least 1$"):
            NiahSpec("noise", "words", "numbers", **{count: 0})
    spec = get_task("niah_multikey_1")
    with pytest.raises(BamctlError, match=r"^--depths places a single needle; niah_multikey_1 hides 4$"):
        niah_sample(slot=spec.slot(length=1024, depth=0.5, seed=0, index=0), tokenizer=tok, **spec.args)
