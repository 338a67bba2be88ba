"""SSMax with a learned bias per head: c_h(i) = s_h log(i + 1) + b_h (the SSMax paper's variant, ``ssmax_bias``).

The dense reference is held to the formula restated here by hand; every kernel to the dense
reference; the model to its own full forward through the streaming engine; the bias trains as a
positional parameter and travels with the checkpoint."""

from __future__ import annotations

import math

import pytest
import torch

from bamctl.attention_math import AttentionInputs, attention_weights, dense_attention
from bamctl.checkpoint import load_checkpoint, new_random_model, save_checkpoint
from bamctl.engine import fused, native, stream
from bamctl.engine.attention import blockwise_attention
from bamctl.errors import BamctlError
from bamctl.model import ModelConfig

HEADS, HEAD_DIM = 4, 16


def _inputs(keys: int, queries: int, generator, scope: str = "logits", with_prior: bool = True) -> AttentionInputs:
    table = -torch.rand(HEADS, keys + 1, generator=generator).cumsum(-1) * 0.05 if with_prior else None
    return AttentionInputs(q_start=keys - queries, bias_table=table, ssmax_scale=torch.rand(HEADS, generator=generator) * 0.5,
                           ssmax_bias=torch.rand(HEADS, generator=generator) + 0.1, ssmax_scope=scope)


@pytest.mark.parametrize("scope", ["logits", "content"])
def test_the_dense_weights_are_the_papers_formula_with_the_bias(scope):
    """softmax_j of (q·k/√d + b(i - j)) · (s log(i + 1) + b_h) over j <= i ("logits"), or of
    q·k/√d · (s log(i + 1) + b_h) + b(i - j) ("content"), written out one query at a time."""
    generator = torch.Generator().manual_seed(0)
    keys, queries = 40, 7
    q = torch.randn(1, HEADS, queries, HEAD_DIM, generator=generator)
    k = torch.randn(1, HEADS, keys, HEAD_DIM, generator=generator)
    inputs = _inputs(keys, queries, generator, scope)
    got = attention_weights(q, k, inputs)[0]
    for h in range(HEADS):
        for r in range(queries):
            i = inputs.q_start + r
            factor = float(inputs.ssmax_scale[h]) * math.log(i + 1) + float(inputs.ssmax_bias[h])
            logits = []
            for j in range(i + 1):
                content = float(q[0, h, r] @ k[0, h, j]) / math.sqrt(HEAD_DIM)
                prior = float(inputs.bias_table[h, i - j])
                logits.append((content + prior) * factor if scope == "logits" else content * factor + prior)
            expected = torch.softmax(torch.tensor(logits, dtype=torch.float64), 0)
            assert torch.allclose(got[h, r, : i + 1].double(), expected, atol=1e-6)
            assert float(got[h, r, i + 1 :].abs().sum()) == 0.0


def _kernels():
    yield "blockwise", blockwise_attention
    for name, available, kernel in (("fused", fused.fused_available, fused.fused_attention),
                                    ("native", native.native_available, native.native_attention)):
        ok, why = available()
        yield pytest.param(name, kernel, marks=pytest.mark.skipif(not ok, reason=why or f"{name} unavailable"))


@pytest.mark.parametrize("name, kernel", list(_kernels()))
@pytest.mark.parametrize("keys, queries", [(700, 700), (900, 300), (513, 1)])
@pytest.mark.parametrize("scope", ["logits", "content"])
@torch.inference_mode()
def test_every_kernel_takes_the_bias_as_the_dense_reference_does(name, kernel, keys, queries, scope):
    generator = torch.Generator().manual_seed(keys + queries)
    q = torch.randn(2, HEADS, queries, HEAD_DIM, generator=generator)
    k, v = (torch.randn(2, HEADS, keys, HEAD_DIM, generator=generator) for _ in range(2))
    inputs = _inputs(keys, queries, generator, scope)
    expected = dense_attention(q, k, v, inputs)
    without = dense_attention(q, k, v, AttentionInputs(**{**inputs.__dict__, "ssmax_bias": None}))
    assert (expected - without).abs().max() > 1e-3  # the bias changes the output
    assert torch.allclose(kernel(q, k, v, inputs), expected, atol=1e-4, rtol=0)


