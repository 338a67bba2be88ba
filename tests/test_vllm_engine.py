"""Real vLLM (its CPU build here, its CUDA build on a GPU) against transformers, on the same requests.

Marker ``vllm``: these start real vLLM engines, in the environment ``bash scripts/setup.sh --vllm``
makes (vLLM pins its own transformers); ``bash scripts/test.sh --vllm`` runs them, and they skip
where vLLM is not installed. The model is a random tiny Llama built offline with a 1,024-id BPE
vocabulary (``tests/tiny_llama.py``), 64-wide heads (vLLM's CPU attention supports 64, not 16),
1,024 positions. The reference is ``hf:`` on the same folder, in the same dtype: transformers' own
forward and ``generate``, which ``test_external_hf.py`` holds to the plain model.

The tolerances are what was measured on this model in float32 (both back-ends on the CPU), with
room: per target token 4.3e-5 nats, per 5-token answer 6.0e-5, per perplexity token 7.7e-5 and
per 256-token window 4.9e-4 (float32 kernels that sum in another order; the weights are scaled
up 8x, so logits are large). Batching changed no number at all; prefix caching (keys and values
of a shared prefix read from cache instead of recomputed) moved log-probs by 2.9e-6 at most.

Each engine start costs 30-60 s on 2 cores, so the engines are opened once per module.
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from bamctl.answers import ANSWERS
from bamctl.backends import RunOptions, open_backend
from bamctl.tasks.registry import plan_samples
from tiny_llama import save_tiny_llama

NO_VLLM = "vLLM not installed: bash scripts/setup.sh --vllm makes its environment, bash scripts/test.sh --vllm runs these"
pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason=NO_VLLM)]

LIMIT = 1024  # vt's prompt alone needs ~740 tokens of this vocabulary
TOKEN_TOL = 2e-4  # nats per target token (measured 4.3e-5)
ANSWER_TOL = 3e-4  # nats per answer's summed log-probability (measured 6.0e-5)
CACHE_TOL = 2e-5  # nats per target token, cached prefix blocks against none (measured 1.9e-6 and 2.9e-6)
WINDOW_TOL = 2e-3  # nats per window's summed NLL over 256 tokens (measured 4.9e-4)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("bpe-llama"), hidden=256, max_positions=LIMIT, seed=1, vocab="bpe")


@pytest.fixture(scope="module")
def vllm_fp32(folder):
    backend = open_backend(f"vllm:{folder}", RunOptions(dtype="float32"))
    backend.check_fits(LIMIT, 5)  # sized once for everything below, started before any request
    backend.prepare()
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def hf_fp32(folder, vllm_fp32):
    return open_backend(f"hf:{folder}", RunOptions(device=vllm_fp32.device, dtype="float32"))


def samples(task: str, lengths, backend, n: int = 2, depths=None, **options):
    plan = plan_samples(task, lengths, n, [0, 1], backend.tokenizer, depths, bos_for=backend.bos_for, **options)
    return list(plan.samples())


def test_both_back_ends_run_the_model_in_float32_on_one_device(vllm_fp32, hf_fp32):
    assert (vllm_fp32.kind, vllm_fp32.dtype, hf_fp32.dtype) == ("vllm", "float32", "float32")
    from vllm.platforms import current_platform

    assert vllm_fp32.device == ("cpu" if current_platform.is_cpu() else "cuda")
    assert vllm_fp32._llm.llm_engine.model_config.dtype == torch.float32  # what the engine itself runs


def test_passkey_teacher_forced_log_probs_agree_per_token_and_per_answer(vllm_fp32, hf_fp32):
    batch = samples("passkey", [128, 256], vllm_fp32, depths=[0.0, 0.5, 1.0])
    assert len(batch) == 24 and {len(s.answer_ids) for s in batch} == {5}  # protocol exact: the answer is the key
    requests = [(s.input_ids, s.answer_ids) for s in batch]  # what a run feeds
    ours, theirs = vllm_fp32.score_continuations(requests), hf_fp32.score_continuations(requests)
    token_gap = max(abs(a - b) for x, y in zip(ours, theirs) for a, b in zip(x.logprobs, y.logprobs))
    answer_gap = max(abs(sum(x.logprobs) - sum(y.logprobs)) for x, y in zip(ours, theirs))
    assert token_gap <= TOKEN_TOL and answer_gap <= ANSWER_TOL, (token_gap, answer_gap)
    assert [x.predicted_ids for x in ours] == [y.predicted_ids for y in theirs]
    # the rows a run writes from them: the same predictions and scores
    rows = ANSWERS["teacher_forced"](vllm_fp32, batch), ANSWERS["teacher_forced"](hf_fp32, batch)
    assert [[r["predicted"], r["score"]] for rs in rows[0] for r in rs] == [[r["predicted"], r["score"]] for rs in rows[1] for r in rs]


@pytest.mark.parametrize("task", ["niah_single_1", "vt"])
def test_ruler_greedy_generations_are_token_identical(vllm_fp32, hf_fp32, task):
    shortest = {"niah_single_1": 320, "vt": 768}[task]  # each task's shortest prompt with this vocabulary
    batch = samples(task, [shortest, LIMIT], vllm_fp32, n=2)
    prompts = [s.input_ids for s in batch]
    budget = batch[0].max_new_tokens
    ours, theirs = vllm_fp32.generate_many(prompts, budget), hf_fp32.generate_many(prompts, budget)
    assert ours == theirs
    assert all(len(ids) > 0 for ids in ours)


def test_sliding_window_perplexity_agrees_per_window(vllm_fp32, hf_fp32):
    batch = samples("ppl", [128, 256], vllm_fp32, n=1, stride=64, doc_tokens=LIMIT)
    assert len(batch) >= 8
    ours, theirs = ANSWERS["nll"](vllm_fp32, batch), ANSWERS["nll"](hf_fp32, batch)
    for sample, mine, reference in zip(batch, ours, theirs, strict=True):
        for a, b in zip(mine, reference, strict=True):
            assert a["n_scored"] == b["n_scored"] > 0
            assert math.isclose(a["nll"], b["nll"], abs_tol=WINDOW_TOL), (sample.length, a["nll"], b["nll"])
    per_token = [vllm_fp32.token_nll(s.input_ids, 1) - hf_fp32.token_nll(s.input_ids, 1) for s in batch[:3]]
    assert max(float(d[~d.isnan()].abs().max()) for d in per_token) <= TOKEN_TOL


def test_a_batch_answers_as_each_request_alone(vllm_fp32):
    batch = samples("passkey", [256], vllm_fp32, n=3, depths=[0.25, 0.75])
    requests = [(s.input_ids, s.answer_ids) for s in batch]
    assert vllm_fp32.score_continuations(requests) == [vllm_fp32.score_continuation(*r) for r in requests]
    prompts = [s.input_ids[:200] for s in batch]
    assert vllm_fp32.generate_many(prompts, 6) == [vllm_fp32.generate(p, 6) for p in prompts]
    together = vllm_fp32.token_nlls([(s.input_ids, 1) for s in batch])
    for sample, nll in zip(batch, together):
        torch.testing.assert_close(nll, vllm_fp32.token_nll(sample.input_ids, 1), rtol=0, atol=0, equal_nan=True)


def test_prefix_caching_changes_no_number(folder, vllm_fp32):
    from bamctl.backends.base import VLLMOptions
    from bamctl.backends.vllm import VLLMBackend

    # depths of one key share the haystack before the needle: the second pass reads cached blocks
    batch = samples("passkey", [LIMIT - 8], vllm_fp32, n=2, depths=[0.5, 0.75, 1.0])
    requests = [(s.input_ids, s.answer_ids) for s in batch]
    vllm_fp32.score_continuations(requests)
    cached = vllm_fp32.score_continuations(requests)
    plain = VLLMBackend(str(folder), VLLMOptions(dtype="float32", prefix_caching=False))
    plain.check_fits(LIMIT, 5)
    fresh = plain.score_continuations(requests)
    assert [x.predicted_ids for x in fresh] == [y.predicted_ids for y in cached]
    gap = max(abs(a - b) for x, y in zip(fresh, cached) for a, b in zip(x.logprobs, y.logprobs))
    print(f"prefix caching on against off: largest log-prob difference {gap:.2e}")
    assert gap <= CACHE_TOL, gap
    assert plain._llm.llm_engine.vllm_config.cache_config.enable_prefix_caching is False
    assert vllm_fp32._llm.llm_engine.vllm_config.cache_config.enable_prefix_caching is True
    plain.close()


def test_a_compare_records_what_ran_and_what_was_cut_at_the_limit(folder, tmp_path, capsys):
    """One run of both back-ends as a user types it: ``--dtype auto`` recorded as vLLM resolves it
    (bfloat16 for this float32 model on the CPU build), the caption saying the dtypes differ, the
    engine's start kept out of every row's seconds, and a prompt of exactly the model's limit cut
    alike on both (the BOS and the answer tokens fed before the last take it past its 1,024 positions)."""
    import pandas as pd
    from vllm.config import ModelConfig

    from bamctl.cli import main

    out = tmp_path / "results"
    with pytest.raises(SystemExit) as done:
        main(["compare", f"hf:{folder}", f"vllm:{folder}", "--task", "passkey", "--lengths", f"256,{LIMIT}",
              "--samples", "2", "--depths", "0.5", "--dir", str(out)])
    printed = capsys.readouterr()
    assert done.value.code == 0, printed.err[-3000:]
    rows = pd.read_parquet(out)
    expected = str(ModelConfig(model=str(folder), tokenizer=str(folder), dtype="auto").dtype).removeprefix("torch.")
    by_backend = rows.groupby("backend")["dtype"].unique().to_dict()
    assert [list(v) for v in (by_backend["hf"], by_backend["vllm"])] == [["float32"], [expected]]
    assert "engine ready in" in printed.err
    at_limit = rows[rows["length"] == LIMIT].sort_values(["seed", "sample"])
    cut = {kind: list(at_limit[at_limit["backend"] == kind]["dropped_tokens"]) for kind in ("hf", "vllm")}
    assert cut["hf"] == cut["vllm"] and len(cut["hf"]) == 2 and min(cut["hf"]) > 0, cut
    assert set(at_limit["bos"]) == {True}
    assert (rows[rows["length"] == 256]["dropped_tokens"] == 0).all()
    assert "prompt tokens left out from the start" in printed.err
    if expected != "float32":
        assert f"ran in {expected}" in printed.out.replace("\n", " ")
    assert rows[rows["backend"] == "vllm"]["seconds"].max() < 20  # an engine start is 30 s and more
