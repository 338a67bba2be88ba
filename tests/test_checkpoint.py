"""Checkpoint directories: bit-exact round trip, and refusal of damaged files."""

import json

import pytest
import torch

from bamctl.checkpoint import WEIGHTS_FILE, load_checkpoint, model_identity, new_random_model, save_checkpoint
from bamctl.errors import BamctlError
from bamctl.model import ModelConfig


@pytest.mark.parametrize("pe", ["bam-ssmax", "rope", "alibi", "sinusoidal"])
def test_save_load_round_trip_is_bit_exact(tmp_path, pe):
    model = new_random_model(ModelConfig.from_preset("micro", pe, vocab_size=64, train_length=128), seed=7)
    save_checkpoint(model, tmp_path / "ckpt", recipe={"kind": "test"})
    loaded = load_checkpoint(tmp_path / "ckpt")
    assert loaded.model.config == model.config
    assert loaded.recipe == {"kind": "test"}
    original, restored = model.state_dict(), loaded.model.state_dict()
    assert original.keys() == restored.keys()
    for name in original:
        assert torch.equal(original[name], restored[name]), name
    ids = torch.randint(0, 64, (1, 20))
    assert torch.equal(model(ids), loaded.model(ids))


def test_float16_checkpoint_is_half_the_size_and_loads_as_float32(tmp_path):
    model = new_random_model(ModelConfig.from_preset("micro", "bam-ssmax", vocab_size=64, train_length=128), seed=7)
    save_checkpoint(model, tmp_path / "full")
    save_checkpoint(model, tmp_path / "half", dtype="float16")
    full, half = ((tmp_path / d / WEIGHTS_FILE).stat().st_size for d in ("full", "half"))
    assert half < 0.55 * full
    loaded = load_checkpoint(tmp_path / "half").model
    for name, tensor in loaded.state_dict().items():
        assert tensor.dtype == torch.float32
        assert torch.equal(tensor, model.state_dict()[name].half().float()), name


def test_a_tied_head_is_one_tensor_stored_once(tmp_path):
    untied = new_random_model(ModelConfig.from_preset("micro", "rope", vocab_size=2000, train_length=128), seed=3)
    tied = new_random_model(ModelConfig.from_preset("micro", "rope", vocab_size=2000, train_length=128, tie_embeddings=True), seed=3)
    assert tied.output.weight is tied.tok_embeddings.weight
    # the weights file tells a tied model from an untied one; the field adds nothing to the identity
    assert model_identity("w", tied.config) == model_identity("w", untied.config)
    assert untied.n_params() - tied.n_params() == 2000 * 64  # the (V, C) head is gone
    for name, model in (("untied", untied), ("tied", tied)):
        save_checkpoint(model, tmp_path / name, dtype="float16")
    from safetensors import safe_open

    with safe_open(tmp_path / "tied" / WEIGHTS_FILE, "pt") as stored:
        assert "output.weight" not in stored.keys() and "tok_embeddings.weight" in stored.keys()
    sizes = {name: (tmp_path / name / WEIGHTS_FILE).stat().st_size for name in ("untied", "tied")}
    assert sizes["untied"] - sizes["tied"] >= 2000 * 64 * 2  # the head's float16 bytes
    loaded = load_checkpoint(tmp_path / "tied").model
    assert loaded.output.weight is loaded.tok_embeddings.weight
    ids = torch.randint(0, 2000, (1, 30))
    assert torch.equal(loaded(ids), tied.cast_keeping_positional(torch.float16).float()(ids))


def test_a_tied_checkpoint_that_also_stores_the_head_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    model = new_random_model(ModelConfig.from_preset("micro", "rope", vocab_size=64, train_length=128, tie_embeddings=True), 0)
    save_checkpoint(model, tmp_path / "ckpt")
    weights = tmp_path / "ckpt" / WEIGHTS_FILE
    state = load_file(weights)
    save_file({**state, "output.weight": torch.zeros_like(state["tok_embeddings.weight"])}, weights)
    with pytest.raises(BamctlError, match="also stores output.weight"):
        load_checkpoint(tmp_path / "ckpt", verify=False)


def test_same_seed_same_weights_different_seed_different():
    config = ModelConfig.from_preset("micro", "bam", vocab_size=64)
    a, b, c = (new_random_model(config, s).state_dict() for s in (1, 1, 2))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["tok_embeddings.weight"], c["tok_embeddings.weight"])


def test_corrupted_weights_are_refused(tmp_path):
    model = new_random_model(ModelConfig.from_preset("micro", "bam", vocab_size=64), seed=0)
    path = save_checkpoint(model, tmp_path / "ckpt")
    weights = path / WEIGHTS_FILE
    data = bytearray(weights.read_bytes())
    data[-10] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(BamctlError, match="corrupt"):
        load_checkpoint(path)


def test_truncated_config_is_refused(tmp_path):
    model = new_random_model(ModelConfig.from_preset("micro", "bam", vocab_size=64), seed=0)
    path = save_checkpoint(model, tmp_path / "ckpt")
    (path / "config.json").write_text(json.dumps({"format": "bamctl-checkpoint/1"})[:20])
    with pytest.raises(BamctlError, match="not valid JSON"):
        load_checkpoint(path)


def test_missing_directory_is_refused(tmp_path):
    with pytest.raises(BamctlError, match="not a bamctl checkpoint"):
        load_checkpoint(tmp_path / "nothing")


def test_ssmax_init_sets_s_before_training_and_is_not_the_models_identity():
    from bamctl.checkpoint import model_identity

    base = ModelConfig.from_preset("micro", "bam-ssmax", train_length=128)
    other = ModelConfig.from_preset("micro", "bam-ssmax", train_length=128, ssmax_init=0.25)
    model = new_random_model(other, 0)
    assert all(torch.equal(layer.attention.ssmax_scale.detach(), torch.full((4,), 0.25)) for layer in model.layers)
    # The same weights under either config are one model: the field says how s started, the weights hold s.
    assert model_identity("w", base) == model_identity("w", other)
    # ... and every other weight starts as it did before the field existed (no random draw added).
    plain = new_random_model(base, 0)
    assert all(torch.equal(a, b) for (name, a), (_, b) in zip(plain.state_dict().items(), model.state_dict().items())
               if not name.endswith("ssmax_scale"))
    with pytest.raises(BamctlError, match="ssmax_init must be positive"):
        ModelConfig.from_preset("micro", "bam-ssmax", ssmax_init=0.0)
