"""How the engine uses our C++ kernel; its equality with the reference is in test_cpu_kernels.py."""

import pytest
import torch

from bamctl.checkpoint import new_random_model
from bamctl.engine import native
from bamctl.engine.attention import AttentionInputs, dense_attention
from bamctl.engine.stream import StreamingEngine
from bamctl.errors import BamctlError
from bamctl.model import ModelConfig

from test_cpu_kernels import HEAD_DIM, HEADS, prior_table

BUILT, WHY = native.native_available()
needs_kernel = pytest.mark.skipif(not BUILT, reason=f"the C++ kernel did not build here: {WHY}")

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
