"""How the engine uses our C++ kernel; its equality with the reference is in test_cpu_kernels.py."""

import pytest
import torch

from bamctl.checkpoint import new_random_model
from bamctl.engine import native
from bamctl.attention_math import AttentionInputs, dense_attention
from bamctl.engine.stream import StreamingEngine
from bamctl.errors import BamctlError
from bamctl.model import ModelConfig
from bamctl.positional import GGDPrior

from test_cpu_kernels import HEAD_DIM, HEADS, prior_table

BUILT, WHY = native.native_available()
needs_kernel = pytest.mark.skipif(not BUILT, reason=f"the C++ kernel did not build here: {WHY}")

@needs_kernel
def test_native_is_the_default_on_cpus():
    model = new_random_model(ModelConfig.from_preset("micro", "bam-ssmax", vocab_size=101), 0)
    assert StreamingEngine(model, device="cpu").attention == "native"


@torch.inference_mode()
def test_a_kernel_that_cannot_be_built_falls_back_to_the_fused_path_with_one_warning(monkeypatch, capsys, tmp_path, request):
    def no_compiler(config):
        raise RuntimeError("g++: command not found")

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # no finished build here
    monkeypatch.setattr(native, "_compile", no_compiler)
    forget = lambda: (native._extension.cache_clear(), native.native_available.cache_clear())  # noqa: E731
    forget()
    request.addfinalizer(forget)  # later tests find the real kernel again
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


@needs_kernel
@pytest.mark.parametrize("beta,skips", [((1.0, 1.3), True), ((0.0, 0.0), False)])
@torch.inference_mode()
def test_key_blocks_a_steep_prior_zeroes_are_skipped_and_the_result_is_unchanged(beta, skips):
    # A steep prior (alpha = e^-1 per token, beta >= 1) puts far keys below exp(-110) of the
    # nearest ones: those key blocks are never read. A flat prior (beta = 0) skips nothing.
    prior = GGDPrior(HEADS, init="alibi")
    with torch.no_grad():
        prior.theta_beta.copy_(torch.linspace(*beta, HEADS))
        prior.theta_alpha.fill_(-1.0)
        table = prior.distance_table(4096)
    q, k, v = (torch.randn(1, HEADS, n, HEAD_DIM) for n in (1024, 4096, 4096))
    inputs = AttentionInputs(q_start=4096 - 1024, bias_table=table, ssmax_scale=torch.ones(HEADS))
    got, skipped, blocks = native.native_attention_counted(q, k, v, inputs)
    assert blocks > 0 and (skipped > blocks // 2 if skips else skipped == 0)
    assert torch.allclose(got, dense_attention(q, k, v, inputs), atol=1e-4)
