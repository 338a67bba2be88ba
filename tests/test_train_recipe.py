"""Recipes are data: a TOML file validated into a dataclass; every mistake is one BamctlError line."""

import copy

import pytest

from bamctl.errors import BamctlError
from bamctl.train import PASSKEY_SEED_OFFSET, load_recipe, recipe_from_dict
from bamctl.train.recipe import TEXT_SOURCES

BASE = {
    "name": "unit",
    "description": "a recipe for unit tests",
    "model": {"preset": "micro", "pe": "bam-ssmax", "train_length": 96, "dim": 32, "n_layers": 1, "n_heads": 2},
    "data": {"text": "train", "passkey_fraction": 0.5, "vocab_size": 256},
    "optim": {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.1, "grad_clip": 1.0},
    "schedule": {"warmup_steps": 2, "min_lr_ratio": 0.1},
    "train": {"steps": 6, "batch_size": 2, "seed": 0, "save_every": 2},
}


def edited(path: str, value=None, *, delete: bool = False) -> dict:
    data = copy.deepcopy(BASE)
    *parents, key = path.split(".")
    table = data
    for parent in parents:
        table = table[parent]
    if delete:
        del table[key]
    else:
        table[key] = value
    return data


def test_valid_recipe_round_trips_through_its_dict():
    recipe = recipe_from_dict(BASE)
    assert recipe.model.overrides == {"dim": 32, "n_layers": 1, "n_heads": 2}
    assert recipe.optim.betas == (0.9, 0.95)
    assert recipe.data.passkey_seed_offset == PASSKEY_SEED_OFFSET
    again = recipe_from_dict(recipe.to_dict())
    assert again.to_dict() == recipe.to_dict() and again.fingerprint() == recipe.fingerprint()
    config = recipe.model_config([1, 2, 3])
    assert (config.pe, config.ssmax, config.dim, config.vocab_size, config.train_length) == ("bam", True, 32, 4, 96)


@pytest.mark.parametrize(
    "path, value, message",
    [
        ("model.pe", "bamm", "did you mean bam"),
        ("model.preset", "tinyy", "did you mean tiny"),
        ("model.dimm", 64, "unknown key 'dimm'"),
        ("model.vocab_size", 10, "unknown key 'vocab_size'"),
        ("model.dim", 30, "must split into"),
        ("data.text", "ppl", "text must be one of"),
        ("data.passkey_fraction", 1.5, "passkey_fraction must be in [0, 1]"),
        ("data.passkey_seed_offset", 5, "passkey_seed_offset must be >="),
        ("optim.lr", "fast", "lr must be a number"),
        ("optim.betas", [0.9], "betas must be a list of 2 numbers"),
        ("optim.grad_clipp", 1.0, "did you mean grad_clip"),
        ("train.steps", 0, "steps must be at least 1"),
        ("train.batch_size", 2.5, "batch_size must be an integer"),
        ("schedule.min_lr_ratio", 2.0, "min_lr_ratio"),
        ("optimiser", {}, "unknown key 'optimiser'"),
    ],
)
def test_bad_values_raise_one_line_errors_naming_the_key(path, value, message):
    with pytest.raises(BamctlError) as err:
        recipe_from_dict(edited(path, value), "r.toml")
    assert message in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith("r.toml")


@pytest.mark.parametrize("path", ["name", "optim", "optim.lr", "train.seed", "model.pe", "data.vocab_size"])
def test_missing_fields_are_named(path):
    with pytest.raises(BamctlError, match=path.split(".")[-1]):
        recipe_from_dict(edited(path, delete=True), "r.toml")


def test_retrieval_only_recipes_need_no_text_and_text_none_needs_fraction_one():
    recipe = recipe_from_dict(edited("data", {"text": "none", "passkey_fraction": 1.0, "vocab_size": 128}))
    assert recipe.data.text == "none" and "none" in TEXT_SOURCES
    with pytest.raises(BamctlError, match="retrieval-only"):
        recipe_from_dict(edited("data", {"text": "none", "passkey_fraction": 0.5, "vocab_size": 128}))


def test_overrides_are_validated_and_change_the_fingerprint():
    recipe = recipe_from_dict(BASE)
    assert recipe.with_overrides(steps=10).train.steps == 10
    assert recipe.with_overrides(seed=3).fingerprint() != recipe.fingerprint()
    with pytest.raises(BamctlError, match="steps must be at least 1"):
        recipe.with_overrides(steps=0)


def test_files_load_and_bad_files_fail_in_one_line(tmp_path):
    with pytest.raises(BamctlError, match="not found"):
        load_recipe(tmp_path / "missing.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("name = \n")
    with pytest.raises(BamctlError, match="not valid TOML"):
        load_recipe(broken)


def test_cli_reports_a_bad_recipe_as_one_red_line(tmp_path, capsys):
    from bamctl.cli import main

    path = tmp_path / "bad.toml"
    path.write_text('name = "x"\n[model]\npreset = "micro"\npe = "bamm"\ntrain_length = 96\n')
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--recipe", str(path), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.startswith("error:") and len(err.strip().splitlines()) == 1
