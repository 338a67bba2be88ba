"""Certified block skipping (docs/engine.md, "Certified block skipping"): the bound, and the
kernels that skip by it, against the dense reference."""

from __future__ import annotations

import math

import pytest
import torch

from bamctl.attention_math import AttentionInputs, _logits, ssmax_factor
from bamctl.engine import block_skip
from bamctl.engine.block_skip import (
    EPSILON, EPSILON_NATS, block_bias_range, logit_upper_bound, negligible, skip_margin,
)
from bamctl.positional import ALiBiPrior, GGDPrior

HEADS, DIM = 4, 16


def _table(kind: str, n: int) -> torch.Tensor:
    if kind == "alibi":
        return ALiBiPrior(HEADS).distance_table(n)
    prior = GGDPrior(HEADS, init="alibi")
    with torch.no_grad():
        prior.theta_beta.copy_(torch.linspace(0.3, 1.2, HEADS))
        prior.theta_alpha.copy_(torch.linspace(-2.0, 0.5, HEADS))
        if hasattr(prior, "theta_mu"):
            prior.theta_mu.fill_(3.0)
    return prior.distance_table(n)


def _row_logits(q, k, inputs):
    """(B, H, Tq, Tk) float64 logits of the reference, future keys at -inf."""
    tq, tk = q.shape[2], k.shape[2]
    qp = torch.arange(inputs.q_start, inputs.q_start + tq)
    kp = torch.arange(tk)
    scores = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    double = AttentionInputs(inputs.q_start, inputs.bias_table.double(),
                             None if inputs.ssmax_scale is None else inputs.ssmax_scale.double(), inputs.ssmax_scope)
    logits = _logits(scores, qp, kp, double)
    return logits.masked_fill(qp[:, None] < kp[None, :], float("-inf"))


def _bounds(q, k, inputs, first_row, rows, start, cols):
    """The bound of every row r in [first_row, first_row + rows) over keys [start, start + cols)."""
    table = inputs.bias_table
    high, low = block_bias_range(table, inputs.q_start + first_row, rows, torch.tensor([start]), cols)
    q_norm = q[:, :, first_row:first_row + rows].norm(dim=-1) / math.sqrt(q.shape[-1])  # (B, H, rows)
    key_norm = k[:, :, start:start + cols].norm(dim=-1).amax(-1, keepdim=True)  # (B, H, 1)
    factor = None
    if inputs.ssmax_scale is not None:
        factor = ssmax_factor(inputs, q.shape[2], q.device)[None, :, first_row:first_row + rows]
    return logit_upper_bound(q_norm, key_norm, high[None], low[None], factor, inputs.ssmax_scope)


@pytest.mark.parametrize("prior", ["alibi", "ggd"])
@pytest.mark.parametrize("scale", [None, "positive", "negative", "mixed"])
@pytest.mark.parametrize("scope", ["logits", "content"])
def test_the_bound_is_above_every_logit_of_its_block(prior, scale, scope):
    g = torch.Generator().manual_seed(hash((prior, scale, scope)) % 1000)
    keys, queries, rows, cols = 300, 64, 16, 37
    q = torch.randn(2, HEADS, queries, DIM, generator=g) * 3.0
    k = torch.randn(2, HEADS, keys, DIM, generator=g) * 3.0
    scales = {None: None, "positive": torch.rand(HEADS, generator=g) + 0.2,
              "negative": -(torch.rand(HEADS, generator=g) + 0.2), "mixed": torch.tensor([-0.7, 0.6, -0.05, 1.1])}[scale]
    inputs = AttentionInputs(keys - queries, _table(prior, keys), scales, scope)
    logits = _row_logits(q, k, inputs)
    for first_row in (0, 16, 48):
        for start in (0, 37, 111, keys - queries - cols):
            upper = _bounds(q, k, inputs, first_row, rows, start, cols)  # (B, H, rows)
            block = logits[:, :, first_row:first_row + rows, start:start + cols]
            assert (block.amax(-1) <= upper.double() + 1e-4 * upper.abs().double()).all()


