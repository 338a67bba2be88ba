"""Attention over a bfloat16 KV cache (``--dtype bfloat16``): the same answers, the same certificate.

The kernels compute in float32 on the cache's own values: the native kernel widens each bfloat16
key and value block as it reads it (exact: every bfloat16 is a float32), blockwise and flex cast
their tiles. So a bfloat16 cache gives, bit for bit, what the float32 copy of its values gives;
against a float32 model its answers differ only by the rounding of the inputs to bfloat16; and
certified skipping bounds the logits from the rounded keys, the ones the products read.
"""

from __future__ import annotations

import math

import pytest
import torch

from bamctl.attention_math import AttentionInputs, dense_attention, ssmax_factor
from bamctl.engine import block_skip, native
from bamctl.engine.attention import blockwise_attention
from bamctl.engine.block_skip import BlockCounts
from bamctl.engine.flex import skipping_blocks
from test_cpu_kernels import HEAD_DIM, HEADS, prior_table

native_only = pytest.mark.skipif(not native.native_available()[0], reason=native.native_available()[1] or "no kernel")

SHAPES = [(1, 700, 700), (2, 900, 300), (1, 513, 1), (1, 2000, 1000)]  # (batch, keys, queries)
CASES = [  # (with_prior, ssmax, scope)
    (False, False, "logits"), (True, False, "logits"), (True, True, "logits"), (True, True, "content"),
]
BF16_UNIT = 2.0 ** -8  # bfloat16's relative rounding: half its 2^-7 spacing


def _case(batch, keys, queries, with_prior, ssmax, scope, seed=0):
    g = torch.Generator().manual_seed(seed + keys + queries)
    q = torch.randn(batch, HEADS, queries, HEAD_DIM, generator=g)
    k, v = (torch.randn(batch, HEADS, keys, HEAD_DIM, generator=g) for _ in range(2))
    inputs = AttentionInputs(
        q_start=keys - queries,
        bias_table=prior_table(keys) if with_prior else None,
        ssmax_scale=torch.rand(HEADS, generator=g) + 0.5 if ssmax else None,
        ssmax_scope=scope,
    )
    return q, k, v, inputs


@native_only
@pytest.mark.parametrize("batch,keys,queries", SHAPES)
@pytest.mark.parametrize("with_prior,ssmax,scope", CASES)
@pytest.mark.parametrize("skip", ["auto", "off"])
@torch.inference_mode()
def test_native_reads_a_bfloat16_cache_as_the_float32_copy_of_its_values(batch, keys, queries, with_prior, ssmax, scope, skip):
    """The widened tiles are the float32 values, and the products, the prior, SSMax and the online
    softmax run the same float32 operations on them; the blocks left out too. (Bit for bit with
    this machine's BLAS; a BLAS may round a product differently by the alignment of its operands,
    the tile's against the cache's, so the test allows float32's rounding.)"""
    q, k, v, inputs = _case(batch, keys, queries, with_prior, ssmax, scope)
    k, v = k.bfloat16(), v.bfloat16()
    got, got_blocks = native.native_attention_blocks(q, k, v, inputs, skip)
    wide, wide_blocks = native.native_attention_blocks(q, k.float(), v.float(), inputs, skip)
    assert got.dtype == torch.float32  # the queries' dtype
    assert (got - wide).abs().max() <= 1e-6
    assert torch.equal(got_blocks, wide_blocks)
    # and that float32 computation is the reference's on the rounded values
    expected = dense_attention(q, k.float(), v.float(), inputs)
    assert (got - expected).abs().max() < 1e-4


@native_only
def test_native_reads_strided_bfloat16_keys_row_by_row():
    """A cache view whose rows are not packed (keys of a wider buffer) is read row by row."""
    q, k, v, inputs = _case(1, 900, 300, True, True, "logits")
    wide_k, wide_v = (torch.cat([x, torch.full_like(x, 7.0)], -1).bfloat16() for x in (k, v))
    ks, vs = wide_k[..., :HEAD_DIM], wide_v[..., :HEAD_DIM]  # row stride 2 Dh
    assert ks.stride(2) == 2 * HEAD_DIM
    got = native.native_attention(q, ks, vs, inputs)
    assert (got - native.native_attention(q, ks.float(), vs.float(), inputs)).abs().max() <= 1e-6


