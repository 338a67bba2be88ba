"""Batches in the engine: a batch's rows are the rows of its sequences run alone.

Same argmax, |delta log p| <= 1e-5, on every attention path, for several chunk sizes, with
sequences of equal and of unequal lengths (right-padded for scoring, grouped by length
for generation).
"""

from functools import partial

import pytest
import torch

from bamctl.checkpoint import new_random_model
from bamctl.backends.base import AUTO_BATCH_MOST, auto_batch_size
from bamctl.engine.flex import flex_available
from bamctl.engine.stream import StreamingEngine
from bamctl.errors import BamctlError
from bamctl.model import ModelConfig

VOCAB = 101
TOLERANCE = 1e-5
PATHS = ["dense", "blockwise", "fused", "native"]


def random_model(pe: str, seed: int = 0, negative_scale: bool = False):
    model = new_random_model(ModelConfig.from_preset("micro", pe, vocab_size=VOCAB), seed)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # positional parameters off their init, so they matter
        for name, param in model.named_parameters():
            if ".prior." in name or "ssmax_scale" in name:
                param.copy_(torch.empty_like(param).uniform_(-0.8, 0.8, generator=generator) + (1.0 if "ssmax" in name else 0.0))
            if negative_scale and "ssmax_scale" in name:
                param[0] = -0.6  # as the shipped rope-ssmax and alibi-ssmax learnt
    return model


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def engine_for(model, path: str, chunk_size: int) -> StreamingEngine:
    return StreamingEngine(model, device="cpu", dtype="float32", chunk_size=chunk_size, attention=path)


def assert_rows_equal(batched, alone):
    for (predicted, logprobs), (predicted_alone, logprobs_alone) in zip(batched, alone, strict=True):
        assert predicted == predicted_alone
        assert max(abs(a - b) for a, b in zip(logprobs, logprobs_alone, strict=True)) <= TOLERANCE


RAGGED = [(37, 5), (45, 3), (20, 6), (45, 5)]  # (prompt tokens, answer tokens): two share a length
EQUAL = [(40, 5)] * 4


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("chunk_size", [5, 16, 64])
@pytest.mark.parametrize("shape", [RAGGED, EQUAL], ids=["ragged", "equal"])
def test_batched_continuations_equal_each_run_alone(path, chunk_size, shape):
    model = random_model("bam-ssmax")
    engine = engine_for(model, path, chunk_size)
    requests = [(tokens(n, seed=i), tokens(m, seed=100 + i)) for i, (n, m) in enumerate(shape)]
    alone = [engine.score_continuation(prompt, target) for prompt, target in requests]
    assert_rows_equal(engine.score_continuations(requests), alone)


@pytest.mark.parametrize("pe", ["rope", "alibi", "nope-ssmax", "fire", "xpos", "sinusoidal"])
def test_batches_equal_rows_alone_for_other_encodings(pe):
    engine = engine_for(random_model(pe), "native", 16)
    requests = [(tokens(n, seed=i), tokens(m, seed=100 + i)) for i, (n, m) in enumerate(RAGGED)]
    alone = [engine.score_continuation(prompt, target) for prompt, target in requests]
    assert_rows_equal(engine.score_continuations(requests), alone)


@pytest.mark.parametrize("path", ["dense", "blockwise", "native"])
def test_batches_are_exact_for_a_negative_ssmax_scale(path):
    engine = engine_for(random_model("bam-ssmax", seed=2, negative_scale=True), path, 16)
    requests = [(tokens(n, seed=i), tokens(m, seed=100 + i)) for i, (n, m) in enumerate(RAGGED)]
    alone = [engine.score_continuation(prompt, target) for prompt, target in requests]
    assert_rows_equal(engine.score_continuations(requests), alone)


@pytest.mark.skipif(not flex_available()[0], reason="compiled FlexAttention needs CUDA or an x86 CPU")
def test_batched_continuations_on_flex():
    engine = engine_for(random_model("bam-ssmax"), "flex", 128)
    requests = [(tokens(n, seed=i), tokens(m, seed=100 + i)) for i, (n, m) in enumerate(RAGGED)]
    alone = [engine.score_continuation(prompt, target) for prompt, target in requests]
    assert_rows_equal(engine.score_continuations(requests), alone)