def test_a_negative_factor_is_bounded_by_the_smallest_bias():
    # l = (s + b) c with c < 0: the most negative bias gives the largest logit.
    upper = logit_upper_bound(torch.tensor(1.0), torch.tensor(2.0), torch.tensor(-1.0), torch.tensor(-50.0),
                              torch.tensor(-3.0), "logits")
    assert upper.item() == pytest.approx(3 * 2 + 150)
    content = logit_upper_bound(torch.tensor(1.0), torch.tensor(2.0), torch.tensor(-1.0), torch.tensor(-50.0),
                                torch.tensor(-3.0), "content")
    assert content.item() == pytest.approx(3 * 2 - 1)


def test_the_bias_term_of_the_bound_is_the_larger_of_c_times_either_end_of_the_bias_range():
    """l = s c + b c: over b in [bias_min, bias_max], b c is linear in b, so its largest value is at
    one end of the range, max(c bias_max, c bias_min), for factors of either sign and any size
    (0 and those between 0 and 1 included). Restated here with that maximum, not with the sign
    test the module uses; the content scope adds bias_max alone."""
    factor = torch.tensor([-3.0, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0])
    q_norm, key_norm, bias_max, bias_min = torch.tensor(1.5), torch.tensor(2.0), torch.tensor(-1.0), torch.tensor(-50.0)
    upper = logit_upper_bound(q_norm, key_norm, bias_max, bias_min, factor, "logits")
    assert torch.equal(upper, factor.abs() * 3.0 + torch.maximum(factor * bias_max, factor * bias_min))
    content = logit_upper_bound(q_norm, key_norm, bias_max, bias_min, factor, "content")
    assert torch.equal(content, factor.abs() * 3.0 + bias_max)


def test_the_margin_counts_every_key_the_row_sees():
    positions = torch.tensor([0, 1023, 524287])
    assert torch.allclose(skip_margin(positions), EPSILON_NATS + torch.log(positions.float() + 1))
    # n keys each EPSILON_NATS below the row's logit: their mass is n 2^-40, more than allowed;
    # the margin's log(n) refuses them, and accepts them a little further down.
    lower = torch.tensor([0.0, 0.0, 0.0])
    assert not negligible(lower - EPSILON_NATS - 0.5, lower, positions)[1:].any()
    assert negligible(lower - skip_margin(positions) - 0.01, lower, positions).all()
    assert not negligible(torch.tensor([-1e9]), torch.tensor([float("-inf")]), torch.tensor([10])).any()


def test_a_block_whose_bound_meets_the_rows_logit_exactly_is_kept():
    """The bound must be strictly below: ``upper + margin + slack < lower`` (the module's docstring).
    The test restates that sum in float32 and finds the logit ``lower`` it lands on exactly (a fixed
    point, since the slack barely moves with ``lower``): there the block is kept, one float32 step
    higher it is left out."""
    positions = torch.tensor([0, 1023, 524287])
    upper = torch.tensor([-3.0, 0.0, 2.5])
    lower = upper + skip_margin(positions)
    for _ in range(8):
        lower = upper + skip_margin(positions) + block_skip.SLACK * (upper.abs() + lower.abs())
    assert torch.equal(upper + skip_margin(positions) + block_skip.SLACK * (upper.abs() + lower.abs()), lower)
    assert not negligible(upper, lower, positions).any()
    assert negligible(upper, torch.nextafter(lower, torch.tensor(math.inf)), positions).all()


def test_a_blocks_bias_range_is_computed_on_the_device_of_its_table():
    """The kernels call block_bias_range with a CUDA table and CUDA block starts; every tensor it
    builds must be on that device, or adding them stops the run. The meta device stands in for an
    accelerator on a machine without one: it keeps devices and shapes and computes nothing."""
    table = torch.randn(HEADS, 300, device="meta")
    starts = torch.tensor([0, 64, 128], device="meta")
    high, low = block_bias_range(table, 200, 32, starts, 64)
    assert high.device == low.device == table.device and high.shape == low.shape == (HEADS, 3)


def test_block_counts_add_up_per_sequence_over_calls_of_any_batch_size():
    """A kernel adds its counts on every call (layers, chunks), for as many sequences as that call
    holds: each sequence's sums over the calls, restated here by hand, and nothing after take()."""
    counts = BlockCounts()
    counts.add([1, 2], [3, 4])
    counts.add([5], [6])  # a smaller batch adds to the first sequence only
    counts.add(torch.tensor([1, 1, 7]), torch.tensor([2, 2, 8]))  # a larger one keeps the earlier sums
    counts.add([0, 3, 0], [1, 1, 1])
    assert counts.take() == [(1 + 5 + 1 + 0, 3 + 6 + 2 + 1), (2 + 1 + 3, 4 + 2 + 1), (7 + 0, 8 + 1)]
    assert counts.take() == []


