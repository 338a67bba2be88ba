"""The streamed engine against the dense reference forward, for every PE, with and without SSMax."""

from functools import partial

import pytest
import torch
import torch.nn.functional as F

from bamctl.checkpoint import new_random_model
from bamctl.errors import BamctlError
from bamctl.attention_math import AttentionInputs, dense_attention
from bamctl.engine.attention import blockwise_attention
from bamctl.engine.fused import fused_attention
from bamctl.engine.stream import StreamingEngine
from bamctl.model import ModelConfig
from bamctl.positional import PE_REGISTRY

ALL_PES = [f"{pe}{suffix}" for pe in PE_REGISTRY for suffix in ("", "-ssmax")]
VOCAB = 101
N_TOKENS = 45


def random_model(pe: str, seed: int = 0, **overrides):
    model = new_random_model(ModelConfig.from_preset("micro", pe, vocab_size=VOCAB, **overrides), seed)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # move positional parameters off their init so they matter
        for name, param in model.named_parameters():
            if ".prior." in name or "ssmax_scale" in name:
                param.copy_(torch.empty_like(param).uniform_(-0.8, 0.8, generator=generator) + (1.0 if "ssmax" in name else 0.0))
    return model


def tokens(n=N_TOKENS, seed=0):
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("pe", ALL_PES)
@pytest.mark.parametrize("chunk_size", [5, 9, 15, N_TOKENS, 64])  # 5, 9, 15 divide 45; 64 > 45
@pytest.mark.parametrize("kernel", ["dense", "blockwise", "fused", "native"])
def test_streamed_logits_equal_dense_reference(pe, chunk_size, kernel):
    model = random_model(pe)
    ids = tokens()
    if pe.startswith("fire") and kernel == "fused":  # FIRE's prior is not a 1-D line: refused
        with pytest.raises(BamctlError, match="depends on the\\s+query position"):
            StreamingEngine(model, device="cpu", dtype="float32", chunk_size=chunk_size, attention=kernel)
        return
    reference = model(torch.tensor([ids]))[0]
    engine = StreamingEngine(model, device="cpu", dtype="float32", chunk_size=chunk_size, attention=kernel)
    if kernel == "blockwise":  # small key blocks, so chunks span several blocks and partial ones
        engine.kernel = partial(blockwise_attention, block_size=7)
    if kernel == "fused":  # small query blocks and mask tiles: past, diagonal and tile merges all run
        engine.kernel = partial(fused_attention, rows=4, tile=6)
    streamed = engine.logits_at(ids, list(range(len(ids))))
    assert torch.allclose(streamed, reference, atol=1e-4, rtol=0), (streamed - reference).abs().max()


@pytest.mark.parametrize("chunk_size", [4, 7, 16])
def test_nondividing_chunks_match_for_ssmax_bam(chunk_size):
    model = random_model("bam-ssmax", seed=3)
    ids = tokens(37, seed=3)  # 37 is prime: no chunk size divides it
    reference = model(torch.tensor([ids]))[0]
    engine = StreamingEngine(model, device="cpu", dtype="float32", chunk_size=chunk_size, attention="blockwise")
    engine.kernel = partial(blockwise_attention, block_size=5)
    assert torch.allclose(engine.logits_at(ids, list(range(37))), reference, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "autocast-bfloat16"])
def test_the_kernel_set_on_an_engine_is_the_one_its_forward_calls(dtype):
    # The tests above give kernels small blocks by setting engine.kernel; a forward that kept the
    # kernel of its construction would run the default blocks and test nothing of the small ones.
    model = random_model("bam-ssmax", seed=3)
    engine = StreamingEngine(model, device="cpu", dtype=dtype, chunk_size=8, attention="blockwise")
    calls = []

    def counting(*args, **kwargs):
        calls.append(1)
        return blockwise_attention(*args, block_size=5)

    engine.kernel = counting
    ids = tokens(20, seed=3)
    assert torch.allclose(engine.logits_at(ids, [19]), model(torch.tensor([ids]))[0, [19]], atol=1e-2)
    assert len(calls) >= model.config.n_layers  # every layer's attention went through it


@pytest.mark.parametrize("pe", ALL_PES)
def test_changing_a_token_changes_no_earlier_logit(pe):
    model = random_model(pe)
    ids = tokens()
    t = 20
    changed = list(ids)
    changed[t] = (changed[t] + 1) % VOCAB
    before = model(torch.tensor([ids]))[0]
    after = model(torch.tensor([changed]))[0]
    assert torch.equal(before[:t], after[:t])
    assert not torch.allclose(before[t:], after[t:])


