"""The authors' args.json, key by key: every key mapped, inert or refused by name.

Their ``bam_ssmax`` is built from its source layout (``tests/authors_bam_ssmax.py`` restates
their ``models/bam_ssmax.py`` at commit 6002881, which cannot be vendored), saved as their
``train.py`` saves it, and loaded through bamctl: ``ssmax_prior`` decides what SSMax scales.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from authors_bam_ssmax import SSMaxBATModelArgs, SSMaxBATransformer, randomise, save_like_train_py, train_py_args
from bamctl.backends import RunOptions, open_backend
from bamctl.backends.authors import INERT, MAPPED, REFUSED, load_authors_checkpoint
from bamctl.errors import BamctlError
from test_external_authors import _word_tokenizer

VOCAB, LENGTH = 96, 48


def their_model(*, ssmax_prior: bool = True, shared_prior: bool = False, scaled_distance: bool = False, seed: int = 0):
    args = SSMaxBATModelArgs(
        dim=32, n_layers=2, n_heads=4, vocab_size=VOCAB, ffn_dim_multiplier=2, max_seq_len=16, max_batch_size=4,
        train_loc=True, global_positional_encoding=shared_prior, ssmax_prior=ssmax_prior,
    )
    model = SSMaxBATransformer(args, scaled_distance=scaled_distance)
    randomise(model, seed)
    return model


def their_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    """Their forward in float64: what bamctl's float32 logits are held to."""
    with torch.no_grad():
        return copy.deepcopy(model).double()(tokens[None])[0]


TOKENS = torch.randint(0, VOCAB, (LENGTH,), generator=torch.Generator().manual_seed(1))  # past max_seq_len 16


@pytest.mark.parametrize("shared_prior", [False, True], ids=["per-layer-prior", "global-prior"])
@pytest.mark.parametrize("ssmax_prior", [True, False])
def test_ssmax_prior_decides_what_ssmax_scales(tmp_path, ssmax_prior, shared_prior):
    """ssmax_prior true: SSMax scales content score plus prior (our "logits"); false: the content
    score only ("content"). Through ``bam:``, on two attention paths, logits within 1e-5 of their
    forward (float64); the other scope would be off by more than 1 (main's loader took "logits"
    whatever ssmax_prior said)."""
    model = their_model(ssmax_prior=ssmax_prior, shared_prior=shared_prior)
    folder = tmp_path / "run"
    save_like_train_py(model, folder, train_py_args(16, global_prior=shared_prior), prefix="module._orig_mod.")
    expected = their_logits(model, TOKENS)
    other = copy.deepcopy(model)
    for block in other.layers:
        block.attention.ssmax_prior = not ssmax_prior
    assert (their_logits(other, TOKENS) - expected).abs().max() > 1.0

    tokenizer = _word_tokenizer(tmp_path / "tokenizer.json", VOCAB - 2)
    for attention in ("native", "blockwise"):
        backend = open_backend(f"bam:{folder}", RunOptions(device="cpu", chunk_size=7, attention=attention, tokenizer=str(tokenizer)))
        assert backend.engine.model.config.ssmax_scope == ("logits" if ssmax_prior else "content")
        got = backend.engine.logits_at(TOKENS.tolist(), list(range(LENGTH))).double()
        assert (got - expected).abs().max() <= 1e-5, attention


def test_april_2025_bam_ssmax_scales_the_content_with_the_scaled_distance_prior(tmp_path, capsys):
    """Before 2025-04-28 their ModelArgs had no ssmax_prior: SSMax scaled the content score only, and
    the prior was -(|(d - mu) e^alpha| + eps)^beta (their code of commit 1a667fa, restated by the
    fixture's scaled_distance with ssmax_prior false, the field left out of args.json)."""
    model = their_model(ssmax_prior=False, scaled_distance=True)
    save_like_train_py(model, tmp_path / "run", train_py_args(16, global_prior=False), drop=("ssmax_prior",))
    checkpoint = load_authors_checkpoint(tmp_path / "run")
    assert "April 2025" in capsys.readouterr().err
    config = checkpoint.model.config
    assert (config.ssmax_scope, config.bam_prior_form) == ("content", "scaled_distance")
    with torch.no_grad():
        got = checkpoint.model(TOKENS[None])[0].double()
    assert (got - their_logits(model, TOKENS)).abs().max() <= 1e-5


