"""``openai:NAME``'s options, with no server (the real server's tests: ``test_vllm_served.py``,
marker ``vllm``): its own options are refused by name for other back-ends and theirs for it, a
missing or silent server is one line, and the key is no option at all."""

from __future__ import annotations

import math
from dataclasses import fields

import pytest

from bamctl.backends import RunOptions, open_backend, peek_backend
from bamctl.backends.base import ServedOptions
from bamctl.errors import BamctlError
from vllm_server import free_port


@pytest.mark.parametrize("option, flag", [({"base_url": "http://127.0.0.1:1/v1"}, "--base-url"),
                                          ({"endpoint": "http://127.0.0.1:1/v1"}, "--endpoint"),
                                          ({"concurrency": 4}, "--concurrency"),
                                          ({"logprobs_via": "echo"}, "--logprobs-via")])
def test_served_options_are_refused_by_name_elsewhere(option, flag):
    with pytest.raises(BamctlError, match=f"^{flag} does not apply to bamctl's own models$"):
        peek_backend("lm-rope", RunOptions(**option))


@pytest.mark.parametrize("option, flag", [({"device": "cpu"}, "--device"), ({"dtype": "float32"}, "--dtype"),
                                          ({"tensor_parallel": 2}, "--tensor-parallel")])
def test_options_the_server_decides_are_refused_for_openai(option, flag):
    with pytest.raises(BamctlError, match=f"^{flag} does not apply to openai: models"):
        open_backend("openai:m", RunOptions(base_url="http://127.0.0.1:1/v1", **option))


def test_an_unknown_way_to_ask_for_log_probs_is_one_line():
    with pytest.raises(BamctlError, match="^--logprobs-via takes auto, vllm, echo, not 'text'$"):
        ServedOptions(logprobs_via="text")


