"""The CUDA path: attention kernels, ``auto``, an authors' checkpoint, bfloat16 and autocast, on a GPU.

Marked ``cuda`` (excluded from the default run like ``slow``; ``pytest -m cuda`` runs them,
``scripts/gpu_run.sh`` on a GPU machine). Without CUDA they skip, unless
``BAMCTL_CUDA_TESTS_ON_CPU=1`` asks for the same tests on the CPU at tiny sizes: the dry
run of ``scripts/gpu_run.sh --dry-run``, which proves the tests themselves before GPU time.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from bamctl.attention_math import AttentionInputs
from bamctl.engine.stream import StreamingEngine, kernel_for
from bamctl.positional import GGDPrior

if torch.cuda.is_available():
    DEVICE, LENGTHS, DTYPES = "cuda", [4096, 16384], [torch.float32, torch.bfloat16]
elif os.environ.get("BAMCTL_CUDA_TESTS_ON_CPU") == "1":
    DEVICE, LENGTHS, DTYPES = "cpu", [512], [torch.float32, torch.bfloat16]
else:
    DEVICE, LENGTHS, DTYPES = None, [4096], [torch.float32]

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(DEVICE is None, reason="needs a CUDA GPU (BAMCTL_CUDA_TESTS_ON_CPU=1 runs them on the CPU at tiny sizes)"),
]

HEADS, HEAD_DIM = 2, 64
# Input scale of q and k. At unit scale, float32's own rounding of the logits times
# SSMax's log(16k) ~ 9.7 already puts the float32 reference 1.7e-5 away from a float64 one
# (measured on a CPU), past the 1e-5 asked of every path; at 0.5 it is 3e-6.
QK_SCALE = 0.5


@pytest.fixture(autouse=True)
def no_tf32():
    """Full float32 matmuls: cuBLAS and FlexAttention's Triton dots both follow this setting."""
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(saved)


def steep_and_flat_prior(max_distance: int) -> torch.Tensor:
    """(2, D+1) BAM prior table: head 0 ALiBi-steep (slope 1 per token), head 1 flat (theta = 0)."""
    prior = GGDPrior(HEADS)
    with torch.no_grad():
        prior.theta_alpha.copy_(torch.tensor([0.0, 0.0]))
        prior.theta_beta.copy_(torch.tensor([1.0, 0.0]))
        return prior.distance_table(max_distance)


def reference_attention(q, k, v, q_start, table, scale, scope, rows=1024):
    """Dense causal attention in float32, query rows at a time.

    Restates the formula of bamctl.engine.attention's docstring with plain tensor ops
    (no library computes BAM's prior with SSMax): l = (s + b) c or s c + b, c = s_h log(i + 1).
    """
    q, k, v = q.float(), k.float(), v.float()
    keys = torch.arange(k.shape[2], device=k.device)
    out = []
    for lo in range(0, q.shape[2], rows):
        queries = torch.arange(q_start + lo, q_start + min(lo + rows, q.shape[2]), device=q.device)
        distance = queries[:, None] - keys[None, :]
        content = q[:, :, lo : lo + rows] @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        bias = table[:, distance.clamp(0, table.shape[1] - 1)]
        factor = scale[:, None, None] * torch.log(queries.float() + 1.0)[None, :, None]
        logits = (content + bias) * factor if scope == "logits" else content * factor + bias
        out.append(torch.softmax(logits.masked_fill(distance < 0, float("-inf")), dim=-1) @ v)
    return torch.cat(out, dim=2)


@pytest.mark.parametrize("scope", ["logits", "content"])
@pytest.mark.parametrize("length", LENGTHS, ids=lambda n: f"{n // 1024}k" if n >= 1024 else str(n))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("path", ["flex", "blockwise", "dense"])
def test_attention_path_matches_float32_dense_reference(path, dtype, length, scope):
    # The second half of the queries against every key: a query offset, as a KV cache gives.
    g = torch.Generator().manual_seed(length)
    q, k, v = (torch.randn(1, HEADS, length, HEAD_DIM, generator=g) for _ in range(3))
    q, k = q * QK_SCALE, k * QK_SCALE
    q, k, v = (t.to(DEVICE, dtype) for t in (q, k, v))
    table = steep_and_flat_prior(length - 1).to(DEVICE)
    scale = torch.tensor([1.0, 0.6], device=DEVICE)
    half = length // 2
    inputs = AttentionInputs(q_start=half, bias_table=table, ssmax_scale=scale, ssmax_scope=scope)

    kernel = kernel_for(path)
    got = kernel(q[:, :, half:], k, v, inputs)
    expected = reference_attention(q[:, :, half:], k, v, half, table, scale, scope)

    assert got.dtype == dtype and got.shape == expected.shape
    if path == "flex":
        assert not kernel.failed_shapes, "FlexAttention fell back to the blockwise path"
    if dtype == torch.float32:
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    else:  # bfloat16 outputs: relative error of the whole tensor (elementwise, values near 0 would rule)
        relative = ((got.float() - expected).norm() / expected.norm()).item()
        assert relative < 1e-2, f"relative error {relative:.2e}"