def test_blockwise_kernel_equals_dense_kernel_with_offsets():
    torch.manual_seed(0)
    heads, tq, tk, dh = 3, 6, 30, 8
    q, k, v = torch.randn(1, heads, tq, dh), torch.randn(1, heads, tk, dh), torch.randn(1, heads, tk, dh)
    inputs = AttentionInputs(q_start=tk - tq, bias_table=-torch.rand(heads, tk) * 3, ssmax_scale=torch.rand(heads) + 0.5)
    expected = dense_attention(q, k, v, inputs)
    for block in (1, 4, 7, 64):
        assert torch.allclose(blockwise_attention(q, k, v, inputs, block_size=block), expected, atol=1e-5)


def _set_prior(model, alpha, beta):
    with torch.no_grad():
        for block in model.layers:
            block.attention.prior.theta_alpha.copy_(alpha)
            block.attention.prior.theta_beta.copy_(beta)


def _same_weights(source, target):
    state = {k: v for k, v in source.state_dict().items() if ".prior." not in k and "ssmax" not in k}
    target.load_state_dict(state, strict=False)


@pytest.mark.parametrize("ssmax", [False, True])
def test_bam_with_beta_one_and_alibi_scale_is_alibi(ssmax):
    suffix = "-ssmax" if ssmax else ""
    alibi = new_random_model(ModelConfig.from_preset("micro", f"alibi{suffix}", vocab_size=VOCAB), 0)
    bam = new_random_model(ModelConfig.from_preset("micro", f"bam{suffix}", vocab_size=VOCAB), 1)
    _same_weights(alibi, bam)
    slopes = alibi.layers[0].attention.prior.slopes
    _set_prior(bam, slopes.log(), torch.ones_like(slopes))
    ids = torch.tensor([tokens()])
    # The authors' epsilon shifts every distance by 1e-5: a 1e-5 * slope difference in the logits.
    assert torch.allclose(bam(ids), alibi(ids), atol=1e-4)


@pytest.mark.parametrize("ssmax", [False, True])
def test_bam_with_beta_zero_is_nope(ssmax):
    suffix = "-ssmax" if ssmax else ""
    nope = new_random_model(ModelConfig.from_preset("micro", f"nope{suffix}", vocab_size=VOCAB), 0)
    bam = new_random_model(ModelConfig.from_preset("micro", f"bam{suffix}", vocab_size=VOCAB, ssmax_scope="content"), 1)
    _same_weights(nope, bam)
    _set_prior(bam, torch.full((4,), 0.7), torch.zeros(4))  # a constant bias, whatever its size
    ids = torch.tensor([tokens()])
    assert torch.allclose(bam(ids), nope(ids), atol=1e-5)


def test_alibi_linear_init_keeps_alibi_slopes_and_spreads_beta():
    from bamctl.positional import GGDPrior, alibi_slopes

    prior = GGDPrior(4, init="alibi-linear")
    assert torch.allclose(prior.theta_alpha.exp(), torch.tensor(alibi_slopes(4)))
    assert prior.theta_beta.tolist() == pytest.approx([0.0, 1 / 3, 2 / 3, 1.0])
    table = prior.distance_table(10)
    assert torch.allclose(table[3], -torch.tensor(alibi_slopes(4)[3]) * (torch.arange(11.0) + 1e-5), atol=1e-6)


@pytest.mark.parametrize("beta", [-30.0, -2.0, -0.5, 0.0, 0.5, 1.0, 3.0])
def test_gradients_reach_positional_parameters_and_stay_finite(beta):
    model = random_model("bam-ssmax")
    _set_prior(model, torch.full((4,), 0.3), torch.full((4,), beta))
    ids = torch.tensor([tokens()])
    logits = model(ids)
    assert torch.isfinite(logits).all()
    F.cross_entropy(logits[0, :-1], ids[0, 1:]).backward()
    for block in model.layers:
        attention = block.attention
        for param in (attention.prior.theta_alpha, attention.prior.theta_beta, attention.ssmax_scale):
            assert param.grad is not None and torch.isfinite(param.grad).all()
        assert attention.prior.theta_beta.grad.abs().sum() > 0 or beta < -7  # capped region has zero slope


def test_prior_table_has_no_nan_or_inf_for_extreme_thetas():
    model = random_model("bam")
    prior = model.layers[0].attention.prior
    with torch.no_grad():
        prior.theta_alpha.copy_(torch.tensor([-50.0, 50.0, 0.0, 10.0]))
        prior.theta_beta.copy_(torch.tensor([-100.0, 100.0, -8.0, 2.0]))
    table = prior.distance_table(1 << 19)
    assert torch.isfinite(table).all()
    assert (table <= 0).all()


