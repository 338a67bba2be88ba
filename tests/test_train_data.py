"""Training data: pure batches, the passkey/text mix, seeds disjoint from evaluation, the token subset."""

import copy
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from bamctl.errors import BamctlError
from bamctl.tasks import generate_samples
from bamctl.tokenizer import get_tokenizer
from bamctl.train import PASSKEY_SEED_OFFSET, build_token_subset, is_passkey_row, passkey_token_ids, prepare, recipe_from_dict
from bamctl.train.data import IGNORE, TokenShards, directory_tokens, passkey_row, shipped_text_tokens
from test_train_recipe import BASE


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer("gpt2")


@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.3, 0.5, 1.0])
def test_mix_gives_exactly_the_fraction_over_any_run_of_rows(fraction):
    rows = [is_passkey_row(g, fraction) for g in range(1000)]
    assert sum(rows) == int(1000 * fraction)
    # evenly spread: every window of 20 rows is within one row of the fraction
    assert all(abs(sum(rows[i : i + 20]) - 20 * fraction) <= 1 for i in range(0, 980))


def test_batches_are_pure_and_follow_the_mix(tokenizer):
    setup = prepare(recipe_from_dict(BASE))
    first = setup.batches.batch(3)
    again = setup.batches.batch(3)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[0], setup.batches.batch(4)[0])
    inputs, targets = first
    assert inputs.shape == targets.shape == (2, 96)
    assert torch.equal(inputs[:, 1:][targets[:, :-1] != IGNORE], targets[:, :-1][targets[:, :-1] != IGNORE])
    kinds = [setup.batches.row(step, 0, r)[1] for step in range(20) for r in range(2)]
    assert kinds.count("passkey") == 20 and kinds.count("text") == 20


def test_passkey_rows_hold_a_prompt_of_varied_length_and_use_seeds_above_evaluation(tokenizer):
    from bamctl.tasks.passkey import QUESTION

    setup = prepare(recipe_from_dict(BASE))
    recipe = setup.recipe
    question = tokenizer.encode(" " + QUESTION)
    answer_ends = set()
    for step in range(10):
        # with fraction 0.5, odd global rows are passkey prompts
        ids, kind, scored = setup.batches.row(step, 0, 1)
        assert kind == "passkey" and len(ids) == recipe.model.train_length + 1
        # the loss scores the key's digits only: two copies in the needle and the answer
        key = [ids[i] for i in scored[-5:]]
        assert len(scored) == 15 and [ids[i] for i in scored] == key * 3
        assert ids[scored[-5] - len(question) : scored[-5]] == question
        answer_ends.add(scored[-1])
        targets = setup.batches.batch(step)[1][1]
        assert (targets != IGNORE).nonzero()[:, 0].tolist() == [i - 1 for i in scored]
    assert len(answer_ends) > 3  # the answer is not always at the row's end
    # passkey sample seeds start at the offset, far above evaluation seeds
    assert recipe.data.passkey_seed_offset >= PASSKEY_SEED_OFFSET
    train_prompts = {tuple(passkey_row(tokenizer, 97, PASSKEY_SEED_OFFSET + g, 0.5)[0]) for g in range(50)}
    for seed in range(10):
        for sample in generate_samples("passkey", [92], 4, seed, tokenizer):
            assert tuple(sample.input_ids + sample.target_ids) not in train_prompts


def test_token_subset_holds_every_passkey_piece_then_frequent_text(tokenizer):
    text = shipped_text_tokens(tokenizer)
    subset = build_token_subset(tokenizer, text, 300)
    pieces = passkey_token_ids(tokenizer)
    assert len(subset) == 300 and len(set(subset)) == 300
    assert subset[: len(pieces)] == pieces
    for sample in generate_samples("passkey", [200, 1000], 2, 0, tokenizer):
        assert set(sample.input_ids + sample.target_ids) <= set(pieces)
    counts = np.bincount(text.head(10**9), minlength=tokenizer.vocab_size)
    assert counts[subset[len(pieces)]] == max(counts[i] for i in range(len(counts)) if i not in pieces)
    assert build_token_subset(tokenizer, text, 0) is None
    with pytest.raises(BamctlError, match="passkey prompt needs"):
        build_token_subset(tokenizer, text, 10)