def test_a_mode_other_than_auto_or_off_is_refused():
    from bamctl.errors import BamctlError

    assert block_skip.check_mode("off") == "off"
    with pytest.raises(BamctlError, match="--block-skip must be one of auto, off"):
        block_skip.check_mode("on")


def test_only_a_distance_table_is_ever_skipped_on():
    table = _table("alibi", 10)
    assert block_skip.attempts(AttentionInputs(0, table, None), "auto")
    assert not block_skip.attempts(AttentionInputs(0, table, None), "off")
    assert not block_skip.attempts(AttentionInputs(0, None, torch.ones(HEADS)), "auto")  # no bias: nope, rope, ...


def test_an_adversarial_block_is_kept_where_the_bias_alone_would_skip_it():
    # One far key aligned with the query: its bias is 80 nats down, its content 100 nats up. A
    # test on the bias alone (content bound 0) would leave its block out and lose nearly all the
    # row's mass; the bound with the content term keeps it.
    q = torch.zeros(1, 1, 1, DIM)
    q[..., 0] = 10.0 * math.sqrt(math.sqrt(DIM))
    k = torch.zeros(1, 1, 200, DIM)
    k[0, 0, 5, 0] = 10.0 * math.sqrt(math.sqrt(DIM))  # s = 100 for key 5, 0 elsewhere
    table = -torch.arange(200, dtype=torch.float32)[None, :] * (80.0 / 194)  # b(194) = -80
    inputs = AttentionInputs(199, table, None)
    logits = _row_logits(q, k, inputs)[0, 0, 0]
    lower = logits[150:].max().float()[None]  # the near block: bias ~0, content 0
    position = torch.tensor([199])
    high, low = block_bias_range(table, 199, 1, torch.tensor([0]), 50)
    bias_only = logit_upper_bound(torch.tensor(0.0), torch.tensor(0.0), high[0], low[0])
    assert negligible(bias_only, lower, position).item()  # would skip, wrongly:
    assert torch.softmax(logits, -1)[5] > 0.99
    upper = _bounds(q, k, inputs, 0, 1, 0, 50)[0, 0]
    assert not negligible(upper, lower, position).item()


# -- the kernels ------------------------------------------------------------------------------

from bamctl.attention_math import dense_attention  # noqa: E402
from bamctl.engine import attention as blockwise_module  # noqa: E402
from bamctl.engine.attention import BlockwiseKernel, blockwise_attention  # noqa: E402
from bamctl.engine.block_skip import BlockCounts  # noqa: E402
from bamctl.engine import native  # noqa: E402
from bamctl.engine.stream import StreamingEngine  # noqa: E402

from test_engine import random_model, tokens  # noqa: E402

BIAS_PES = ["alibi", "kerple", "t5", "bam", "alibi-ssmax", "bam-ssmax"]
NO_BIAS_PES = ["nope", "rope", "xpos", "sinusoidal", "rope-ssmax", "fire"]  # fire: a bias, but no table
RELATIVE = 1e-5  # the engine's tolerance on a perplexity row's NLL (and identical argmax)
NATIVE, NATIVE_WHY = native.native_available()
PATHS = ["blockwise", pytest.param("native", marks=pytest.mark.skipif(not NATIVE, reason=f"no C++ kernel: {NATIVE_WHY}"))]


def _steep(model):
    """The random model with its GGD heads made steep (as trained BAM heads often are): far keys provably negligible."""
    with torch.no_grad():
        for layer in model.layers:
            prior = layer.attention.prior
            if hasattr(prior, "theta_alpha"):
                prior.theta_alpha.fill_(1.0)
    return model


def _engine(model, kernel):
    engine = StreamingEngine(model, device="cpu", dtype="float32", chunk_size=256, attention="blockwise")
    engine.kernel = kernel
    return engine


def _kernel(path, mode="auto"):
    """A kernel of ``path`` with small key blocks where they can be chosen (native's are 512)."""
    return BlockwiseKernel(mode, block_size=64) if path == "blockwise" else native.NativeKernel(mode)


