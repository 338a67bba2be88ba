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
