"""A model asked for what it was never trained on says so before the run: a passkey-only model's perplexity."""

from __future__ import annotations

import pytest

from bamctl.checkpoint import new_random_model, save_checkpoint
from bamctl.cli import main
from bamctl.runs.training_kind import PASSKEY_ONLY, TEXT, mismatch_warnings, trained_on
from bamctl.model import ModelConfig

PASSKEY_RECIPE = {"data": {"text": "none", "passkey_fraction": 1.0}}
TEXT_RECIPE = {"data": {"text": "train-shakespeare", "passkey_fraction": 0.0}}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("kinds")
    config = ModelConfig.from_preset("micro", "bam", train_length=128)
    return {
        "passkey": str(save_checkpoint(new_random_model(config, 0), root / "pk", recipe=PASSKEY_RECIPE)),
        "text": str(save_checkpoint(new_random_model(config, 0), root / "lm", recipe=TEXT_RECIPE)),
        "none": str(save_checkpoint(new_random_model(config, 0), root / "plain")),
    }


def test_the_kind_is_read_from_the_recipe(models):
    assert trained_on(models["passkey"]) == PASSKEY_ONLY
    assert trained_on(models["text"]) == TEXT
    assert trained_on(models["none"]) is None  # no recipe: nothing to say
    assert trained_on("hf:/nowhere") is None
    assert trained_on("bam") == PASSKEY_ONLY and trained_on("lm-bam") == TEXT  # the catalog's references


def test_only_a_task_the_kind_was_not_trained_for_warns(models):
    names = ["pk", "lm"]
    pair = [models["passkey"], models["text"]]
    assert mismatch_warnings(pair, names, ["passkey"]) == []
    lines = mismatch_warnings(pair, names, ["ppl"])
    assert len(lines) == 1 and lines[0].startswith("warning: pk was trained on synthetic passkey prompts only")
    assert "ppl" in lines[0]
    assert "niah_single_1" in mismatch_warnings(pair, names, ["niah_single_1"])[0]


def test_perplexity_of_a_passkey_only_model_warns_once_before_the_table(models, tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        main(["ppl", models["passkey"], "--lengths", "128", "--dir", str(tmp_path), "--quiet"])
    captured = capsys.readouterr()
    assert done.value.code == 0, captured.err
    assert captured.err.count("never as a language model") == 1
    with pytest.raises(SystemExit):
        main(["ppl", models["text"], "--lengths", "128", "--dir", str(tmp_path), "--quiet"])
    assert "warning" not in capsys.readouterr().err
