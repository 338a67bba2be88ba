"""``vllm:PATH`` without vLLM installed (the default suite). Real vLLM is held against
transformers in ``test_vllm_engine.py`` (marker ``vllm``, its own environment); here:

- without vLLM the prefix answers one line saying how to install it;
- with a stand-in ``vllm`` module that answers ``LLM.generate`` from a tiny Llama's own
  forward pass, the back-end's reading of ``prompt_logprobs`` and outputs is held to
  that forward (the request shapes are vLLM's: token prompts, ``SamplingParams``), and its
  engine sizing and batching to what it asked of ``LLM``.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from bamctl.backends import RunOptions, open_backend
from bamctl.errors import BamctlError
from tiny_llama import save_tiny_llama

def test_vllm_prefix_without_vllm_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "vllm", None)  # as if absent, even where it is installed
    with pytest.raises(BamctlError) as err:
        open_backend(f"vllm:{tmp_path}", RunOptions())
    message = str(err.value)
    assert "\n" not in message and "pip install 'bamctl[vllm]'" in message and "GPU" in message
    assert "scripts/setup.sh --vllm" in message  # the CPU build's way in


# -- a stand-in vllm module ---------------------------------------------------------------
@dataclass
class Logprob:
    logprob: float
    rank: int


class SamplingParams:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


class ModelConfig:
    """vllm.config.ModelConfig's dtype resolution, for a stand-in that runs models as stored (float32)."""

    def __init__(self, model: str, tokenizer: str, dtype: str):
        self.dtype = torch.float32 if dtype == "auto" else getattr(torch, dtype)


class FakeLLM:
    instances: list = []
    calls: list = []  # the prompts of each generate call

    def __init__(self, model: str, **kwargs):
        from transformers import AutoModelForCausalLM

        self.kwargs = kwargs
        self.model = AutoModelForCausalLM.from_pretrained(model, local_files_only=True).eval()
        asked = kwargs.get("dtype", "auto")
        dtype = torch.float32 if asked == "auto" else getattr(torch, asked)  # the stand-in computes as stored
        self.llm_engine = types.SimpleNamespace(model_config=types.SimpleNamespace(dtype=dtype))
        FakeLLM.instances.append(self)

    def _logits(self, ids):
        with torch.no_grad():
            return self.model(torch.tensor([ids])).logits[0].float()

    def generate(self, prompts, params, use_tqdm=True):
        FakeLLM.calls.append([list(prompt["prompt_token_ids"]) for prompt in prompts])
        each = params if isinstance(params, list) else [params] * len(prompts)  # vLLM takes one or one per prompt
        return [self._one(list(prompt["prompt_token_ids"]), own) for prompt, own in zip(prompts, each, strict=True)]

    def _one(self, ids, params):
        assert len(ids) + 1 <= self.kwargs["max_model_len"]  # vLLM refuses a prompt with no room for one output token
        prompt_logprobs = None
        if getattr(params, "prompt_logprobs", None) is not None:
            logprobs = torch.log_softmax(self._logits(ids), -1)
            prompt_logprobs = [None]
            for t in range(1, len(ids)):
                row = logprobs[t - 1]
                ranks = (row > row[ids[t]]).sum().item() + 1
                entry = {ids[t]: Logprob(row[ids[t]].item(), ranks)}
                if params.prompt_logprobs >= 1:
                    entry[int(row.argmax())] = Logprob(row.max().item(), 1)
                prompt_logprobs.append(entry)
        out, sequence = [], list(ids)
        for _ in range(params.max_tokens):
            out.append(int(self._logits(sequence)[-1].argmax()))
            sequence.append(out[-1])
            if out[-1] in getattr(params, "stop_token_ids", []):
                break
        completion = types.SimpleNamespace(token_ids=out)
        return types.SimpleNamespace(prompt_logprobs=prompt_logprobs, outputs=[completion])