def test_small_fused_blocks_and_tiles_batch_exactly():
    """The fused path's query blocks, mask tiles and merges, with a batch of several rows."""
    engine = engine_for(random_model("bam-ssmax"), "fused", 16)
    engine.kernel = partial(__import__("bamctl.engine.fused", fromlist=["x"]).fused_attention, rows=4, tile=6)
    requests = [(tokens(n, seed=i), tokens(m, seed=100 + i)) for i, (n, m) in enumerate(RAGGED)]
    alone = [engine.score_continuation(prompt, target) for prompt, target in requests]
    assert_rows_equal(engine.score_continuations(requests), alone)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("chunk_size", [7, 64])
def test_batched_token_nlls_equal_each_run_alone(path, chunk_size):
    engine = engine_for(random_model("rope-ssmax", seed=1), path, chunk_size)
    requests = [(tokens(45, 1), 1), (tokens(30, 2), 0), (tokens(45, 3), 20), (tokens(1, 4), 1), (tokens(12, 5), 12)]
    batched = engine.token_nlls(requests)
    for (ids, score_from), got in zip(requests, batched, strict=True):
        want = engine.token_nll(ids, score_from)
        assert got.shape == want.shape == (len(ids) - score_from,)
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.allclose(got.nan_to_num(), want.nan_to_num(), atol=TOLERANCE, rtol=0)


def test_a_bad_score_from_is_refused_for_the_whole_batch():
    engine = engine_for(random_model("rope"), "native", 16)
    with pytest.raises(ValueError, match="score_from"):
        engine.token_nlls([(tokens(10, 1), 1), (tokens(5, 2), 6)])


@pytest.mark.parametrize("path", PATHS)
def test_batched_generation_equals_each_run_alone(path):
    engine = engine_for(random_model("bam-ssmax", seed=4), path, 8)
    prompts = [tokens(20, 1), tokens(33, 2), tokens(20, 3), tokens(5, 4)]  # two groups of one length, two alone
    stop = engine.generate(prompts[0], 6)[2]  # a token that stops the first prompt after three
    alone = [engine.generate(prompt, 6, stop_ids=(stop,)) for prompt in prompts]
    assert alone[0] == engine.generate(prompts[0], 6)[:3]
    assert engine.generate_many(prompts, 6, stop_ids=(stop,)) == alone
    assert engine.generate_many(prompts, 0) == [[], [], [], []]


def test_auto_batches_fill_a_token_budget_and_never_pass_memory():
    assert auto_batch_size(128, fitting=10_000, device_type="cpu") == AUTO_BATCH_MOST
    assert auto_batch_size(8192, fitting=10_000, device_type="cpu") == 2
    assert auto_batch_size(512 * 1024, fitting=10_000, device_type="cpu") == 1
    assert auto_batch_size(128, fitting=3, device_type="cpu") == 3
    assert auto_batch_size(128, fitting=0, device_type="cpu") == 1  # check_fits refuses it first


def test_engine_batch_limit_and_a_batch_that_cannot_fit(monkeypatch):
    from bamctl import devices

    engine = engine_for(random_model("bam-ssmax"), "native", 2048)
    assert engine.largest_batch(128) > AUTO_BATCH_MOST and engine.largest_batch(512 * 1024) >= 1
    monkeypatch.setattr(devices, "available_bytes", lambda device: 1 << 30)
    assert engine.largest_batch(8 << 20) == 0  # not one of 8M tokens in 1 GiB
    monkeypatch.setattr(devices, "available_bytes", lambda device: 4 << 30)
    engine.check_fits(64 * 1024, batch=2)
    with pytest.raises(BamctlError, match=r"--batch-size 64: .* fit; use --batch-size \d+ or auto"):
        engine.check_fits(256 * 1024, batch=64)


def test_the_shipped_model_runs_512k_alone_and_short_prompts_in_full_batches():
    from bamctl.backends import RunOptions, open_backend

    backend = open_backend("bam-ssmax", RunOptions(device="cpu"))
    assert backend.batch_limit(512 * 1024, 16) == 1
    assert backend.batch_limit(8192, 16) == 1 and backend.batch_limit(2048, 16) == 7
    assert backend.batch_limit(128, 16) == AUTO_BATCH_MOST
