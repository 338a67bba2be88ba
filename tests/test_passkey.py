"""Passkey: exact token lengths, key depth, digit-by-digit key, both protocols, scoring."""

import re

import pytest

from bamctl.errors import BamctlError
from bamctl.lengths import parse_lengths
from bamctl.tasks import generate_samples, passkey_digit_hits, score
from bamctl.tasks.passkey import FILLER, QUESTION, TASK_LINE
from bamctl.tokenizer import get_tokenizer

ALL_LENGTHS = parse_lengths("1k..512k")


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer("gpt2")


def _one(tok, length, depth, protocol=None, seed=0, index=0):
    samples = generate_samples("passkey", [length], index + 1, seed, tok, [depth], protocol=protocol)
    return list(samples)[index]


def _longest_filler_sentence(tok) -> int:
    sentences = re.findall(r"[^.]+\.", FILLER)
    return max(len(tok.encode(" " + s.strip())) for s in sentences)


@pytest.mark.parametrize("length", ALL_LENGTHS)
def test_authors_prompt_is_exactly_the_length(tok, length):
    for depth in (0.0, 0.37, 1.0):
        sample = _one(tok, length, depth)
        assert sample.n_tokens == length == len(sample.input_ids)
        assert tok.decode(sample.input_ids) == sample.prompt


@pytest.mark.parametrize("length", [1024, 3000, 4096, 10240, 65536])
def test_landmark_prompt_is_exactly_the_length(tok, length):
    sample = _one(tok, length, 0.5, protocol="landmark")
    assert sample.n_tokens == length
    assert tok.decode(sample.input_ids) == sample.prompt
    assert sample.prompt.startswith(TASK_LINE + "\n")
    assert sample.prompt.endswith("\n" + QUESTION)
    key = sample.answers[0]
    assert f"\nThe pass key is {key}. Remember it. {key} is the pass key.\n" in sample.prompt
    # Landmark's "\n".join(lines): both filler lines are cut from the start of " ".join(garbage),
    # so each begins "The grass" with no space before it
    lines = sample.prompt.split("\n")
    assert len(lines) == 5 and lines[1].startswith(FILLER[:20]) and lines[3].startswith(FILLER[:20])
    assert sample.scoring == "generate" and sample.max_new_tokens == 10
    assert sample.metric == "first_integer_match" and sample.target_ids == []


@pytest.mark.parametrize("length", [1024, 8192, 131072])
@pytest.mark.parametrize("depth", [0.0, 0.1, 0.25, 0.5, 0.77, 1.0])
def test_key_sits_at_the_requested_depth(tok, length, depth):
    sample = _one(tok, length, depth)
    filler = sample.meta["filler_tokens"]
    before = sample.meta["filler_before"]
    # Snapped to a sentence boundary: off by at most one filler sentence.
    assert abs(before - depth * filler) <= _longest_filler_sentence(tok)
    task_tokens = len(tok.encode(TASK_LINE))
    assert sample.needle_positions == [task_tokens + before]
    needle = tok.decode(sample.input_ids[sample.needle_positions[0] :])
    assert needle.startswith(f" The pass key is {sample.answers[0]}. Remember it. {sample.answers[0]} is the pass key.")
    # The text before the needle ends a sentence.
    assert tok.decode(sample.input_ids[: sample.needle_positions[0]]).endswith(".")


def test_authors_wording_and_teacher_forcing_targets(tok):
    sample = _one(tok, 2048, 0.5)
    key = sample.answers[0]
    assert re.fullmatch(r"[1-9]\d{4}", key) and 10000 <= int(key) <= 99999
    assert sample.prompt.startswith(TASK_LINE + " " + FILLER + " ")
    assert sample.prompt.endswith(" What is the pass key? The pass key is")
    assert sample.scoring == "teacher_forced" and sample.metric == "passkey_exact"
    # The key is fed digit by digit: " d1", "d2", ..., in the needle and as the target.
    assert [tok.decode([t]) for t in sample.target_ids] == [" " + key[0], *key[1:]]
    for at in sample.meta["key_positions"]:
        assert sample.input_ids[at : at + 5] == sample.target_ids
    # decode(prompt + target) reads naturally.
    assert tok.decode(sample.input_ids + sample.target_ids).endswith(f"The pass key is {key}")


