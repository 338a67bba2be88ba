"""The two fast CPU paths against the dense reference, on the same cases.

- ``fused``: torch's flash kernel fed the prior as a strided mask (bamctl.engine.fused);
  run at its defaults and with blocks small enough that every split and merge happens.
- ``native``: our C++ kernel (bamctl.engine.native).
"""

from functools import partial

import pytest
import torch

from bamctl.engine import fused, native
from bamctl.attention_math import AttentionInputs, dense_attention
from bamctl.positional import GGDPrior

HEADS, HEAD_DIM = 4, 16


def prior_table(max_distance: int, beta=(-0.5, 1.2)) -> torch.Tensor:
    """A GGD prior with heads from decaying to sharpening (beta -0.5 .. 1.2 by default), as trained models have."""
    prior = GGDPrior(HEADS, init="alibi")
    with torch.no_grad():
        prior.theta_beta.copy_(torch.linspace(*beta, HEADS))
        return prior.distance_table(max_distance)


def _available(name):
    ok, why = {"fused": fused.fused_available, "native": native.native_available}[name]()
    return pytest.param(name, marks=pytest.mark.skipif(not ok, reason=why or "unavailable"))


KERNELS = {
    "fused": [fused.fused_attention, partial(fused.fused_attention, rows=64, tile=100), partial(fused.fused_attention, rows=7, tile=5)],
    "native": [native.native_attention],
}
SHAPES = [  # (batch, keys, queries)
    (1, 700, 700),  # a whole prompt
    (2, 900, 300),  # a later chunk, two sequences
    (1, 513, 1),  # one decoding step, one key past a block boundary
    (1, 1000, 129),
    (1, 2000, 1000),  # the native kernel's query blocks of 256
]
CASES = [  # (with_prior, ssmax, scope)
    (False, False, "logits"), (True, False, "logits"), (False, True, "logits"), (True, True, "logits"), (True, True, "content"),
]


def _inputs(keys, queries, with_prior, ssmax, scope, generator, table=None):
    return AttentionInputs(
        q_start=keys - queries,
        bias_table=(table if table is not None else prior_table(keys)) if with_prior else None,
        ssmax_scale=torch.rand(HEADS, generator=generator) + 0.5 if ssmax else None,
        ssmax_scope=scope,
    )


@pytest.mark.parametrize("kernel", [_available("fused"), _available("native")])
@pytest.mark.parametrize("batch,keys,queries", SHAPES)
@pytest.mark.parametrize("with_prior,ssmax,scope", CASES)
@torch.inference_mode()
def test_equals_dense_reference(kernel, batch, keys, queries, with_prior, ssmax, scope):
    generator = torch.Generator().manual_seed(keys + queries)
    q = torch.randn(batch, HEADS, queries, HEAD_DIM, generator=generator)
    k, v = (torch.randn(batch, HEADS, keys, HEAD_DIM, generator=generator) for _ in range(2))
    inputs = _inputs(keys, queries, with_prior, ssmax, scope, generator)
    expected = dense_attention(q, k, v, inputs)
    for variant in KERNELS[kernel]:
        got = variant(q, k, v, inputs)
        assert torch.allclose(got, expected, atol=1e-4, rtol=0), (variant, (got - expected).abs().max())


@pytest.mark.parametrize("kernel", [_available("fused"), _available("native")])
@torch.inference_mode()
def test_a_query_at_position_zero_with_ssmax_over_the_logits_stays_finite(kernel):
    # c(0) = s * log(1) = 0 scales the whole first row to 0; 0 * a masked logit must not become NaN.
    q, k, v = (torch.randn(1, HEADS, 3, HEAD_DIM) for _ in range(3))
    inputs = AttentionInputs(q_start=0, bias_table=prior_table(3), ssmax_scale=torch.ones(HEADS))
    got = KERNELS[kernel][0](q, k, v, inputs)
    assert torch.isfinite(got).all()
    assert torch.allclose(got[:, :, 0], v[:, :, 0], atol=1e-6)  # the first query sees only itself
    assert torch.allclose(got, dense_attention(q, k, v, inputs), atol=1e-5)


@pytest.mark.parametrize("kernel", [_available("fused"), _available("native")])
@torch.inference_mode()
def test_extreme_priors_stay_finite_and_match(kernel):
    # beta = -30 caps the prior at -exp(80) = -5.5e34 near d = 0; beta = 3 sends far keys there.
    q, k, v = (torch.randn(1, HEADS, 600, HEAD_DIM) for _ in range(3))
    for beta in ((-30.0, -2.0), (2.0, 3.0)):
        inputs = AttentionInputs(q_start=0, bias_table=prior_table(600, beta), ssmax_scale=torch.ones(HEADS))
        got, expected = KERNELS[kernel][0](q, k, v, inputs), dense_attention(q, k, v, inputs)
        assert torch.isfinite(got).all()
        assert torch.allclose(got, expected, atol=1e-4), (beta, (got - expected).abs().max())


@pytest.mark.parametrize("kernel", ["fused", "native"])
def test_with_gradients_asked_for_they_defer_to_the_differentiable_reference(kernel):
    table = prior_table(40).requires_grad_()
    q, k, v = (torch.randn(1, HEADS, 40, HEAD_DIM) for _ in range(3))
    KERNELS[kernel][0](q, k, v, AttentionInputs(q_start=0, bias_table=table, ssmax_scale=None)).sum().backward()
    assert table.grad is not None and torch.isfinite(table.grad).all() and table.grad.abs().sum() > 0