def _assert_rows_equal(engine, reference, ids, window=256):
    """Identical argmax; the NLL of every window of ``window`` tokens (a perplexity row's sum) within
    RELATIVE. (A single token's NLL rounds like its logits, up to ~5e-4 at 4k on a shipped model,
    skipping or not: a row sums hundreds of them.)"""
    positions = list(range(0, len(ids), 97))
    assert torch.equal(engine.logits_at(ids, positions).argmax(-1), reference.logits_at(ids, positions).argmax(-1))
    got, want = engine.token_nll(ids), reference.token_nll(ids)
    known = torch.isfinite(want)
    assert torch.equal(known, torch.isfinite(got))
    got, want = got.masked_fill(~known, 0).double(), want.masked_fill(~known, 0).double()
    for start in range(0, len(want), window):
        a, b = got[start:start + window].sum(), want[start:start + window].sum()
        assert abs(a - b) <= RELATIVE * abs(b), (start, float(a), float(b))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("pe", BIAS_PES)
@torch.inference_mode()
def test_skipping_gives_the_dense_rows_on_bias_models(pe, path):
    model = _steep(random_model(pe, seed=3))
    ids = tokens(1500 if path == "blockwise" else 2600, seed=3)
    engine = _engine(model, _kernel(path))
    dense = StreamingEngine(model, device="cpu", dtype="float32", chunk_size=256, attention="dense")
    _assert_rows_equal(engine, dense, ids)
    skipped, total = engine.last_block_counts[0]
    assert total > 0
    if pe in ("alibi", "bam", "alibi-ssmax", "bam-ssmax"):  # steep heads: the far past is left out
        assert skipped > 0


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("pe", NO_BIAS_PES)
@torch.inference_mode()
def test_models_without_a_bias_table_never_attempt_a_skip(pe, path, monkeypatch):
    # blockwise: the bound is never evaluated; native: no prior line, so its test returns at once.
    def never(*args, **kwargs):
        raise AssertionError("a skip was attempted")

    monkeypatch.setattr(blockwise_module, "negligible", never)
    monkeypatch.setattr(blockwise_module, "logit_upper_bound", never)
    model = random_model(pe, seed=2)
    engine = _engine(model, _kernel(path))
    engine.token_nll(tokens(700 if path == "blockwise" else 1100, seed=2))
    skipped, total = engine.last_block_counts[0]
    assert skipped == 0 and total > 0


@pytest.mark.parametrize("path", PATHS)
@torch.inference_mode()
def test_off_reads_every_block_and_counts_the_same_blocks(path):
    model = _steep(random_model("bam-ssmax", seed=5))
    ids = tokens(1200 if path == "blockwise" else 2600, seed=5)
    auto = _engine(model, _kernel(path, "auto"))
    off = _engine(model, _kernel(path, "off"))
    a, b = auto.token_nll(ids), off.token_nll(ids)
    assert off.last_block_counts[0][0] == 0 and auto.last_block_counts[0][0] > 0
    assert off.last_block_counts[0][1] == auto.last_block_counts[0][1]
    known = torch.isfinite(b)
    assert abs(a[known].double().sum() - b[known].double().sum()) <= RELATIVE * abs(b[known].double().sum())


def _adversarial(content=400.0, lead=20.0):
    """One head, one query at position 1999; key 5 aligned with it (s = ``content``) under a bias
    ``lead`` nats less negative than its content, every other key orthogonal (s = 0, norm 1). The
    bias alone rules key 5's block out (its bias is far below everything near); its weight is > 0.99."""
    dim, n = 16, 2000
    root = math.sqrt(content * math.sqrt(dim))  # q . k / sqrt(Dh) = content for key 5
    q = torch.zeros(1, 1, 1, dim)
    q[..., 0] = root
    k = torch.zeros(1, 1, n, dim)
    k[..., 1] = 1.0
    k[0, 0, 5] = 0.0
    k[0, 0, 5, 0] = root
    v = torch.randn(1, 1, n, dim, generator=torch.Generator().manual_seed(0))
    table = -torch.arange(n, dtype=torch.float32)[None, :] * ((content - lead) / (n - 1 - 5))
    return q, k, v, AttentionInputs(n - 1, table, None)


def _counted(path, q, k, v, inputs, mode="auto"):
    """(output, (skipped, total)) of one call on ``path``."""
    if path == "native":
        out, blocks = native.native_attention_blocks(q, k, v, inputs, mode)
        return out, tuple(int(x) for x in blocks.sum(0))
    counts = BlockCounts()
    out = blockwise_attention(q, k, v, inputs, block_size=64, block_skip=mode, counts=counts)
    return out, counts.take()[0]