def test_training_text_is_the_train_corpus_only(tokenizer):
    from bamctl.tasks.texts import shipped_corpus

    assert shipped_text_tokens(tokenizer).name == "shipped corpus 'train'"
    assert not set(shipped_corpus("train").files) & set(shipped_corpus("ppl").files)


def test_data_folder_reads_text_npy_and_llmc_shards(tmp_path, tokenizer):
    (tmp_path / "a.txt").write_text("The sky is blue. " * 20)
    np.save(tmp_path / "b.npy", np.arange(100, 300, dtype=np.uint16))
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [20240520, 1, 50]
    with open(tmp_path / "c.bin", "wb") as handle:
        handle.write(header.tobytes() + np.full(50, 7, dtype=np.uint16).tobytes())
    shards = directory_tokens(tmp_path, tokenizer)
    assert [len(a) for a in shards.arrays] == [len(tokenizer.encode("The sky is blue. " * 20)) + 1, 200, 50]
    windows = [shards.window(40, u) for u in np.linspace(0, 0.999, 50)]
    assert all(len(w) == 40 for w in windows)
    assert any((w == 7).all() for w in windows) and any((np.diff(w) == 1).all() and w[0] >= 100 for w in windows)
    with pytest.raises(BamctlError, match="no run of"):
        TokenShards([np.arange(5)], "x").window(10, 0.5)
    with pytest.raises(BamctlError, match="no .txt"):
        (tmp_path / "empty").mkdir()
        directory_tokens(tmp_path / "empty", tokenizer)


def test_data_dir_recipe_without_data_fails_in_one_line():
    recipe = recipe_from_dict(BASE)
    recipe = replace(recipe, data=replace(recipe.data, text="data-dir"))
    with pytest.raises(BamctlError, match="pass --data DIR"):
        prepare(recipe)
    retrieval_only = replace(recipe, data=replace(recipe.data, text="none", passkey_fraction=1.0))
    with pytest.raises(BamctlError, match="--data does not apply"):
        prepare(retrieval_only, data_dir=Path("."))


def _retrieval_only(**data):
    recipe = copy.deepcopy(BASE)
    recipe["data"] = {"text": "none", "passkey_fraction": 1.0, "vocab_size": 600, **data}
    return recipe_from_dict(recipe)


def test_corpus_filler_keeps_the_prompt_pieces_and_the_key_digits_scored(tokenizer):
    from bamctl.tasks.passkey import FILLER, QUESTION, TASK_LINE

    setup = prepare(_retrieval_only(passkey_filler="train", passkey_min_length=90))
    protocol_filler = set(tokenizer.encode(" " + FILLER))
    for step in range(6):
        ids, kind, scored = setup.batches.row(step, 0, 0)
        assert kind == "passkey" and len(ids) == 97 and len(scored) == 15
        key = [ids[i] for i in scored[-5:]]
        assert [ids[i] for i in scored] == key * 3
        length = scored[-1] + 1
        assert length >= 90  # passkey_min_length
        prompt = tokenizer.decode(list(ids[:length]))
        assert prompt.startswith(TASK_LINE) and QUESTION in prompt and "The pass key is" in prompt
        filler = [t for t in ids[: scored[0]] if t not in set(tokenizer.encode(TASK_LINE))]
        assert not set(filler) <= protocol_filler  # running text, not the protocol's sentences
        assert sum(ch.isdigit() for ch in prompt) == 15  # the key (3 copies) is the only number
    # the subset's frequent ids come from the filler corpus in a retrieval-only recipe
    x, _ = setup.batches.batch(0)
    assert (x == setup.batches.subset.unk).float().mean() < 0.2


def test_answer_loss_scores_the_answer_digits_only(tokenizer):
    setup = prepare(_retrieval_only(passkey_loss="answer"))
    ids, _, scored = setup.batches.row(0, 0, 1)
    key_scored = prepare(_retrieval_only()).batches.row(0, 0, 1)[2]
    assert scored == key_scored[-5:]


def test_filler_fraction_mixes_protocol_and_corpus_rows(tokenizer):
    setup = prepare(_retrieval_only(passkey_filler="essays", passkey_filler_fraction=0.5, passkey_min_length=90))
    pieces = set(passkey_token_ids(tokenizer))
    kinds = []
    for step in range(10):
        for row in range(2):
            ids, _, scored = setup.batches.row(step, 0, row)
            kinds.append(set(ids[: scored[-1]]) <= pieces)  # protocol filler: nothing but passkey pieces
    assert 3 <= sum(kinds) <= 17  # both kinds of filler occur