def test_keys_differ_across_indices_and_pair_across_depths(tok):
    keys = [s.answers[0] for s in generate_samples("passkey", [1024], 20, 0, tok, [0.5])]
    assert len(set(keys)) > 15
    at_depths = list(generate_samples("passkey", [1024], 1, 0, tok, [0.0, 0.5, 1.0]))
    assert len({s.answers[0] for s in at_depths}) == 1
    assert len({tuple(s.input_ids) for s in at_depths}) == 3


def test_sample_does_not_depend_on_other_lengths(tok):
    alone = list(generate_samples("passkey", [4096], 3, 7, tok, [0.5]))
    mixed = [s for s in generate_samples("passkey", [1024, 4096, 2048], 3, 7, tok, [0.5]) if s.length == 4096]
    assert [s.to_json() for s in alone] == [s.to_json() for s in mixed]


def test_default_depths_are_five_evenly_spaced(tok):
    samples = list(generate_samples("passkey", [1024], 1, 0, tok))
    assert [s.depth for s in samples] == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_too_short_is_an_error(tok):
    with pytest.raises(BamctlError, match="too short"):
        list(generate_samples("passkey", [20], 1, 0, tok, [0.5]))


def test_teacher_forced_scoring(tok):
    sample = _one(tok, 1024, 0.5)
    right = list(sample.target_ids)
    assert passkey_digit_hits(right, sample) == (True, [True] * 5)
    assert score("passkey_exact", right, sample) == 1.0
    wrong = right[:2] + [right[2] + 1] + right[3:]
    assert passkey_digit_hits(wrong, sample) == (False, [True, True, False, True, True])
    assert score("passkey_exact", wrong, sample) == 0.0
    assert score("passkey_digits", wrong, sample) == pytest.approx(0.8)
    assert passkey_digit_hits(right[:4], sample)[0] is False


@pytest.mark.parametrize("digit", [0, 4])
def test_a_key_wrong_in_one_end_digit_alone_scores_zero(tok, digit):
    # The first and the last digit are where a scorer that slices its hits would look past a miss;
    # a key wrong in its last digit alone is the miss the baselines record reports at depth 0.
    sample = _one(tok, 1024, 0.0)
    right = list(sample.target_ids)
    assert len(right) == 5
    wrong = list(right)
    wrong[digit] = right[digit] + 1
    hits = [True] * 5
    hits[digit] = False
    assert passkey_digit_hits(wrong, sample) == (False, hits)
    assert score("passkey_exact", wrong, sample) == 0.0
    assert score("passkey_digits", wrong, sample) == pytest.approx(0.8)


def test_landmark_scoring_takes_the_first_integer(tok):
    sample = _one(tok, 1024, 0.5, protocol="landmark")
    key = sample.answers[0]
    assert score("first_integer_match", f" {key}. Remember", sample) == 1.0
    assert score("first_integer_match", f" 1{key}", sample) == 0.0
    assert score("first_integer_match", f" 7 and {key}", sample) == 0.0
    assert score("first_integer_match", " no idea", sample) == 0.0


@pytest.mark.parametrize("protocol", ["bogus", "landmrk"])
def test_unknown_protocol(tok, protocol):
    with pytest.raises(BamctlError, match="unknown protocol"):
        generate_samples("passkey", [1024], 1, 0, tok, protocol=protocol)


def test_the_filler_breaks_after_every_sentence_end_and_the_white_space_that_follows_it(tok):
    # the needle goes in at one of these offsets: after '.', '!' or '?', or after the blank lines
    # after one, never inside a sentence
    from bamctl.tasks.passkey import _sentence_breaks

    ids = tok.encode("Go. Stop! Why?\n\nEnd")
    assert [tok.decode([i]) for i in ids] == ["Go", ".", " Stop", "!", " Why", "?", "\n", "\n", "End"]
    assert _sentence_breaks(tok, tuple(ids)) == (2, 4, 6, 7, 8)