@pytest.mark.parametrize("length", LENGTHS, ids=lambda n: f"{n // 1024}k" if n >= 1024 else str(n))
def test_flex_leaves_out_the_blocks_the_bound_rules_out_and_keeps_the_numbers(length):
    """FlexAttention's per-head block mask from the certified bound (bamctl.engine.block_skip): the
    steep head's far key blocks are left out, the flat head's never, and the output is the dense
    float32 reference's, as with every block read (--block-skip off)."""
    g = torch.Generator().manual_seed(length + 1)
    q, k, v = (torch.randn(1, HEADS, length, HEAD_DIM, generator=g).to(DEVICE) for _ in range(3))
    q, k = q * QK_SCALE, k * QK_SCALE
    table = steep_and_flat_prior(length - 1).to(DEVICE)
    scale = torch.tensor([1.0, 0.6], device=DEVICE)
    inputs = AttentionInputs(q_start=0, bias_table=table, ssmax_scale=scale, ssmax_scope="logits")
    skipping, reading = kernel_for("flex", "auto"), kernel_for("flex", "off")
    got, every_block = skipping(q, k, v, inputs), reading(q, k, v, inputs)
    assert not skipping.failed_shapes and not reading.failed_shapes, "FlexAttention fell back to the blockwise path"
    (left_out, considered), = skipping.counts.take()
    assert 0 < left_out < considered and reading.counts.take() == [(0, considered)]
    expected = reference_attention(q, k, v, 0, table, scale, "logits")
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, every_block, atol=1e-6, rtol=1e-6)


def test_a_content_bias_pair_by_pair_compiles_as_flexs_score_mod():
    """A plugin's pair_bias (the Cable example: rates read from the keys, summed between key and
    query) inside flex's compiled kernel, against the dense reference on the same device."""
    from pathlib import Path

    from bamctl.attention_math import dense_attention
    from bamctl.checkpoint import new_random_model
    from bamctl.model import ModelConfig

    cable = Path(__file__).resolve().parents[1] / "examples" / "positional" / "cable.py"
    prior = new_random_model(ModelConfig.from_preset("micro", f"{cable}:Cable"), seed=0).layers[0].attention.prior
    with torch.no_grad():
        prior.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    prior = prior.to(DEVICE)
    length, heads = LENGTHS[0], prior.weight.shape[0]
    g = torch.Generator().manual_seed(length + 2)
    q, k, v = (torch.randn(1, heads, length, prior.weight.shape[1], generator=g).to(DEVICE) * QK_SCALE for _ in range(3))
    half = length // 2
    inputs = AttentionInputs(q_start=half, bias_table=None, ssmax_scale=torch.full((heads,), 0.6, device=DEVICE),
                             content_prior=prior)
    kernel = kernel_for("flex")
    with torch.no_grad():
        got = kernel(q[:, :, half:], k, v, inputs)
        expected = dense_attention(q[:, :, half:], k, v, inputs)
    assert not kernel.failed_shapes, "FlexAttention fell back to the blockwise path"
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(DEVICE != "cuda", reason="auto picks flex on CUDA only (native on CPUs)")
def test_auto_picks_flex_on_cuda():
    from bamctl.checkpoint import new_random_model
    from bamctl.model import ModelConfig

    model = new_random_model(ModelConfig.from_preset("tiny", "bam-ssmax"), seed=0)
    engine = StreamingEngine(model, device="cuda")
    assert (engine.attention, engine.dtype) == ("flex", torch.bfloat16)