# The fields of every ModelArgs dataclass in their repository's history (models/*.py and
# inference_models/*.py, all commits), restated, and what train.py sets on them: each must be
# classified, in one group only.
THEIR_MODEL_ARGS = [
    "dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "multiple_of", "ffn_dim_multiplier", "norm_eps",
    "max_batch_size", "max_seq_len", "rope_theta", "sinusoidal_theta", "shape_init", "scale_init", "loc_init",
    "train_shape", "train_scale", "train_loc", "thata_beta_init", "theta_alpha_init", "theta_mu_init",
    "train_theta_beta", "train_theta_alpha", "train_theta_mu", "global_positional_encoding", "seq_scale",
    "ssmax_prior", "uniform_heads", "fire_mlp_width", "fire_init_c", "fire_eps", "mlp_width", "dape_mlp_width",
]
# train.py's command-line arguments since it first wrote args.json (2025-03-17), restated.
THEIR_ARGS = [
    "batch_size", "checkpoint", "checkpoint_args", "compile", "dataset", "device", "dtype", "global_prior", "grad_clip",
    "inference_only", "laplace_uniform_heads", "learning_rate", "learning_rate_decay_frac", "loc_init", "loc_lr",
    "loc_trainable", "log_dir", "max_tokens_per_step", "max_val_tokens", "min_tokens_per_step", "min_val_tokens",
    "model_size", "no_seq_scale", "num_iterations", "overfit_single_batch", "position_encoding", "prior_lr",
    "reset_steps", "sample_every", "scale_init", "scale_lr", "scale_trainable", "sequence_length", "shape_init",
    "shape_lr", "shape_trainable", "tensorcores", "thata_beta_init", "theta_alpha_init", "theta_alpha_trainable",
    "theta_beta_trainable", "theta_mu_init", "theta_mu_trainable", "tokens_per_step", "val_loss_every", "val_tokens",
    "val_tokens_padding", "warmup_iters", "weight_decay",
]


@pytest.mark.parametrize("section, keys", [("model_args", THEIR_MODEL_ARGS), ("args", THEIR_ARGS)])
def test_every_key_of_their_history_is_mapped_inert_or_refused(section, keys):
    groups = {"mapped": MAPPED[section], "inert": INERT[section], "refused": REFUSED[section]}
    for key in keys:
        assert sum(key in group for group in groups.values()) == 1, (section, key)
    for name, group in groups.items():
        assert all(isinstance(why, str) and why for why in group.values()), name  # each says why
    assert set().union(*groups.values()) == set(keys)  # nothing listed that their code never wrote


def _saved(tmp_path, **changes):
    """Their model saved as train.py does, then args.json edited: {"model_args.key": value, ...}."""
    folder = tmp_path / "run"
    save_like_train_py(their_model(), folder, train_py_args(16, global_prior=False))
    data = json.loads((folder / "args.json").read_text())
    for where, value in changes.items():
        section, _, key = where.partition(".")
        if key:
            data[section][key] = value
        else:
            data[section] = value
    (folder / "args.json").write_text(json.dumps(data))
    return folder


def _refusal(folder) -> str:
    with pytest.raises(BamctlError) as err:
        load_authors_checkpoint(folder)
    assert "\n" not in str(err.value)  # one readable line
    return str(err.value)


@pytest.mark.parametrize("where", ["model_args.rope_scaling_factor", "args.attention_window", "extra_section"])
def test_unknown_keys_are_refused_by_name(tmp_path, where):
    """Main's loader ignored them; one might change the forward pass in code bamctl has not read."""
    message = _refusal(_saved(tmp_path, **{where: 4}))
    assert where.rpartition(".")[2] in message


@pytest.mark.parametrize("key, value", [("uniform_heads", 2), ("mlp_width", 32), ("dape_mlp_width", 32), ("fire_mlp_width", 32)])
def test_keys_bamctl_cannot_honour_are_refused_by_name(tmp_path, key, value):
    message = _refusal(_saved(tmp_path, **{f"model_args.{key}": value}))
    assert f"model_args.{key}" in message and REFUSED["model_args"][key] in message


def test_inert_keys_leave_the_model_alone(tmp_path):
    """Initial values, train flags, batch sizes and training switches: same config, same logits."""
    base = load_authors_checkpoint(_saved(tmp_path / "a"))
    changed = load_authors_checkpoint(_saved(
        tmp_path / "b", **{"model_args.shape_init": "linear", "model_args.scale_init": 7, "model_args.train_shape": False,
                           "model_args.seq_scale": False, "model_args.max_batch_size": 512, "args.dtype": "float32",
                           "args.compile": False, "args.learning_rate": 3.0, "args.no_seq_scale": True}))
    assert changed.model.config == base.model.config and changed.model_hash == base.model_hash
    with torch.no_grad():
        assert torch.equal(changed.model(TOKENS[None]), base.model(TOKENS[None]))


def test_a_shared_prior_must_be_where_args_json_says(tmp_path):
    """Their load_state_dict fails on the other layout; bamctl says which key disagrees with model.pt."""
    message = _refusal(_saved(tmp_path, **{"model_args.global_positional_encoding": True}))
    assert "model_args.global_positional_encoding = True" in message and "a prior in each layer" in message


def test_their_swiglu_width_is_checked(tmp_path):
    message = _refusal(_saved(tmp_path, **{"model_args.ffn_dim_multiplier": 3}))
    assert "SwiGLU width of 96" in message and "64" in message
