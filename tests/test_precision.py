"""Under ``--dtype bfloat16`` the priors keep their float32 values, as under the authors' autocast.

Autocast never casts parameters: their priors (theta, the prior table, SSMax scales) are read
at full precision while the matmuls run in bfloat16. The engine must cast the rest of the
model and leave these alone; casting them to bfloat16 and back rounds them (by up to 0.0078
in theta_mu near 3), and the attention of a sharp prior moves with that.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bamctl.backends.authors import load_authors_checkpoint
from bamctl.checkpoint import new_random_model
from bamctl.engine.stream import StreamingEngine
from bamctl.model import ModelConfig
from bamctl.positional import PE_REGISTRY
from test_external_authors import DIM, HEADS, LAYERS, VOCAB, reference_logits, their_state_dict, write_checkpoint

PRIOR_PES = [name for name, spec in PE_REGISTRY.items() if spec.gives_bias]


def _positional(name: str) -> bool:
    return ".prior." in name or name.endswith("ssmax_scale")


def _not_bfloat16(t: torch.Tensor) -> bool:
    return not torch.equal(t, t.bfloat16().float())


@pytest.mark.parametrize("pe", PRIOR_PES)
def test_priors_keep_their_float32_bits_under_bfloat16(pe):
    """Every prior parameter and buffer, the prior's distance table and the SSMax scales equal the
    checkpoint's float32 values bit for bit; the rest of the model is bfloat16."""
    model = new_random_model(ModelConfig(pe=pe, ssmax=True, vocab_size=64, dim=32, n_heads=4, n_layers=2), seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # values bfloat16 cannot hold, so that rounding would show
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if _positional(name) and t.is_floating_point():
                t.add_(torch.rand(t.shape, generator=g) * 1e-2 + 1e-3)
    saved = {name: t.clone() for name, t in [*model.named_parameters(), *model.named_buffers()]}
    assert any(_not_bfloat16(t) for name, t in saved.items() if _positional(name))
    tables = {i: layer.attention.prior.distance_table(4095).clone() for i, layer in enumerate(model.layers)
              if not getattr(layer.attention.prior, "query_dependent", False)}

    engine = StreamingEngine(model, device="cpu", dtype="bfloat16", attention="blockwise")

    for name, t in [*engine.model.named_parameters(), *engine.model.named_buffers()]:
        if _positional(name):
            assert t.dtype == saved[name].dtype and torch.equal(t, saved[name]), name
        elif saved[name].is_floating_point():
            assert t.dtype == torch.bfloat16, name
    for i, table in tables.items():
        assert torch.equal(engine.model.layers[i].attention.prior.distance_table(4095), table)


def test_log_probs_follow_the_float32_prior(tmp_path):
    """An authors' bam_ssmax checkpoint whose priors peak ~20 tokens back, sharply, at theta_mu
    values bfloat16 rounds by 0.002-0.0075: our bfloat16 log-probs stay within 0.3 nats of their
    float32 forward (``reference_logits``, restated from their formulas) with weights rounded to
    bfloat16 and priors not. Rounding the priors moves log-probs by more than 1 nat."""
    state = their_state_dict("bam_ssmax", seed=0, hidden=2 * DIM)
    mu = torch.tensor([-3.0075, -2.5037, -2.0035, -1.5019]).reshape(HEADS, 1)
    for layer in range(LAYERS):
        p = f"layers.{layer}.attention.prior."
        state[p + "theta_mu"], state[p + "theta_alpha"], state[p + "theta_beta"] = mu, torch.full((HEADS, 1), 1.5), torch.full((HEADS, 1), 2.0)
    state = {k: v if "prior" in k or "seq_scale" in k else v.bfloat16().float() for k, v in state.items()}
    assert _not_bfloat16(mu)
    model_args = write_checkpoint(tmp_path / "c", "bam_ssmax", state)
    tokens = torch.randint(0, VOCAB, (64,), generator=torch.Generator().manual_seed(4))

    def log_probs(logits: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(logits.float(), -1)[:-1].gather(1, tokens[1:, None])[:, 0]

    expected = log_probs(reference_logits("bam_ssmax", state, model_args, tokens))
    rounded = {k: v.bfloat16().float() if "prior" in k or "seq_scale" in k else v for k, v in state.items()}
    assert (log_probs(reference_logits("bam_ssmax", rounded, model_args, tokens)) - expected).abs().max() > 1.0
    for attention in ("blockwise", "native"):
        model = load_authors_checkpoint(tmp_path / "c").model
        engine = StreamingEngine(model, device="cpu", dtype="bfloat16", chunk_size=16, attention=attention)
        got = log_probs(engine.logits_at(tokens.tolist(), list(range(len(tokens)))))
        assert (got - expected).abs().max() < 0.3, attention


def test_authors_backends_keep_the_checkpoints_float32_priors(tmp_path):
    """A bare authors' folder and ``bam:`` open the same engine: their priors keep the bits of model.pt."""
    from bamctl.backends import RunOptions, open_backend
    from test_external_authors import _word_tokenizer, build

    folder, _, state, _ = build(tmp_path, "bam_ssmax")
    tokenizer = _word_tokenizer(tmp_path / "tokenizer.json", VOCAB - 2)
    for reference in (str(folder), f"bam:{folder}"):
        backend = open_backend(reference, RunOptions(device="cpu", dtype="bfloat16", tokenizer=str(tokenizer)))
        for layer, block in enumerate(backend.engine.model.layers):
            attention = block.attention
            for name in ("theta_alpha", "theta_beta", "theta_mu"):
                assert torch.equal(getattr(attention.prior, name), state[f"layers.{layer}.attention.prior.{name}"].reshape(-1))
            assert torch.equal(attention.ssmax_scale, state[f"layers.{layer}.attention.seq_scale"].reshape(-1))
            assert attention.wq.weight.dtype == torch.bfloat16