SCALES = {None: None, "positive": lambda g: torch.rand(HEADS, generator=g) * 0.3 + 0.05,
          "negative": lambda g: -(torch.rand(HEADS, generator=g) * 0.3 + 0.05)}
PART = 128  # keys per share of a row measured below: a key block of every path is whole such parts


def _skipping_case(scale, scope, keys=2048, queries=64):
    """Random queries and keys under steep GGD heads; each value the one-hot of its key's part of
    ``PART`` keys, so an output row is the share of its softmax mass each part got."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, HEADS, queries, DIM, generator=g)
    k = torch.randn(1, HEADS, keys, DIM, generator=g)
    scales = None if SCALES[scale] is None else SCALES[scale](g)
    v = torch.nn.functional.one_hot(torch.arange(keys) // PART, keys // PART).float()
    inputs = AttentionInputs(keys - queries, _table("ggd", keys).detach(), scales, scope)
    return q, k, v.expand(1, HEADS, keys, keys // PART).contiguous(), inputs


def _part_mass(q, k, inputs) -> torch.Tensor:
    """(B, H, Tq, parts) float64: the share of each row's softmax mass in each part, from the reference's logits."""
    weights = torch.softmax(_row_logits(q, k, inputs), -1)
    return weights.view(*weights.shape[:3], -1, PART).sum(-1)


def _sign_blind_would_drop(q, k, inputs) -> torch.Tensor:
    """Per (B, H, Tq, part): whether a bound that took SSMax's factor as positive would rule the part
    out against the row's largest logit among its nearest ``PART`` keys (which every path computes)."""
    blind = AttentionInputs(inputs.q_start, inputs.bias_table, inputs.ssmax_scale.abs(), inputs.ssmax_scope)
    lower = _row_logits(q, k, inputs)[..., -PART:].amax(-1).float()  # (B, H, Tq)
    positions = torch.arange(inputs.q_start, inputs.q_start + q.shape[2])
    parts = k.shape[2] // PART
    drop = torch.zeros(*lower.shape, parts, dtype=torch.bool)
    for part in range(parts - 1):  # the last holds the diagonal
        drop[..., part] = negligible(_bounds(q, k, blind, 0, q.shape[2], part * PART, PART), lower, positions)
    return drop


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("scale", [None, "positive", "negative"])
@pytest.mark.parametrize("scope", ["logits", "content"])
@torch.inference_mode()
def test_what_a_kernel_leaves_out_holds_less_than_epsilon_of_each_row(path, scale, scope):
    """The kernel as it runs, against the mass the dense reference's logits give each part of a row
    (float64): every part holding EPSILON of its row or more gets its share (a part left out would
    get none), and the parts that got none hold less than EPSILON together."""
    q, k, v, inputs = _skipping_case(scale, scope)
    out, (skipped, total) = _counted(path, q, k, v, inputs)
    mass = _part_mass(q, k, inputs)
    heavy = mass >= EPSILON
    assert ((out.double() - mass).abs() <= 1e-4 * mass)[heavy].all()
    assert (mass.masked_fill(out != 0, 0).sum(-1) < EPSILON).all()
    if scale == "negative" and scope == "logits":
        # (s + b) c with c < 0: a bias falling with distance makes the far past the largest logits,
        # and nothing can be left out; a bound blind to the sign would leave out parts that carry rows
        assert skipped == 0 and (_sign_blind_would_drop(q, k, inputs) & (mass > 1e-3)).any()
    else:
        assert 0 < skipped < total  # the case tests something: steep heads leave their far past out


