"""[data] passkey_needle_first (baselines record, step 24): a share of passkey rows opens with the needle. Its
default and resumption are held with the other late recipe keys in tests/test_train_data.py."""

import copy

import pytest
import torch

from bamctl.tasks.passkey import passkey_pieces
from bamctl.tokenizer import get_tokenizer
from bamctl.train import PASSKEY_SEED_OFFSET, prepare, recipe_from_dict
from bamctl.train.data import needle_first, passkey_row
from test_train_recipe import BASE


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer("gpt2")


def _retrieval_only(**data):
    recipe = copy.deepcopy(BASE)
    train_length = recipe["model"]["train_length"]
    recipe["data"] = {"text": "none", "passkey_fraction": 1.0, "vocab_size": 600,
                      "passkey_max_prompt": train_length, "passkey_longest_fraction": 0.25, **data}
    return recipe_from_dict(recipe)


def test_needle_first_draws_that_share_of_rows_from_a_stream_of_its_own():
    draws = [needle_first(0, g, 0.2) for g in range(5000)]
    assert 0.18 <= sum(draws) / len(draws) <= 0.22
    assert draws == [needle_first(0, g, 0.2) for g in range(5000)]  # a pure function of (seed, row)
    assert draws != [needle_first(1, g, 0.2) for g in range(5000)]  # the training seed moves it
    assert not any(needle_first(0, g, 0.0) for g in range(200))
    assert all(needle_first(0, g, 1.0) for g in range(200))


def test_needle_first_rows_open_with_the_needle_and_keep_length_key_and_the_rest(tokenizer):
    plain = prepare(_retrieval_only()).batches
    lever = prepare(_retrieval_only(passkey_needle_first=0.5)).batches
    opened = 0
    for step in range(20):
        for row in range(2):
            g = step * 2 + row
            ids, kind, scored = lever.row(step, 0, row)
            plain_ids, _, plain_scored = plain.row(step, 0, row)
            assert kind == "passkey" and len(ids) == len(plain_ids)
            assert scored[-5:] == plain_scored[-5:]  # the answer where the plain row has it
            key = [ids[i] for i in scored[-5:]]
            assert key == [plain_ids[i] for i in plain_scored[-5:]]  # the same key
            assert [ids[i] for i in scored[:5]] == key and [ids[i] for i in scored[5:10]] == key
            if not needle_first(0, g, 0.5):
                assert list(ids) == list(plain_ids)  # a row not drawn is the plain recipe's row
                continue
            opened += 1
            pieces = passkey_pieces(tokenizer, tokenizer.decode(key).strip(), " ")
            needle, task = len(pieces.needle), len(pieces.task)
            assert list(ids[:needle]) == pieces.needle  # the row opens with the needle ...
            assert list(ids[needle : needle + task]) == pieces.task  # ... the instruction after it
            assert scored[0] == pieces.key_at[0] and scored[5] == pieces.key_at[1]
            # the rest is the protocol's depth-0 prompt of the same length and seed
            length = scored[-1] + 1
            depth0, _ = passkey_row(tokenizer, length, PASSKEY_SEED_OFFSET + g, 0.0)
            assert list(ids[needle + task : length]) == depth0[task + needle :]
    assert opened >= 8