def test_default_data_options_keep_todays_rows():
    recipe = recipe_from_dict(BASE)
    assert (recipe.data.passkey_filler, recipe.data.passkey_filler_fraction, recipe.data.passkey_min_length) == ("protocol", 1.0, 0)


def test_passkey_max_prompt_puts_a_1x_prompt_and_its_answer_inside_the_training_rows(tokenizer):
    # Without it a row's prompt + answer fit train_length + 1 tokens, so a 1x evaluation
    # prompt (train_length tokens) has its answer at positions training never showed: an
    # absolute PE (sinusoidal) then misses the later digits of a key at 1x.
    train_length = BASE["model"]["train_length"]
    setup = prepare(_retrieval_only(passkey_max_prompt=train_length))
    prompts = []
    for step in range(30):
        for row in range(2):
            ids, kind, scored = setup.batches.row(step, 0, row)
            assert kind == "passkey" and len(ids) == train_length + 5  # the longest prompt + its 5 answer digits
            prompts.append(scored[-1] + 1 - 5)  # the answer's 5 digits end the prompt + answer
    assert max(prompts) <= train_length
    assert max(prompts) > train_length + 1 - 5  # longer than today's rows allow
    inputs, targets = setup.batches.batch(0)
    assert inputs.shape == targets.shape == (2, train_length + 4)
    today = prepare(_retrieval_only())
    assert today.batches.batch(0)[0].shape == (2, train_length)
    assert max(today.batches.row(s, 0, r)[2][-1] + 1 - 5 for s in range(30) for r in range(2)) <= train_length + 1 - 5


def test_passkey_max_prompt_below_the_training_length_caps_the_prompts(tokenizer):
    setup = prepare(_retrieval_only(passkey_max_prompt=80))
    prompts = []
    for step in range(30):
        for row in range(2):
            ids, _, scored = setup.batches.row(step, 0, row)
            assert len(ids) == 80 + 5
            prompts.append(scored[-1] + 1 - 5)
    assert max(prompts) <= 80 and min(prompts) < 80


@pytest.mark.parametrize(
    "data, message",
    [
        ({"passkey_max_prompt": 10_000}, "passkey_max_prompt must be in"),
        ({"passkey_max_prompt": -1}, "passkey_max_prompt must be in"),
        ({"passkey_longest_fraction": 1.5}, "passkey_longest_fraction must be in"),
    ],
)
def test_passkey_max_prompt_is_checked(data, message):
    with pytest.raises(BamctlError, match=message):
        _retrieval_only(**data)


def test_passkey_max_prompt_needs_a_retrieval_only_recipe():
    recipe = copy.deepcopy(BASE)
    recipe["data"] = {**recipe["data"], "passkey_max_prompt": 64}
    assert recipe["data"]["passkey_fraction"] < 1.0
    with pytest.raises(BamctlError, match="passkey_max_prompt needs passkey_fraction = 1"):
        recipe_from_dict(recipe)


def test_longest_fraction_draws_that_share_of_rows_at_the_longest_length(tokenizer):
    train_length = BASE["model"]["train_length"]
    lengths = {}
    for fraction in (0.0, 0.5):
        setup = prepare(_retrieval_only(passkey_max_prompt=train_length, passkey_longest_fraction=fraction))
        lengths[fraction] = [setup.batches.row(s, 0, r)[2][-1] + 1 for s in range(50) for r in range(2)]
    longest = train_length + 5
    assert max(lengths[0.5]) == longest and max(lengths[0.0]) <= longest
    share = {f: sum(n == longest for n in v) / len(v) for f, v in lengths.items()}
    assert share[0.0] < 0.1 and 0.35 <= share[0.5] <= 0.75  # 1 in ~30 lengths, against half plus that


def _needle_ends(tokenizer, ids, scored, seed):
    """The ends (0.0, 1.0) whose protocol prompt a row holds; both where the filler is too short
    to tell them apart."""
    length = scored[-1] + 1
    return {depth for depth in (0.0, 1.0) if passkey_row(tokenizer, length, seed, depth)[0] == list(ids[:length])}