@pytest.mark.parametrize("path", ["blockwise", "native"])
@torch.inference_mode()
def test_the_adversarial_block_is_kept_and_the_row_is_right(path):
    if path == "native" and not NATIVE:
        pytest.skip(f"the C++ kernel did not build here: {NATIVE_WHY}")
    q, k, v, inputs = _adversarial()
    weights = torch.softmax(_row_logits(q, k, inputs)[0, 0, 0], -1)
    assert weights[5] > 0.99  # leaving key 5's block out would lose nearly all of the row
    high, low = block_bias_range(inputs.bias_table, 1999, 1, torch.tensor([0]), 64)  # key 5's block of 64
    lower = _row_logits(q, k, inputs)[0, 0, 0, -64:].amax().float()[None]  # the diagonal block's largest logit
    bias_only = logit_upper_bound(torch.tensor(0.0), torch.tensor(0.0), high[0], low[0])
    assert negligible(bias_only, lower, torch.tensor([1999])).item()  # by its bias alone, the block would go
    out, (skipped, total) = _counted(path, q, k, v, inputs)
    assert torch.allclose(out, dense_attention(q, k, v, inputs), atol=1e-5)
    assert 0 < skipped < total - 1  # blocks between were left out (bias far down, content small); key 5's was not


def test_rows_record_the_blocks_left_out(tmp_path):
    import bamctl

    common = dict(lengths=[2048], samples=1, depths=[0.5], quiet=True, dtype="float32")
    auto = bamctl.evaluate("alibi", "passkey", attention="blockwise", dir=tmp_path / "a", **common)
    off = bamctl.evaluate("alibi", "passkey", attention="blockwise", block_skip="off", dir=tmp_path / "b", **common)
    dense = bamctl.evaluate("alibi", "passkey", attention="dense", dir=tmp_path / "c", **common)
    assert (auto["skipped_blocks"] > 0).all() and (auto["skipped_blocks"] < auto["key_blocks"]).all()
    assert (off["skipped_blocks"] == 0).all() and (off["key_blocks"] == auto["key_blocks"]).all()
    assert dense["skipped_blocks"].isna().all() and dense["key_blocks"].isna().all()
    assert list(auto["predicted"]) == list(off["predicted"]) == list(dense["predicted"])
    assert auto["compute_version"].iloc[0] == off["compute_version"].iloc[0]  # one code, either mode
    if NATIVE:  # the default path on a CPU counts too
        default = bamctl.evaluate("alibi", "passkey", dir=tmp_path / "d", **common)
        assert (default["attention"] == "native").all() and (default["skipped_blocks"] > 0).all()
        assert list(default["predicted"]) == list(dense["predicted"])


SHIPPED_BIAS = ["alibi", "alibi-ssmax", "kerple", "t5", "bam", "bam-ssmax", "lm-alibi", "lm-bam", "lm-bam-ssmax",
                "lm-kerple", "lm-t5"]


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", SHIPPED_BIAS)
@pytest.mark.parametrize("length", [4096, 16384])
@torch.inference_mode()
def test_shipped_bias_models_keep_their_rows_at_long_contexts(name, length, path):
    from bamctl.catalog import resolve_model

    model = resolve_model(name).model
    generator = torch.Generator().manual_seed(length)
    subset = model.config.token_subset
    pool = torch.tensor(subset if subset is not None else range(model.config.vocab_size))
    ids = pool[torch.randint(0, len(pool), (length,), generator=generator)].tolist()
    auto = StreamingEngine(model, device="cpu", dtype="float32", attention=path)
    dense = StreamingEngine(model, device="cpu", dtype="float32", attention="dense", chunk_size=512)
    _assert_rows_equal(auto, dense, ids)
    assert auto.last_block_counts[0][1] > 0


# -- FlexAttention: a per-head block mask from the same bound (on the CPU, flex's eager form) --

from bamctl.engine import flex  # noqa: E402

needs_flex = pytest.mark.skipif(not flex.flex_available()[0], reason="FlexAttention needs torch >= 2.5 on CUDA or an x86 CPU")