def test_authors_checkpoint_scores_the_same_nll_on_the_device_as_on_the_cpu(tmp_path):
    from test_external_authors import VOCAB, build

    from bamctl.backends.authors import load_authors_checkpoint

    folder, *_ = build(tmp_path, "bam_ssmax")
    ids = torch.randint(0, VOCAB, (1100,), generator=torch.Generator().manual_seed(3)).tolist()
    # Chunks of 512: flex at offsets 0 and 512 (key lengths 512 and 1024), the 76-token tail blockwise.
    on_cpu = StreamingEngine(load_authors_checkpoint(folder).model, device="cpu", dtype="float32", chunk_size=512, attention="blockwise")
    on_device = StreamingEngine(load_authors_checkpoint(folder).model, device=DEVICE, dtype="float32", chunk_size=512,
                                attention="auto" if DEVICE == "cuda" else "flex")
    assert on_device.attention == "flex"
    expected, got = on_cpu.token_nll(ids), on_device.token_nll(ids)
    assert not on_device.kernel.failed_shapes, "FlexAttention fell back to the blockwise path"
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=1e-4)


def test_positional_parameters_keep_their_float32_values_under_bfloat16(tmp_path):
    from test_external_authors import build

    from bamctl.backends.authors import load_authors_checkpoint

    folder, *_ = build(tmp_path, "bam_ssmax")
    model = load_authors_checkpoint(folder).model
    names = [name for name, p in model.named_parameters() if ".prior." in name or name.endswith("ssmax_scale")]
    float32 = {name: p.detach().clone() for name, p in model.named_parameters() if name in names}
    assert names and all(p.dtype == torch.float32 for p in float32.values())
    # The checkpoint's values are not all bfloat16-representable: a round trip would show.
    assert any(not torch.equal(p, p.bfloat16().float()) for p in float32.values())

    engine = StreamingEngine(model, device=DEVICE, dtype="bfloat16", chunk_size=256)
    assert engine.model.layers[0].attention.wq.weight.dtype == torch.bfloat16
    after = dict(engine.model.named_parameters())
    for name in names:
        assert after[name].dtype == torch.float32 and after[name].device.type == DEVICE, name
        assert torch.equal(after[name].detach().cpu(), float32[name]), f"{name} lost its float32 value"


def test_autocast_bfloat16_on_the_device_follows_the_dense_autocast_reference(tmp_path):
    """``--dtype autocast-bfloat16`` on the device's own path (flex on CUDA: bfloat16 q, k, v as the
    projections give them, float32 scores, as the authors' FlexAttention) against the model's dense
    forward under autocast with the attention core in float32. FlexAttention rounds its softmax
    weights to bfloat16 before the product with v, the reference does not: the logits agree to
    1e-2 relative, as the bfloat16 kernels above; casting the weights instead is further off."""
    from test_external_authors import VOCAB, build

    from bamctl.attention_math import dense_attention
    from bamctl.backends.authors import load_authors_checkpoint
    from bamctl.model import ForwardState

    folder, *_ = build(tmp_path, "bam_ssmax")
    tokens = torch.randint(0, VOCAB, (1100,), generator=torch.Generator().manual_seed(3))
    device_type = torch.device(DEVICE).type

    def float32_attention(q, k, v, inputs):
        with torch.autocast(device_type, enabled=False):
            return dense_attention(q, k, v, inputs)

    model = load_authors_checkpoint(folder).model.to(DEVICE)
    with torch.no_grad(), torch.autocast(device_type, dtype=torch.bfloat16):
        expected = model.output(model.hidden(tokens[None].to(DEVICE), 0, ForwardState(kernel=float32_attention))).float()[0].cpu()

    def relative(got):
        return ((got - expected).norm() / expected.norm()).item()

    engine = StreamingEngine(load_authors_checkpoint(folder).model, device=DEVICE, dtype="autocast-bfloat16", chunk_size=512,
                             attention="auto" if DEVICE == "cuda" else "flex")
    assert engine.attention == "flex" and engine.model.layers[0].attention.wq.weight.dtype == torch.float32
    got = engine.logits_at(tokens.tolist(), list(range(len(tokens)))).cpu()
    assert not engine.kernel.failed_shapes, "FlexAttention fell back to the blockwise path"
    cast = StreamingEngine(load_authors_checkpoint(folder).model, device=DEVICE, dtype="bfloat16", chunk_size=512,
                           attention=engine.attention)
    cast_error = relative(cast.logits_at(tokens.tolist(), list(range(len(tokens)))).cpu())
    assert relative(got) < 1e-2 < cast_error  # measured on a CPU (the dry run): 1.6e-4 and 7.4e-2