def test_depth_ends_puts_that_share_of_needles_at_the_ends_half_each():
    from bamctl.train.data import end_depth

    draws = [end_depth(0, g, 0.3) for g in range(4000)]
    ends = [d for d in draws if d is not None]
    assert 0.27 <= len(ends) / len(draws) <= 0.33
    assert set(ends) == {0.0, 1.0} and 0.45 <= ends.count(0.0) / len(ends) <= 0.55
    assert draws == [end_depth(0, g, 0.3) for g in range(4000)]  # a pure function of (seed, row)
    assert draws != [end_depth(1, g, 0.3) for g in range(4000)]  # the training seed moves it
    assert all(end_depth(0, g, 0.0) is None for g in range(200))
    assert all(end_depth(0, g, 1.0) in (0.0, 1.0) for g in range(200))


def test_depth_ends_rows_hold_the_needle_at_the_end_drawn_and_keep_their_length_and_key(tokenizer):
    train_length = BASE["model"]["train_length"]
    options = {"passkey_max_prompt": train_length, "passkey_longest_fraction": 0.25}
    plain = prepare(_retrieval_only(**options)).batches
    ends = prepare(_retrieval_only(**options, passkey_depth_ends=0.5)).batches
    from bamctl.train.data import end_depth

    seen, told_apart = {0.0: 0, 1.0: 0, None: 0}, {0.0: 0, 1.0: 0}
    for step in range(30):
        for row in range(2):
            g = step * 2 + row
            ids, _, scored = ends.row(step, 0, row)
            plain_ids, _, plain_scored = plain.row(step, 0, row)
            # the same prompt length and key as the recipe without the option
            assert scored[-1] == plain_scored[-1]
            assert [ids[i] for i in scored[-5:]] == [plain_ids[i] for i in plain_scored[-5:]]
            drawn = end_depth(0, g, 0.5)
            seed = PASSKEY_SEED_OFFSET + g
            if drawn is not None:
                holds = _needle_ends(tokenizer, ids, scored, seed)
                assert drawn in holds
                told_apart[drawn] += holds == {drawn}
            else:
                assert list(ids) == list(plain_ids)  # a uniform row is the plain recipe's row
            seen[drawn] += 1
    assert all(seen.values())  # both ends and uniform rows occur
    assert all(told_apart.values())  # each end in a row whose filler is long enough to tell them apart
    # without the option the needle opens the prompt only where the uniform draw or a short filler puts it
    at_start = [plain.row(s, 0, r)[2][0] for s in range(12) for r in range(2)]
    assert min(at_start) < max(at_start)


# Recipe keys added after checkpoints shipped (each a lever of the baselines record), at a value that draws
LATE_KEYS = [("passkey_depth_ends", 0.3), ("passkey_needle_first", 0.2)]


@pytest.mark.parametrize("key, value", LATE_KEYS)
def test_late_keys_batches_are_pure_so_a_resumed_run_sees_the_same_data(key, value):
    recipe = _retrieval_only(**{key: value})
    first, second = prepare(recipe).batches, prepare(recipe).batches
    ahead = [first.batch(step) for step in range(6)]
    resumed = second.batch(5)  # a run resumed at step 5 computes no earlier batch
    assert torch.equal(ahead[5][0], resumed[0]) and torch.equal(ahead[5][1], resumed[1])


@pytest.mark.parametrize("key, value", LATE_KEYS)
def test_late_keys_default_keeps_the_rows_and_the_recipe_fingerprint(key, value):
    without = _retrieval_only()
    explicit = _retrieval_only(**{key: 0.0})
    assert getattr(without.data, key) == 0.0
    assert explicit.fingerprint() == without.fingerprint()
    assert _retrieval_only(**{key: value}).fingerprint() != without.fingerprint()
    a, b = prepare(without).batches, prepare(explicit).batches
    for step in range(4):
        assert all(torch.equal(x, y) for x, y in zip(a.batch(step), b.batch(step)))
    # a stored recipe that predates the key (a shipped checkpoint's config.json) keeps its fingerprint
    stored = without.to_dict()
    del stored["data"][key]
    assert recipe_from_dict(stored).fingerprint() == without.fingerprint()
    with pytest.raises(BamctlError, match=f"{key} must be in"):
        _retrieval_only(**{key: 1.5})