@pytest.mark.parametrize("kernel", [pytest.param("native", marks=native_only), "blockwise"])
@pytest.mark.parametrize("with_prior,ssmax,scope", CASES)
@torch.inference_mode()
def test_within_bfloat16_rounding_of_the_float32_reference(kernel, with_prior, ssmax, scope):
    """Against dense float32 attention on the unrounded inputs, with a prior and SSMax: what a
    bfloat16 model's attention may differ by. Each of q, k, v moves by at most 2^-8 of itself, so a
    content score moves by about 2^-8 of |q| |k| / sqrt(Dh) (~1 here), SSMax's factor c_h(i)
    multiplies that in the logits, and a weight moves by that fraction of itself: the output, a
    weighted mean of values, by about 2^-8 max |v| max(1, |c|). Measured: up to 0.35 of that
    without SSMax and 0.59 with it; the test allows twice it."""
    q, k, v, inputs = _case(1, 2000, 1000, with_prior, ssmax, scope)
    expected = dense_attention(q, k, v, inputs)
    run = {"native": native.native_attention, "blockwise": blockwise_attention}[kernel]
    got = run(q.bfloat16(), k.bfloat16(), v.bfloat16(), inputs).float()
    error = (got - expected).abs().max().item()
    factor = ssmax_factor(inputs, q.shape[2], q.device).abs().max().item() if ssmax else 1.0
    assert error < 2 * BF16_UNIT * v.abs().max().item() * max(1.0, factor), error
    # not vacuous: the inputs' rounding shows (a kernel that kept float32 inputs would not be bfloat16's)
    assert error > 0.1 * BF16_UNIT


# The bound in the precision the scores are computed in. Queries q = 8000 sqrt(Dh) e1 (a bfloat16),
# so |q| / sqrt(Dh) = 8000 and a key along e1 scores 8000 times its length. One far key (position 3,
# in a key block wholly in the queries' past) of float32 length 1 + 2^-8 + 2^-12, which bfloat16
# rounds up to 1 + 2^-7; the keys of the last 128 positions of length 1, each query's own key with a
# bias of 80 (distance 0), so every row's largest logit is 8080; every other key zero. The far
# block's margin is 40 ln 2 + ln(i + 1) <= 34.66 nats, plus a slack of 1e-5 of the logits (0.16):
# from the float32 key its bound 8033.2 + 34.82 < 8080 and the block may go; from the rounded key,
# 8062.5 + 34.82 > 8080 and it must stay: the key's weight there, e^-17.5, is far above the 2^-40
# skipping may leave out.
KEYS = 1024
FAR, FAR_LENGTH, ROUNDED_FAR_LENGTH = 3, 1.0 + 2.0 ** -8 + 2.0 ** -12, 1.0 + 2.0 ** -7
Q_NORM, OWN_KEY_BIAS = 8000.0, 80.0
TOP = Q_NORM + OWN_KEY_BIAS  # every row's largest logit: its own key


def _bound_case(queries: int = 1):
    """The case above, for the last ``queries`` positions."""
    q = torch.zeros(1, 1, queries, HEAD_DIM)
    q[..., 0] = Q_NORM * math.sqrt(HEAD_DIM)
    k = torch.zeros(1, 1, KEYS, HEAD_DIM)
    k[0, 0, FAR, 0] = FAR_LENGTH
    k[0, 0, KEYS - 128 :, 0] = 1.0
    v = torch.randn(1, 1, KEYS, HEAD_DIM, generator=torch.Generator().manual_seed(5))
    table = torch.zeros(1, KEYS)
    table[0, 0] = OWN_KEY_BIAS
    return q, k, v, AttentionInputs(q_start=KEYS - queries, bias_table=table, ssmax_scale=None)


