"""``openai:NAME``'s options, with no server (the real server's tests: ``test_vllm_served.py``,
marker ``vllm``): its own options are refused by name for other back-ends and theirs for it, a
missing or silent server is one line, and the key is no option at all."""

from __future__ import annotations

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
