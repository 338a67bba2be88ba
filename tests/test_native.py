"""Our C++ CPU attention kernel against the dense reference, and the engine's use of it."""

import pytest
import torch

from bamctl.checkpoint import new_random_model
from bamctl.engine import native
from bamctl.engine.attention import AttentionInputs, dense_attention
from bamctl.engine.stream import StreamingEngine
from bamctl.errors import BamctlError
from bamctl.model import ModelConfig
from bamctl.positional import GGDPrior

BUILT, WHY = native.native_available()
needs_kernel = pytest.mark.skipif(not BUILT, reason=f"the C++ kernel did not build here: {WHY}")

HEADS, HEAD_DIM = 4, 16


def prior_table(max_distance: int, beta=(-0.5, 1.2)) -> torch.Tensor:
    prior = GGDPrior(HEADS, init="alibi")
    with torch.no_grad():
        prior.theta_beta.copy_(torch.linspace(*beta, HEADS))
        return prior.distance_table(max_distance)


SHAPES = [  # (batch, keys, queries)
    (1, 700, 700),  # a whole prompt: several query blocks of 64 and key blocks of 512
    (2, 900, 300),  # a later chunk, two sequences
    (1, 513, 1),  # one decoding step, one key past a block boundary
    (1, 1000, 129),
    (1, 2000, 1000),  # query blocks of 256
]


@needs_kernel
@pytest.mark.parametrize("batch,keys,queries", SHAPES)
@pytest.mark.parametrize("with_prior,ssmax,scope", [
    (False, False, "logits"), (True, False, "logits"), (False, True, "logits"), (True, True, "logits"), (True, True, "content"),
])
@torch.inference_mode()
def test_native_equals_dense_reference(batch, keys, queries, with_prior, ssmax, scope):
    generator = torch.Generator().manual_seed(keys + queries)
    q = torch.randn(batch, HEADS, queries, HEAD_DIM, generator=generator)
    k, v = (torch.randn(batch, HEADS, keys, HEAD_DIM, generator=generator) for _ in range(2))
    inputs = AttentionInputs(
        q_start=keys - queries,
        bias_table=prior_table(keys) if with_prior else None,
        ssmax_scale=torch.rand(HEADS, generator=generator) + 0.5 if ssmax else None,
        ssmax_scope=scope,
    )
    got, expected = native.native_attention(q, k, v, inputs), dense_attention(q, k, v, inputs)
    assert torch.allclose(got, expected, atol=1e-4, rtol=0), (got - expected).abs().max()


@needs_kernel
@torch.inference_mode()
def test_extreme_priors_stay_finite_and_match():
    # beta = -30 caps the prior at -exp(80) = -5.5e34 near d = 0; beta = 3 sends far keys there.
    q, k, v = (torch.randn(1, HEADS, 600, HEAD_DIM) for _ in range(3))
    for beta in ((-30.0, -2.0), (2.0, 3.0)):
        inputs = AttentionInputs(q_start=0, bias_table=prior_table(600, beta), ssmax_scale=torch.ones(HEADS))
        got, expected = native.native_attention(q, k, v, inputs), dense_attention(q, k, v, inputs)
        assert torch.isfinite(got).all()
        assert torch.allclose(got, expected, atol=1e-4), (beta, (got - expected).abs().max())


def test_with_gradients_asked_for_it_defers_to_the_differentiable_reference():
    table = prior_table(40).requires_grad_()
    q, k, v = (torch.randn(1, HEADS, 40, HEAD_DIM) for _ in range(3))
    native.native_attention(q, k, v, AttentionInputs(q_start=0, bias_table=table, ssmax_scale=None)).sum().backward()
    assert table.grad is not None and table.grad.abs().sum() > 0


@needs_kernel
def test_native_is_the_default_on_cpus():
    model = new_random_model(ModelConfig.from_preset("micro", "bam-ssmax", vocab_size=101), 0)
    assert StreamingEngine(model, device="cpu").attention == "native"


@torch.inference_mode()
def test_a_kernel_that_cannot_be_built_falls_back_to_the_fused_path_with_one_warning(monkeypatch, capsys):
    monkeypatch.setattr(native, "_extension", lambda: "g++: command not found")
    native._warn_fallback.cache_clear()
    q, k, v = (torch.randn(1, HEADS, 50, HEAD_DIM) for _ in range(3))
    inputs = AttentionInputs(q_start=0, bias_table=prior_table(50), ssmax_scale=torch.ones(HEADS))
    for _ in range(2):
        assert torch.allclose(native.native_attention(q, k, v, inputs), dense_attention(q, k, v, inputs), atol=1e-4)
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "g++: command not found" in err and "fused" in err
    model = new_random_model(ModelConfig.from_preset("micro", "bam", vocab_size=101), 0)
    assert StreamingEngine(model, device="cpu").attention == "fused"
    with pytest.raises(BamctlError, match="--attention native is not available: .*g\\+\\+: command not found; use --attention fused"):
        StreamingEngine(model, device="cpu", attention="native")