def test_a_sample_with_no_key_digits_scores_zero_digits(tok):
    import dataclasses

    empty = dataclasses.replace(_one(tok, 1024, 0.5), target_ids=[])
    assert score("passkey_digits", [], empty) == 0.0
    assert score("passkey_exact", [], empty) == 0.0


def test_key_depths_are_torchs_float32_linspace_truncated():
    """The authors place the key at torch.linspace(0, n, k)[i].long(); torch is the reference here,
    as in tests/test_fidelity_passkey.py (which the mutation run does not select). The depth counts
    reach past 14, where torch's fused multiply-add in the second half (AVX2 and AVX-512 kernels)
    moves the middle point of 15, 27, 29 or 31 depths for some n; torch built without it (its
    DEFAULT kernels) is not what the authors ran on an x86 CPU, so the test skips there."""
    import torch

    from bamctl.tasks.passkey import linspace_point

    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        pytest.skip("torch runs its kernels without a fused multiply-add here")
    ends = [*range(300), 4093, 65_531, 524_287, 1_048_573, 3_000_001]
    for steps in [*range(1, 18), 27, 29, 31, 32, 33, 48, 64]:
        for end in ends:
            expected = torch.linspace(0, end, steps).long().tolist()
            assert [linspace_point(end, i, steps) for i in range(steps)] == expected, (end, steps)


def test_the_middle_of_fifteen_depths_is_torchs_fused_multiply_add():
    """15 depths over 2 units: the middle point counts down from 2 by 7 steps of 2/14 in float32.
    Fused (one rounding of 2 - 7 * fl(1/7)) it is just below 1, so the key goes after 0 units, as
    torch.linspace(0, 2, 15).long()[7] puts it; rounding 7 * fl(1/7) to 1.0 first would give 1."""
    from fractions import Fraction

    import numpy as np

    from bamctl.tasks.passkey import linspace_point

    step = np.float32(2) / np.float32(14)
    assert 2 - 7 * Fraction(float(step)) < 1  # the exact value a fused multiply-add rounds once
    assert np.float32(7) * step == np.float32(1.0)  # what rounding the product first gives
    assert linspace_point(2, 7, 15) == 0
    assert linspace_point(4, 7, 15) == 1


@pytest.mark.parametrize("lead", [" ", ""])
def test_the_key_goes_to_the_sentence_end_nearest_its_depth_and_never_past_the_filler(tok, lead):
    """The filler's sentence ends found again by decoding every prefix of the stream (a break after
    token k when the text so far ends in . ? or !), then, for each filler size and target depth, the
    nearest one not past the filler's end (the end itself included), ties to the earlier one."""
    from bamctl.tasks.passkey import _filler_stream

    stream = _filler_stream(tok, lead)
    longest = len(stream.head) + 3 * len(stream.unit)
    tokens = stream.tokens(longest)
    breaks = [0] + [k for k in range(1, longest + 1) if tok.decode(tokens[:k]).rstrip().endswith((".", "?", "!"))]
    assert set(stream.head_breaks) <= set(breaks)  # the head's own ends, the last one included
    for limit in range(longest + 1):
        for target in {0.0, limit / 3, limit / 2, 0.8 * limit, float(limit)}:
            allowed = [b for b in breaks if b <= limit]
            expected = min(allowed, key=lambda b: (abs(b - target), b))  # noqa: B023
            assert stream.sentence_break_near(target, limit) == expected, (limit, target)


@pytest.mark.parametrize("protocol", [None, "landmark"])
def test_needle_depth_is_the_share_of_the_filler_before_the_key(tok, protocol):
    """The row's needle_depth (docs/SCHEMA.md: where the needle landed, a fraction of the haystack)
    is the filler before the key over all the filler, kept to 6 decimals, restated here."""
    for depth in (0.0, 0.37, 0.5, 1.0):
        sample = _one(tok, 1024, depth, protocol=protocol)
        before, filler = sample.meta["filler_before"], sample.meta["filler_tokens"]
        assert 0 < filler and sample.needle_depth == round(before / filler, 6)
        assert abs(sample.needle_depth - depth) <= _longest_filler_sentence(tok) / filler


