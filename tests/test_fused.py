"""What is particular to the fused CPU path; its equality with the reference is in test_cpu_kernels.py."""

import pytest
import torch

from bamctl.engine import fused
from bamctl.attention_math import AttentionInputs

from test_cpu_kernels import HEAD_DIM, HEADS, prior_table

pytestmark = pytest.mark.skipif(not fused.fused_available()[0], reason="this torch has no fused CPU attention kernel")

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