@pytest.mark.parametrize("scale", [None, "positive", "negative"])
@pytest.mark.parametrize("scope", ["logits", "content"])
@torch.inference_mode()
def test_the_flex_mask_leaves_out_less_than_epsilon_of_every_row(scale, scope):
    g = torch.Generator().manual_seed(11)
    keys, queries = 2048, 384  # query blocks 13..15 of 128; q_start = 1664
    q = torch.randn(2, HEADS, queries, DIM, generator=g)
    k = torch.randn(2, HEADS, keys, DIM, generator=g)
    scales = {None: None, "positive": torch.rand(HEADS, generator=g) * 0.3 + 0.05,
              "negative": -(torch.rand(HEADS, generator=g) * 0.3 + 0.05)}[scale]
    inputs = AttentionInputs(keys - queries, _table("ggd", keys), scales, scope)
    skip = flex.skipping_blocks(q, k, inputs, queries)  # (B, H, Qb, KVb)
    assert skip.shape == (2, HEADS, 3, 16)
    diagonal = torch.arange(13, 16)
    assert not skip[..., diagonal[:, None] <= torch.arange(16)[None, :]].any()  # the diagonal and beyond: never
    logits = _row_logits(q, k, inputs)  # (B, H, Tq, Tk)
    left_out = skip.repeat_interleave(128, 2).repeat_interleave(128, 3)  # (B, H, Tq, Tk)
    mass = torch.logsumexp(logits.masked_fill(~left_out, float("-inf")), -1) - torch.logsumexp(logits, -1)
    assert (mass < math.log(EPSILON)).all()
    if scale == "negative" and scope == "logits":  # as on the other paths: nothing to leave out, but the sign matters
        assert not skip.any() and (_sign_blind_would_drop(q, k, inputs) & (_part_mass(q, k, inputs) > 1e-3)).any()
    else:
        assert skip.any()


@needs_flex
@pytest.mark.parametrize("pe", ["alibi", "bam-ssmax", "t5"])
@torch.inference_mode()
def test_flex_skipping_gives_the_dense_rows(pe, eager_flex):
    model = _steep(random_model(pe, seed=6))
    ids = tokens(1100, seed=6)
    engine = StreamingEngine(model, device="cpu", dtype="float32", chunk_size=256, attention="flex")
    off = StreamingEngine(model, device="cpu", dtype="float32", chunk_size=256, attention="flex", block_skip="off")
    dense = StreamingEngine(model, device="cpu", dtype="float32", chunk_size=256, attention="dense")
    _assert_rows_equal(engine, dense, ids)
    skipped, total = engine.last_block_counts[0]
    off.token_nll(ids)
    assert off.last_block_counts[0] == (0, total)
    if pe != "t5":
        assert skipped > 0


@needs_flex
@torch.inference_mode()
def test_flex_keeps_the_adversarial_block(eager_flex):
    # 128 queries at 1792..1919, all aligned with key 5 (s = 400, bias about -350 there): it carries
    # the rows, and only the bound's content term keeps its block in the mask.
    q, k, v, inputs = _adversarial()
    q = q.expand(1, 1, 128, q.shape[-1]).contiguous()
    inputs = AttentionInputs(1792, inputs.bias_table, None)
    weights = torch.softmax(_row_logits(q, k[:, :, :1920], inputs)[0, 0], -1)
    assert (weights[:, 5] > 0.99).all()
    skip = flex.skipping_blocks(q, k[:, :, :2048] if k.shape[2] >= 2048 else torch.nn.functional.pad(k, (0, 0, 0, 48)), inputs, 128)
    assert not skip[0, 0, 0, 0] and skip[0, 0, 0].any()  # key 5's block kept, blocks between left out
    cache_k, cache_v = (torch.nn.functional.pad(t, (0, 0, 0, 48)) for t in (k, v))  # 2048: whole blocks
    counts = BlockCounts()
    out = flex.flex_attention_kernel(q, cache_k[:, :, :1920], cache_v[:, :, :1920], inputs, block_skip="auto", counts=counts)
    assert counts.take() == [(int(skip.sum()), 15)]  # the flex path ran: 15 key blocks up to the diagonal
    assert torch.allclose(out, dense_attention(q, k[:, :, :1920], v[:, :, :1920], inputs), atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name, task", [("alibi", "passkey"), ("bam-ssmax", "passkey"), ("lm-bam", "niah_single_1"),
                                        ("lm-bam-ssmax", "niah_multikey_2"), ("lm-bam", "ppl"), ("lm-alibi", "ppl")])
@pytest.mark.parametrize("length", [4096, 16384])
def test_shipped_rows_with_skipping_are_the_dense_rows(name, task, length, tmp_path):
    """Result rows, as a run stores them: the default path (native on a CPU, skipping on) against
    dense, which skips nothing: the same answers (greedy generations on RULER) and window NLLs."""
    import bamctl

    common = dict(task=task, lengths=[length], samples=1, quiet=True, dtype="float32")
    skipping = bamctl.evaluate(name, dir=tmp_path / "auto", **common)
    dense = bamctl.evaluate(name, attention="dense", dir=tmp_path / "dense", **common)
    order = [c for c in ("depth", "seed", "sample", "position") if c in dense.columns]
    skipping, dense = (rows.sort_values(order).reset_index(drop=True) for rows in (skipping, dense))
    assert skipping["skipped_blocks"].sum() > 0 and dense["skipped_blocks"].isna().all()
    assert list(skipping["predicted"]) == list(dense["predicted"])
    if task == "ppl":  # a window's perplexity and summed NLL: the engine's tolerance
        for column in ("score", "nll"):
            assert ((skipping[column] - dense[column]).abs() <= RELATIVE * dense[column].abs()).all()
    else:
        assert list(skipping["score"]) == list(dense["score"])