@pytest.fixture
def fake_vllm(monkeypatch, tmp_path):
    pytest.importorskip("transformers", reason="transformers not installed (pip install 'bamctl[hf]')")
    pytest.importorskip("tokenizers", reason="tokenizers not installed (pip install 'bamctl[hf]')")
    module = types.ModuleType("vllm")
    module.LLM, module.SamplingParams, module.__version__ = FakeLLM, SamplingParams, "0.0-stand-in"
    module.config = types.ModuleType("vllm.config")
    module.config.ModelConfig = ModelConfig
    module.platforms = types.ModuleType("vllm.platforms")
    module.platforms.current_platform = types.SimpleNamespace(is_cpu=lambda: True)
    for name, value in (("vllm", module), ("vllm.config", module.config), ("vllm.platforms", module.platforms)):
        monkeypatch.setitem(sys.modules, name, value)
    FakeLLM.instances.clear()
    FakeLLM.calls.clear()
    folder = save_tiny_llama(tmp_path / "tiny", max_positions=32, seed=1)
    from transformers import AutoModelForCausalLM

    return folder, AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True).eval()


def _full(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def test_requests_read_vllm_outputs_like_the_model_forward(fake_vllm):
    folder, model = fake_vllm
    backend = open_backend(f"vllm:{folder}", RunOptions(tokenizer=None))
    prompt, target = [5 + i for i in range(12)], [7, 8, 9]
    logits = _full(model, [1] + prompt + target)  # one BOS in front, as hf: does
    rows = logits[len(prompt) : len(prompt) + 3]
    score = backend.score_continuation(prompt, target)
    assert score.predicted_ids == rows.argmax(-1).tolist()
    expected = torch.log_softmax(rows, -1).gather(1, torch.tensor(target)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(score.logprobs), expected, atol=1e-5, rtol=1e-5)
    ids = [3 + (5 * i) % 60 for i in range(20)]
    full = _full(model, [1] + ids)
    torch.testing.assert_close(
        backend.token_nll(ids, 3), F.cross_entropy(full[3:-1], torch.tensor(ids[3:]), reduction="none"), atol=1e-5, rtol=1e-5
    )
    with torch.no_grad():
        greedy = model.generate(torch.tensor([[1] + prompt]), max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert backend.generate(prompt, 6) == greedy[0, len(prompt) + 1 :].tolist()
    engine = FakeLLM.instances[0].kwargs
    assert engine["enable_prefix_caching"] and engine["tensor_parallel_size"] == 1
    assert len(FakeLLM.instances) == 1  # one engine for every request that fits


def test_engine_grows_past_the_configured_maximum_with_a_warning(fake_vllm, capsys):
    folder, _ = fake_vllm
    backend = open_backend(f"vllm:{folder}", RunOptions())
    backend.generate([5, 6, 7], 2)
    assert FakeLLM.instances[-1].kwargs["max_model_len"] == 32 and "hf_overrides" not in FakeLLM.instances[-1].kwargs
    long = [3 + i % 60 for i in range(40)]
    assert backend.token_nll(long).shape == (39,)
    err = capsys.readouterr().err
    assert "41 tokens exceed" in err and "restarting vLLM" in err
    assert FakeLLM.instances[-1].kwargs["hf_overrides"] == {"max_position_embeddings": 42}  # + the one token vLLM samples
    refuse = open_backend(f"vllm:{folder}", RunOptions(beyond_max="refuse"))
    with pytest.raises(BamctlError, match="exceed"):
        refuse.token_nll(long)


def test_tensor_parallel_and_reserve_size_the_engine_once(fake_vllm):
    from bamctl.backends.base import VLLMOptions
    from bamctl.backends.vllm import VLLMBackend

    folder, _ = fake_vllm
    backend = VLLMBackend(str(folder), VLLMOptions(tensor_parallel=2))
    backend.reserve(64)
    backend.generate([5, 6], 1)
    backend.token_nll([3 + i % 60 for i in range(50)])
    assert len(FakeLLM.instances) == 1
    assert FakeLLM.instances[0].kwargs["tensor_parallel_size"] == 2 and FakeLLM.instances[0].kwargs["max_model_len"] == 64


def test_one_generate_call_takes_every_prompt_and_answers_map_back_in_order(fake_vllm):
    folder, _ = fake_vllm
    backend = open_backend(f"vllm:{folder}", RunOptions())
    prompts = [[5 + (i * j) % 50 for j in range(4 + 2 * i)] for i in range(5)]  # unequal lengths
    targets = [[7 + i, 8, 9 + i] for i in range(5)]
    FakeLLM.calls.clear()
    batched = backend.score_continuations(list(zip(prompts, targets)))
    assert len(FakeLLM.calls) == 1 and len(FakeLLM.calls[0]) == 5
    assert batched == [backend.score_continuation(p, t) for p, t in zip(prompts, targets)]
    FakeLLM.calls.clear()
    generated = backend.generate_many(prompts, 4)
    assert len(FakeLLM.calls) == 1 and [ids[1:] for ids in FakeLLM.calls[0]] == prompts  # a BOS in front of each
    assert generated == [backend.generate(p, 4) for p in prompts]
    requests = [(p, i % 2) for i, p in enumerate(prompts)]
    FakeLLM.calls.clear()
    nlls = backend.token_nlls(requests)
    assert len(FakeLLM.calls) == 1
    for got, (ids, score_from) in zip(nlls, requests):
        torch.testing.assert_close(got, backend.token_nll(ids, score_from), equal_nan=True)


def test_a_vllm_run_sends_each_request_in_one_call_and_rows_match_one_at_a_time(fake_vllm, tmp_path, capsys):
    from bamctl.cli import main
    from bamctl.results.store import ResultStore

    folder, _ = fake_vllm
    corpus = tmp_path / "words.txt"
    corpus.write_text(" ".join(f"w{(5 * i) % 60}" for i in range(200)))

    def run(out, *extra):
        FakeLLM.calls.clear()
        with pytest.raises(SystemExit) as exit_info:
            main(["ppl", f"vllm:{folder}", "--lengths", "8,16", "--doc-tokens", "30", "--stride", "4",
                  "--corpus", str(corpus), "--dir", str(out), *extra])
        assert exit_info.value.code == 0, capsys.readouterr().err
        rows = ResultStore(out).read().sort_values(["length", "document_start", "position"]).reset_index(drop=True)
        return rows, [len(call) for call in FakeLLM.calls]

    batched, calls = run(tmp_path / "auto")
    assert f"batches (--batch-size auto): all {len(batched)} samples at once" in capsys.readouterr().err
    assert calls == [len(batched)]  # the whole request (both lengths, every window) in one call
    one, calls_one = run(tmp_path / "one", "--batch-size", "1")
    assert calls_one == [1] * len(one)
    assert (one["request_digest"] == batched["request_digest"]).all()
    assert (one["nll"] == batched["nll"]).all() and (one["n_scored"] == batched["n_scored"]).all()


def test_a_cached_hub_id_opens_from_its_snapshot_and_its_commit_is_its_identity(fake_vllm, tmp_path, monkeypatch):
    from hub_cache import cache_snapshot, commit_sha, offline_hf_home

    folder, model = fake_vllm
    home = offline_hf_home(tmp_path, monkeypatch)
    main = cache_snapshot(home / "hub", "tiny-org/tiny-llama", folder, commit_sha("main"), ("main",))
    v2 = cache_snapshot(home / "hub", "tiny-org/tiny-llama", folder, commit_sha("v2"), ("v2",))
    first = open_backend("vllm:tiny-org/tiny-llama", RunOptions())
    second = open_backend("vllm:tiny-org/tiny-llama@v2", RunOptions())
    assert (first.model_path, first.info.model_revision) == (str(main), main.name)
    assert (second.model_path, second.info.model_revision) == (str(v2), v2.name)
    assert first.info.model_hash != second.info.model_hash  # identical files, two commits: two models
    assert open_backend(f"vllm:{folder}", RunOptions()).info.model_revision is None
    prompt = [5 + i for i in range(12)]
    with torch.no_grad():
        greedy = model.generate(torch.tensor([[1] + prompt]), max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert second.generate(prompt, 4) == greedy[0, len(prompt) + 1 :].tolist()  # vLLM ran the snapshot
    with pytest.raises(BamctlError, match="models--tiny-org--missing"):
        open_backend("vllm:tiny-org/missing", RunOptions())