def _far_block_negligible(far_key_norm: float) -> bool:
    """bamctl.engine.block_skip's test for the far block at the last position, given its largest key."""
    upper = block_skip.logit_upper_bound(torch.tensor([Q_NORM]), torch.tensor([far_key_norm]), torch.zeros(1), torch.zeros(1))
    return bool(block_skip.negligible(upper, torch.tensor([TOP]), torch.tensor([KEYS - 1])).item())


def test_the_case_a_float32_bound_would_skip_matters_in_bfloat16():
    q, k, v, inputs = _bound_case()
    rounded = k.bfloat16().float()
    assert rounded[0, 0, FAR, 0].item() == ROUNDED_FAR_LENGTH and torch.equal(q.bfloat16().float(), q)
    assert _far_block_negligible(FAR_LENGTH)  # the float32 key's bound leaves the block out ...
    assert not _far_block_negligible(ROUNDED_FAR_LENGTH)  # ... the rounded key's keeps it
    # and it matters: as bfloat16 holds it, the far key's weight is above all that skipping may leave out
    logits = Q_NORM * rounded[0, 0, :, 0].double()
    logits[-1] += OWN_KEY_BIAS
    assert torch.softmax(logits, 0)[FAR].item() > block_skip.EPSILON


@native_only
@torch.inference_mode()
def test_native_skipping_bounds_the_keys_as_the_bfloat16_cache_holds_them():
    q, k, v, inputs = _bound_case()
    _, f32_blocks = native.native_attention_blocks(q, k, v, inputs, "auto")
    assert f32_blocks.tolist() == [[1, 2]]  # float32 keys: the far block goes, rightly for them
    got, blocks = native.native_attention_blocks(q.bfloat16(), k.bfloat16(), v.bfloat16(), inputs, "auto")
    assert blocks.tolist() == [[0, 2]]  # bfloat16 keys: their far block is read
    expected = dense_attention(q, k.bfloat16().float(), v.bfloat16().float(), inputs)
    assert torch.allclose(got.float(), expected, atol=2 * BF16_UNIT * v.abs().max().item(), rtol=0)


@torch.inference_mode()
def test_blockwise_and_flex_skipping_bound_the_keys_as_the_bfloat16_cache_holds_them():
    q, k, v, inputs = _bound_case()
    for keys, skipped in ((k, 1), (k.bfloat16(), 0)):
        counts = BlockCounts()
        blockwise_attention(q.to(keys.dtype), keys, v.to(keys.dtype), inputs, block_size=512, block_skip="auto", counts=counts)
        assert counts.take() == [(skipped, 2)], keys.dtype
    # flex tests tiles of 128 keys for query tiles of 128 rows: the far key's tile, from float32 keys only
    q, k, v, inputs = _bound_case(queries=128)
    assert skipping_blocks(q, k, inputs, 128)[0, 0, 0, FAR // 128].item()
    assert not skipping_blocks(q.bfloat16(), k.bfloat16(), inputs, 128)[0, 0, 0, FAR // 128].item()


@pytest.mark.parametrize("kernel", ["dense", pytest.param("native", marks=native_only), "blockwise", "fused"])
@torch.inference_mode()
def test_every_path_answers_in_the_queries_dtype(kernel):
    """A bfloat16 model's attention output is bfloat16 (its next projection takes it so): the
    float32 result rounded once, on every path the reference included."""
    from bamctl.engine.fused import fused_attention

    q, k, v, inputs = (x.bfloat16() if torch.is_tensor(x) else x for x in _case(1, 300, 300, True, True, "content"))
    run = {"dense": dense_attention, "native": native.native_attention, "blockwise": blockwise_attention,
           "fused": fused_attention}[kernel]
    got = run(q, k, v, inputs)
    assert got.dtype == torch.bfloat16
    expected = dense_attention(q.float(), k.float(), v.float(), inputs)
    assert expected.dtype == torch.float32
    assert (got.float() - expected).abs().max() <= 2 * BF16_UNIT * expected.abs().max()