@pytest.mark.parametrize("protocol", [None, "landmark"])
def test_a_prompt_of_the_minimum_length_has_no_filler_and_its_needle_at_depth_zero(tok, protocol):
    """At the length a too-short request names as the minimum, the prompt is the fixed pieces alone:
    no filler, the key right after the task line, needle_depth 0.0 (not a division by zero)."""
    with pytest.raises(BamctlError, match=r"the minimum is (\d+) tokens") as too_short:
        _one(tok, 10, 0.5, protocol=protocol)
    minimum = int(re.search(r"the minimum is (\d+) tokens", str(too_short.value)).group(1))
    for depth in (0.0, 0.5, 1.0):
        sample = _one(tok, minimum, depth, protocol=protocol)
        assert sample.n_tokens == minimum and sample.meta["filler_tokens"] == 0 == sample.meta["filler_before"]
        assert sample.needle_depth == 0.0


def test_authors_prompts_are_the_authors_generator_token_for_token_with_the_needle_where_it_went():
    """--protocol authors against the BAM authors' PromptGenerator as tests/test_fidelity_passkey.py
    restates it (Mistral v0.3's vocabulary encoded by sentencepiece itself, not by bamctl), at
    lengths with no whole unit of filler, one, and many; and what the row records beside the
    prompt: the info line's first token (needle_positions), n_prefix / n (needle_depth, 0.0 with no
    units) and the units (meta)."""
    import math

    import torch

    from bamctl.backends.hf_tokenizer import load_hf_tokenizer
    from mistral_vocab import INFO, MODEL_FILE, TASK, UNIT, reference_processor
    from mistral_vocab import QUESTION as ASKED
    from test_fidelity_passkey import authors_prompt as reference_prompt

    sp, ours = reference_processor(), load_hf_tokenizer(MODEL_FILE)
    task, unit = sp.encode(TASK), sp.encode(UNIT)
    k = 5
    exactly_three = len(task) + len(sp.encode(INFO.format(pass_key=99999))) + len(sp.encode(ASKED)) + 3 * len(unit)
    for length in (60, 100, exactly_three, 1000):  # n = 0, 1, 3 (not a token to spare), 38
        samples = list(generate_samples("passkey", [length], 2, 7, ours, [i / (k - 1) for i in range(k)], protocol="authors"))
        assert len(samples) == 2 * k
        for sample in samples:
            i, key = round(sample.depth * (k - 1)), sample.answers[0]
            prompt, answer, target = reference_prompt(sp, length, lambda n: int(torch.linspace(0, n, k).long()[i]), key)  # noqa: B023
            assert sample.input_ids == prompt and sample.answer_ids == answer and sample.target_ids == target
            n, n_prefix = sample.meta["filler_units"], sample.meta["units_before"]
            assert n == (len(prompt) - len(task) - len(sp.encode(INFO.format(pass_key=key))) - len(sp.encode(ASKED))) // len(unit)
            at = len(task) + n_prefix * len(unit)
            assert sample.needle_positions == [at] and prompt[at:at + 3] == sp.encode(INFO.format(pass_key=key))[:3]
            assert sample.needle_depth == (round(n_prefix / n, 6) if n else 0.0)
        fixed = len(task) + len(sp.encode(INFO.format(pass_key=99999))) + len(sp.encode(ASKED))  # the longest key's info line
        assert {s.meta["filler_units"] for s in samples} == {max(0, (length - fixed) // len(unit))}
    # a depth asked alone, on no grid of evenly spaced depths: floor(d n) units before it (docs/protocols.md)
    (alone,) = generate_samples("passkey", [1000], 1, 7, ours, [0.37], protocol="authors")
    n = alone.meta["filler_units"]
    assert alone.meta["units_before"] == math.floor(0.37 * n) and n == 38
    assert alone.input_ids == reference_prompt(sp, 1000, lambda n: math.floor(0.37 * n), alone.answers[0])[0]


class _DummyPrefixPieces:
    """A SentencePiece-like tokenizer, restated: a dummy "▁" before the text, spaces as "▁", a
    leading "▁▁" one piece, then either one piece per character or (``glue``) "▁" glued to the
    digit after it, as a vocabulary with "▁1" pieces would; decoding turns "▁" back into spaces."""

    name = "dummy-prefix"

    def __init__(self, glue: bool):
        self.glue, self.pieces = glue, []

    def _id(self, piece):
        if piece not in self.pieces:
            self.pieces.append(piece)
        return self.pieces.index(piece)

    def encode(self, text):
        text, out = "▁" + text.replace(" ", "▁"), []
        if text.startswith("▁▁"):
            out, text = ["▁" if self.glue else "▁▁"], text[1 if self.glue else 2:]
        while text:
            take = 2 if self.glue and text[0] == "▁" and text[1:2].isdigit() else 1
            out, text = out + [text[:take]], text[take:]
        return [self._id(p) for p in out]

    def decode(self, ids):
        return "".join(self.pieces[i] for i in ids).replace("▁", " ")


def test_the_authors_scoring_needs_one_leading_token_and_then_one_token_per_digit():
    """" " + key as "▁▁" and five digit pieces (Mistral's form) can be scored as the authors do; as
    "▁", "▁1", "2", "3", "4", "5" it has the right number of tokens but its first digit is not a digit
    token, so it is refused, as GPT-2 (" 999" + "99": too few tokens) is."""
    from bamctl.tasks.passkey import authors_scoring

    assert authors_scoring(_DummyPrefixPieces(glue=False), 5) is None
    glued = _DummyPrefixPieces(glue=True)
    assert len(glued.encode(" 12345")) == 6 and glued.decode(glued.encode(" 12345")[1:2]) == " 1"
    assert "encodes ' 99999' as 6 tokens" in authors_scoring(glued, 5)
    assert "encodes ' 99999' as 2 tokens" in authors_scoring(get_tokenizer("gpt2"), 5)


def test_a_passkey_sample_by_default_is_a_five_digit_key_among_space_led_pieces(tok):
    """passkey_sample's defaults, for a task file that names neither: a five-digit key and pieces led
    by a space (the exact form's), the same sample as one that names them; an unknown form is refused
    by name."""
    from bamctl.tasks import get_task
    from bamctl.tasks.passkey import passkey_sample

    slot = get_task("passkey").slot(length=1024, depth=0.5, seed=3, index=1)
    plain = passkey_sample(slot=slot, tokenizer=tok, form="exact_length", keys="authors")
    named = passkey_sample(slot=slot, tokenizer=tok, form="exact_length", keys="authors", join=" ", key_digits=5)
    assert re.fullmatch(r"[1-9]\d{4}", plain.answers[0]) and plain.input_ids == named.input_ids
    assert plain.to_json()["meta"]["key"] == plain.answers[0]  # `bamctl generate` writes it with the sample
    with pytest.raises(BamctlError, match=r"^unknown passkey form 'lines'; use authors or exact_length$"):
        passkey_sample(slot=slot, tokenizer=tok, form="lines", keys="authors")


def test_a_key_is_any_five_digit_number_drawn_from_its_slots_own_generator():
    """The key is randint(10**4, 10**5 - 1) of the generator seeded by the slot's identity, restated
    here. Python's randint takes 17 random bits and draws again at 90000 or more; two slots were
    found by searching those bits: at (seed 20, index 5298) the draw is the top, 99999, and at
    (seed 3, index 6963) the first bits are past the range, so the key comes from the next draw and
    never has six digits."""
    from bamctl.tasks import get_task
    from bamctl.tasks.passkey import passkey_key
    from bamctl.tasks.sample import sample_rng

    spec = get_task("passkey")
    keys = {}
    for seed, index in [(20, 5298), (3, 6963), (0, 0), (7, 3)]:
        expected = sample_rng(seed, "passkey", "authors", 1024, index).randint(10_000, 99_999)
        keys[seed, index] = passkey_key(spec.slot(length=1024, depth=0.5, seed=seed, index=index), 5, "authors")
        assert keys[seed, index] == str(expected)
    assert keys[20, 5298] == "99999" and len(keys[3, 6963]) == 5
