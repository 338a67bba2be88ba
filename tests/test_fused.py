"""The fused CPU path (torch's flash kernel fed a strided prior mask) against the dense reference."""

import pytest
import torch

from bamctl.engine import fused
from bamctl.engine.attention import AttentionInputs, dense_attention
from bamctl.positional import GGDPrior

pytestmark = pytest.mark.skipif(not fused.fused_available()[0], reason="this torch has no fused CPU attention kernel")

HEADS, HEAD_DIM = 4, 16


def prior_table(max_distance: int) -> torch.Tensor:
    """A GGD prior with heads from decaying to sharpening (beta -0.5 .. 1.2), as trained models have."""
    prior = GGDPrior(HEADS, init="alibi")
    with torch.no_grad():
        prior.theta_beta.copy_(torch.linspace(-0.5, 1.2, HEADS))
        return prior.distance_table(max_distance)


SHAPES = [  # (batch, keys, queries): a whole prompt, a later chunk, one decoding step, an odd block
    (1, 700, 700),
    (2, 900, 300),
    (1, 513, 1),
    (1, 1000, 129),
]
BLOCKING = [{}, {"rows": 64, "tile": 100}, {"rows": 7, "tile": 5}]  # defaults, and small enough to split


@pytest.mark.parametrize("batch,keys,queries", SHAPES)
@pytest.mark.parametrize("with_prior,ssmax,scope", [
    (False, False, "logits"), (True, False, "logits"), (False, True, "logits"), (True, True, "logits"), (True, True, "content"),
])
@torch.inference_mode()
def test_fused_equals_dense_reference(batch, keys, queries, with_prior, ssmax, scope):
    generator = torch.Generator().manual_seed(keys + queries)
    q = torch.randn(batch, HEADS, queries, HEAD_DIM, generator=generator)
    k, v = (torch.randn(batch, HEADS, keys, HEAD_DIM, generator=generator) for _ in range(2))
    inputs = AttentionInputs(
        q_start=keys - queries,
        bias_table=prior_table(keys) if with_prior else None,
        ssmax_scale=torch.rand(HEADS, generator=generator) + 0.5 if ssmax else None,
        ssmax_scope=scope,
    )
    expected = dense_attention(q, k, v, inputs)
    for blocking in BLOCKING:
        got = fused.fused_attention(q, k, v, inputs, **blocking)
        assert torch.allclose(got, expected, atol=1e-4, rtol=0), (blocking, (got - expected).abs().max())


@torch.inference_mode()
def test_a_query_at_position_zero_with_ssmax_over_the_logits_stays_finite():
    # c(0) = s * log(1) = 0 scales the whole first row to 0; 0 * a masked logit must not become NaN.
    q, k, v = (torch.randn(1, HEADS, 3, HEAD_DIM) for _ in range(3))
    inputs = AttentionInputs(q_start=0, bias_table=prior_table(3), ssmax_scale=torch.ones(HEADS))
    got = fused.fused_attention(q, k, v, inputs)
    assert torch.isfinite(got).all()
    assert torch.allclose(got[:, :, 0], v[:, :, 0], atol=1e-6)  # the first query sees only itself
    assert torch.allclose(got, dense_attention(q, k, v, inputs), atol=1e-5)


def test_with_gradients_asked_for_it_falls_back_to_a_differentiable_path():
    # The fused kernel has no backward for its mask; training must still get gradients.
    table = prior_table(40).requires_grad_()
    q, k, v = (torch.randn(1, HEADS, 40, HEAD_DIM) for _ in range(3))
    out = fused.fused_attention(q, k, v, AttentionInputs(q_start=0, bias_table=table, ssmax_scale=None))
    out.sum().backward()
    assert table.grad is not None and torch.isfinite(table.grad).all() and table.grad.abs().sum() > 0


@torch.inference_mode()
def test_the_prior_mask_is_a_view_not_a_copy(monkeypatch):
    # The point of the path: the (rows x keys) prior mask is a strided view of one line per
    # head, never a materialised matrix (except the logits-scope tiles, bounded by TILE_BYTES).
    seen = []
    real = fused._flash

    def spy(q, k, v, mask, causal, scale):
        if mask is not None and not causal:
            seen.append((mask.shape, mask.untyped_storage().nbytes()))
        return real(q, k, v, mask, causal, scale)

    monkeypatch.setattr(fused, "_flash", spy)
    q, k, v = (torch.randn(1, HEADS, n, HEAD_DIM) for n in (256, 4096, 4096))
    inputs = AttentionInputs(q_start=4096 - 256, bias_table=prior_table(4096), ssmax_scale=torch.ones(HEADS), ssmax_scope="content")
    fused.fused_attention(q, k, v, inputs)
    (shape, nbytes), = seen
    assert shape == (1, HEADS, 256, 4096 - 256)
    assert nbytes <= 4 * HEADS * (256 + 4096)  # rows + keys floats per head, not rows x keys