@pytest.mark.slow
@pytest.mark.skipif(not NATIVE, reason=f"no C++ kernel: {NATIVE_WHY}")
@pytest.mark.parametrize("name", SHIPPED_BIAS)
@torch.inference_mode()
def test_shipped_bias_models_keep_their_rows_at_64k(name):
    """At 64k, skipping against the same native kernel reading every block (``off``), which the
    4k and 16k cases above hold to dense: dense itself at 64k costs minutes a model."""
    from bamctl.catalog import resolve_model

    model = resolve_model(name).model
    subset = model.config.token_subset
    pool = torch.tensor(subset if subset is not None else range(model.config.vocab_size))
    ids = pool[torch.randint(0, len(pool), (65536,), generator=torch.Generator().manual_seed(64))].tolist()
    auto = StreamingEngine(model, device="cpu", dtype="float32", attention="native")
    off = StreamingEngine(model, device="cpu", dtype="float32", attention="native", block_skip="off")
    _assert_rows_equal(auto, off, ids, window=1024)
    assert off.last_block_counts[0][0] == 0


# -- what skipped_blocks and key_blocks count: one kind of unit, each path's tile -------------------

# Each path's tile (query rows, keys) as docs/SCHEMA.md names it; native's rows follow the call's queries.
TILES = {"blockwise": ("blockwise 512 queries × 1,024 keys", lambda tq: (512, 1024)),
         "native": ("native 32, 64 or 256 queries (by the call's queries) × 512 keys",
                    lambda tq: (256 if tq >= 768 else 64 if tq >= 192 else 32, 512)),
         "flex": ("flex 128 × 128", lambda tq: (128, 128))}


@pytest.mark.parametrize("path, tq", [("blockwise", 900), ("blockwise", 128), ("native", 900), ("native", 300),
                                      ("native", 128), pytest.param("flex", 128, marks=needs_flex)])
@torch.inference_mode()
def test_every_path_counts_tiles_of_the_size_the_schema_names(path, tq, request):
    """``key_blocks``: every (head, query block, key block) tile up to each query block's last query,
    at the path's tile size as docs/SCHEMA.md says it, with skipping on or off."""
    import re
    from pathlib import Path

    if path == "native" and not NATIVE:
        pytest.skip(f"the C++ kernel did not build here: {NATIVE_WHY}")
    said, size = TILES[path]
    doc = (Path(__file__).resolve().parents[1] / "docs" / "SCHEMA.md").read_text()
    assert said in re.search(r"^\| `skipped_blocks` .*$", doc, re.M).group(0)
    q_start, heads = 1792, HEADS
    rows, cols = size(tq)
    expected = heads * sum(-(-(q_start + min(r0 + rows, tq)) // cols) for r0 in range(0, tq, rows))
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, heads, tq, DIM, generator=g)
    k, v = (torch.randn(1, heads, 4096, DIM, generator=g) for _ in range(2))  # a cache, of whole blocks
    k, v = k[:, :, : q_start + tq], v[:, :, : q_start + tq]
    inputs = AttentionInputs(q_start, _table("ggd", 4096).detach(), None)
    for mode in ("off", "auto"):
        if path == "flex":
            request.getfixturevalue("eager_flex")
            counts = BlockCounts()
            flex.flex_attention_kernel(q, k, v, inputs, block_skip=mode, counts=counts)
            counted = counts.take()[0]
        elif path == "native":
            counted = tuple(int(x) for x in native.native_attention_blocks(q, k, v, inputs, mode)[1].sum(0))
        else:
            counts = BlockCounts()
            blockwise_attention(q, k, v, inputs, block_skip=mode, counts=counts)  # the engine's block size
            counted = counts.take()[0]
        assert counted[1] == expected, (mode, counted, expected)