def test_the_flex_path_takes_the_bias(eager_flex, monkeypatch):
    from bamctl.engine import flex

    monkeypatch.setattr(flex, "blockwise_attention", None)  # flex itself, not its fallback

    generator = torch.Generator().manual_seed(3)
    q = torch.randn(1, HEADS, 256, HEAD_DIM, generator=generator)
    k, v = (torch.randn(1, HEADS, 512, HEAD_DIM, generator=generator) for _ in range(2))
    inputs = _inputs(512, 256, generator)
    got = flex.flex_attention_kernel(q, k, v, inputs, block_skip="off")
    assert torch.allclose(got, dense_attention(q, k, v, inputs), atol=1e-4, rtol=0)


def _bias_model(seed: int = 0):
    config = ModelConfig.from_preset("micro", "bam-ssmax", train_length=64, ssmax_bias=True)
    model = new_random_model(config, seed)
    with torch.no_grad():
        for attention in (block.attention for block in model.layers):
            attention.ssmax_bias.copy_(torch.linspace(0.2, 0.8, config.n_heads))
    return model


def test_a_model_with_the_bias_streams_in_chunks_as_its_one_forward():
    model = _bias_model()
    ids = torch.randint(0, model.config.vocab_size, (300,), generator=torch.Generator().manual_seed(0)).tolist()
    reference = model(torch.tensor([ids]))[0]
    for path in ("blockwise", *(["native"] if native.native_available()[0] else [])):
        engine = stream.StreamingEngine(model, device="cpu", attention=path, chunk_size=70)
        assert torch.allclose(engine.logits_at(ids, list(range(300))), reference, atol=1e-4), path


def test_the_bias_trains_as_a_positional_parameter_and_is_saved_with_the_weights(tmp_path):
    model = _bias_model()
    positional = {id(p) for p in model.positional_parameters()}
    biases = [block.attention.ssmax_bias for block in model.layers]
    assert all(id(b) in positional for b in biases)  # no weight decay, the positional learning rate
    ids = torch.randint(0, model.config.vocab_size, (1, 50), generator=torch.Generator().manual_seed(1))
    model(ids).logsumexp(-1).sum().backward()
    assert all(b.grad is not None and b.grad.abs().sum() > 0 for b in biases)
    with torch.no_grad():
        biases[0].add_(0.5)
    loaded = load_checkpoint(save_checkpoint(model, tmp_path / "m")).model
    assert loaded.config.ssmax_bias
    assert torch.equal(loaded.layers[0].attention.ssmax_bias, biases[0].detach())
    assert torch.allclose(loaded(ids), model(ids), atol=1e-5)
    assert ModelConfig.from_preset("micro", "bam-ssmax").ssmax_bias is False  # off unless asked
    # the weights say whether there is a bias (a tensor per layer, or none): every model saved before
    # the field keeps its identity, and one with the bias differs from one without by its weights
    from bamctl.checkpoint import canonical_config

    assert "ssmax_bias" not in canonical_config(loaded.config)
    plain = save_checkpoint(new_random_model(ModelConfig.from_preset("micro", "bam-ssmax", train_length=64), 0),
                            tmp_path / "plain")
    assert load_checkpoint(plain).model_hash != load_checkpoint(tmp_path / "m").model_hash
    assert new_random_model(ModelConfig.from_preset("micro", "bam-ssmax"), 0).layers[0].attention.ssmax_bias is None


def test_the_bias_needs_ssmax_and_a_negative_one_keeps_off_the_folding_kernels():
    with pytest.raises(BamctlError, match="ssmax_bias is a part of SSMax's factor: it needs ssmax = true"):
        ModelConfig.from_preset("micro", "bam", ssmax_bias=True)
    model = _bias_model()
    for path in stream.FOLDING_PATHS:
        stream.StreamingEngine(model, device="cpu", attention=path)  # b >= 0, s >= 0: the factor stays >= 0
    with torch.no_grad():
        model.layers[1].attention.ssmax_bias[2] = -0.25  # the factor is negative at position 0
    for path in stream.FOLDING_PATHS:
        with pytest.raises(BamctlError, match=r"negative SSMax scale that multiplies its prior \(layer 1, head 2: b = -0.25\)"):
            stream.StreamingEngine(model, device="cpu", attention=path)