def test_without_a_server_url_one_line(monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(BamctlError, match=r"^openai:m needs its server: --base-url http://HOST:PORT/v1 \(or OPENAI_BASE_URL\)$"):
        open_backend("openai:m", RunOptions())


def test_a_silent_server_is_one_line(monkeypatch):
    pytest.importorskip("openai", reason="the openai client is not installed: pip install 'bamctl[served]'")
    silent = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    with pytest.raises(BamctlError) as err:
        open_backend("openai:m", RunOptions(base_url=silent))
    assert str(err.value).startswith(f"openai: no server answers at {silent}") and "\n" not in str(err.value)
    monkeypatch.setenv("OPENAI_BASE_URL", silent)  # the client's own variable is the default server
    with pytest.raises(BamctlError, match="no server answers"):
        open_backend("openai:m", RunOptions())


def test_the_key_is_no_option():
    """Options are recorded (a sweep's record); the key is read from OPENAI_API_KEY at each request only."""
    assert not [f.name for f in fields(RunOptions) + fields(ServedOptions) if "key" in f.name]


def test_default_concurrency_is_what_the_kv_caches_hold_at_the_requests_length():
    from bamctl.backends.served import DEFAULT_CONCURRENCY, MOST_CONCURRENCY, ServerCapacity, batch_concurrency

    vllm = ServerCapacity(kv_tokens=100_000, max_requests=None)
    assert batch_concurrency([vllm], 10_000) == 10
    assert batch_concurrency([vllm], 10_001) == 9  # whole requests only
    assert batch_concurrency([vllm, vllm], 10_000) == 20  # replicas add up
    assert batch_concurrency([vllm], 200_000) == 1  # one request longer than the cache still runs, alone
    assert batch_concurrency([vllm], 100) == MOST_CONCURRENCY
    sglang = ServerCapacity(kv_tokens=100_000, max_requests=3)
    assert batch_concurrency([sglang], 10_000) == 3 and batch_concurrency([sglang, vllm], 10_000) == 13
    assert batch_concurrency([vllm, None], 10_000) == DEFAULT_CONCURRENCY  # one server says nothing: the fixed default


def test_a_vllm_engines_kv_tokens_are_read_from_its_cache_info_labels():
    """The labels as vLLM's ``vllm:cache_config_info`` gauge carries them (every CacheConfig field as a
    string): the size it resolved in tokens where the version has it, else blocks times block size."""
    from bamctl.backends.served import CACHE_INFO, LABEL, _engine_tokens

    text = ('# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n'
            'vllm:cache_config_info{block_size="16",engine="0",kv_cache_size_tokens="None",num_gpu_blocks="2048"} 1.0\n'
            'vllm:cache_config_info{block_size="16",engine="1",kv_cache_size_tokens="40000",num_gpu_blocks="2500"} 1.0\n')
    engines = [dict(LABEL.findall(m["labels"])) for m in CACHE_INFO.finditer(text)]
    assert [_engine_tokens(labels) for labels in engines] == [32_768, 40_000]
    assert _engine_tokens({"block_size": "16", "num_gpu_blocks": "None"}) is None


def _answer(prompt_tokens, logprobs=None, read=None):
    """A completion as the openai client returns one: its usage count and, with vLLM's
    prompt_logprobs, one entry per position (rank 1 = the argmax)."""
    from types import SimpleNamespace

    extra = {"prompt_logprobs": logprobs} if logprobs is not None else {}
    if read is not None:
        extra["prompt_token_ids"] = read
    choice = SimpleNamespace(model_extra=extra, **extra)
    return SimpleNamespace(usage=SimpleNamespace(prompt_tokens=prompt_tokens), choices=[choice])


def _served(answers):
    """openai:m without a server: its request handling alone, answers given (the real server's
    tests are in test_vllm_served.py; no vLLM miscounts, so a miscount can only be made here)."""
    from types import SimpleNamespace

    from bamctl.backends.hf_common import LengthPolicy
    from bamctl.backends.served import PROMPT_LOGPROBS, ServedBackend

    backend = object.__new__(ServedBackend)
    backend.served_name, backend.gaps, backend.protocol, backend.prompt_logprobs = "m", [], PROMPT_LOGPROBS, True
    backend.shaper = SimpleNamespace(prefix=[])
    backend.lengths = LengthPolicy("m", None, "warn")
    backend._map = lambda asks: answers
    backend._ask_logprobs = lambda ids: None
    return backend


def _entries(ids):
    return [None] + [{str(t): {"logprob": -0.25, "rank": 1}} for t in ids[1:]]


def test_a_request_read_at_another_length_is_recorded_and_not_scored():
    from bamctl.backends.served import UNREAD

    prompt, target = [5, 6, 7], [8, 9]
    fed = prompt + target  # what is sent: the prompt and the answer, scored at the answer
    backend = _served([_answer(len(fed), _entries(fed)), _answer(len(fed) + 1, _entries(fed))])
    right, misread = backend.score_continuations([(prompt, target), (prompt, target)])
    assert right.predicted_ids == target and right.logprobs == [-0.25, -0.25]
    assert misread.predicted_ids == [UNREAD, UNREAD] and all(math.isnan(lp) for lp in misread.logprobs)
    assert backend.token_gaps() == [0, 1] and backend.token_gaps() == []  # taken once


def test_a_generation_and_its_forced_answer_keep_the_larger_gap():
    backend = _served([])
    backend._note_gaps([0, 2, -3])
    backend._note_gaps([1, -1, 0])
    assert backend.token_gaps() == [1, 2, -3]
    backend._note_gaps([0])
    backend._note_gaps([4, 0])  # another batch's size: a new call, not the same samples
    assert backend.token_gaps() == [4, 0]


def test_other_ids_read_or_no_count_stop_the_run():
    backend = _served([])
    assert backend._read_gap(_answer(3, read=[1, 2, 3]), [1, 2, 3]) == 0
    assert backend._read_gap(_answer(4, read=[0, 1, 2, 3]), [1, 2, 3]) == 1  # a token more: a length, recorded
    with pytest.raises(BamctlError, match="read other prompt tokens than the 3 sent"):
        backend._read_gap(_answer(3, read=[1, 2, 4]), [1, 2, 3])
    with pytest.raises(BamctlError, match="counts no prompt tokens"):
        backend._read_gap(_answer(None), [1, 2, 3])