def test_generate_matches_greedy_decoding_with_full_forwards():
    model = random_model("rope-ssmax", seed=5)
    prompt = tokens(23, seed=5)
    engine = StreamingEngine(model, device="cpu", dtype="float32", chunk_size=8)
    generated = engine.generate(prompt, max_new_tokens=6)
    ids = list(prompt)
    for _ in range(6):
        ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    assert generated == ids[len(prompt):]


def test_token_nll_equals_cross_entropy_of_dense_forward():
    model = random_model("alibi-ssmax", seed=2)
    ids = tokens(40, seed=2)
    engine = StreamingEngine(model, device="cpu", dtype="float32", chunk_size=6)
    logits = model(torch.tensor([ids]))[0]
    expected = F.cross_entropy(logits[:-1], torch.tensor(ids[1:]), reduction="none")
    assert torch.allclose(engine.token_nll(ids, score_from=1), expected, atol=1e-4)
    assert torch.allclose(engine.token_nll(ids, score_from=17), expected[16:], atol=1e-4)


def test_score_continuation_matches_dense_argmax():
    model = random_model("bam-ssmax", seed=4)
    prompt, target = tokens(30, seed=4), tokens(5, seed=9)
    engine = StreamingEngine(model, device="cpu", dtype="float32", chunk_size=7)
    predicted, logprobs = engine.score_continuation(prompt, target)
    logits = model(torch.tensor([prompt + target]))[0, len(prompt) - 1 : -1]
    assert predicted == logits.argmax(-1).tolist()
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(target)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(logprobs), expected, atol=1e-4)


@pytest.mark.skipif(not __import__("bamctl.engine.flex", fromlist=["x"]).flex_available()[0], reason="compiled FlexAttention needs CUDA or an x86 CPU")
def test_flex_path_equals_dense_reference_with_prior_ssmax_and_offsets():
    # One model with every feature the score_mod handles (GGD prior + SSMax over the logits);
    # 300 tokens in chunks of 128: offsets, a partial last chunk, KV lengths past a power of two.
    model = random_model("bam-ssmax", seed=11)
    ids = tokens(300, seed=11)
    reference = model(torch.tensor([ids]))[0]
    engine = StreamingEngine(model, device="cpu", dtype="float32", chunk_size=128, attention="flex")
    assert torch.allclose(engine.logits_at(ids, list(range(300))), reference, atol=1e-4)


@pytest.mark.parametrize("pe", ["bam-ssmax", "rope", "sinusoidal"])
@pytest.mark.parametrize("chunk_size", [4, 13, 64])
def test_scoring_a_suffix_skips_nothing_it_needs(pe, chunk_size):
    # Only rows >= the first asked-for position go through the last layer; the rest
    # of the chunk (and whole earlier chunks) still feed keys and values to the cache.
    model = random_model(pe, seed=7)
    ids = tokens()
    reference = model(torch.tensor([ids]))[0]
    engine = StreamingEngine(model, device="cpu", dtype="float32", chunk_size=chunk_size)
    positions = [44, 30, 31, 40]
    assert torch.allclose(engine.logits_at(ids, positions), reference[positions], atol=1e-4)


def test_each_engine_owns_its_kernel_state():
    """No module-level state: two engines on the native or fused path keep their own counters
    and buffers, and the result does not depend on what another engine ran before."""
    from bamctl.engine.fused import FusedKernel
    from bamctl.engine.native import NativeKernel, native_available

    model = random_model("bam-ssmax", seed=5, bam_init="alibi")
    with torch.no_grad():  # a steep prior: far key blocks are provably zero and skipped
        for layer in model.layers:
            layer.attention.prior.theta_alpha.fill_(1.0)
    ids = tokens(3000, seed=5)
    paths = ["fused"] + (["native"] if native_available()[0] else [])
    for path in paths:
        first = StreamingEngine(model, device="cpu", chunk_size=512, attention=path)
        second = StreamingEngine(model, device="cpu", chunk_size=512, attention=path)
        assert first.kernel is not second.kernel
        a = first.logits_at(ids, [2999])
        if isinstance(first.kernel, NativeKernel):
            (skipped, considered), = first.last_block_counts
            assert 0 < skipped < considered
            assert second.last_block_counts == [] and second.kernel.counts.take() == []
        if isinstance(first.kernel, FusedKernel):
            assert first.kernel.scratch and not second.kernel.scratch  # SSMax over the logits materialises tiles
        assert torch.equal(second.logits_at(ids, [2999]), a)
