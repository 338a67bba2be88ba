"""Suite-wide set-up."""

import signal
import sys

import pytest

from mutation_scope import mutating, mutation_durations

# Started as a background job of a non-interactive shell (`bash .ci/run &`), pytest inherits
# SIGINT ignored, and so does every process a test starts: the tests that stop one with SIGINT,
# as a user's Ctrl-C does, would see it run to its end. SIGINT gets Python's handler back.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    """Under mutmut, a mutant's tests run fastest first (by the durations its first pass measured):
    mutmut names them in no order, and with ``-x`` a killed mutant stops at its first failing test,
    which is most often a quick one that states the behaviour directly."""
    if mutating():
        durations = mutation_durations()
        items.sort(key=lambda item: durations.get(item.nodeid, float("inf")))


@pytest.fixture(autouse=True)
def fresh_caches_under_mutation():
    """Under mutmut, every test starts with bamctl's caches empty (tests/mutation_scope.py)."""
    if mutating():
        for name, module in list(sys.modules.items()):
            if name.startswith("bamctl") and module is not None:
                for value in list(vars(module).values()):
                    if callable(getattr(value, "cache_clear", None)) and hasattr(value, "cache_info"):
                        value.cache_clear()
    yield


@pytest.fixture(scope="session", autouse=True)
def native_kernel_built_before_any_test():
    # The engine's default CPU path compiles a C++ kernel on first use (about a minute on
    # a fresh machine) and says so on stderr. Build it here, once, so no test's timing or
    # captured stderr depends on which test happened to come first.
    from bamctl.engine.native import native_available

    native_available()


@pytest.fixture(scope="session")
def chat_tok():
    """GPT-2 with a chat template, as an HF tokenizer would give it."""
    from bamctl.tokenizer import get_tokenizer

    tok = get_tokenizer("gpt2")

    class ChatGPT2:
        name, vocab_size, eos_id, fingerprint = "chat-gpt2", tok.vocab_size, tok.eos_id, "chat"
        encode, decode = staticmethod(tok.encode), staticmethod(tok.decode)

        @staticmethod
        def chat_frame():
            return "<|user|>\n", "<|end|>\n<|assistant|>\n"

    return ChatGPT2()


@pytest.fixture
def eager_flex(monkeypatch):
    """flex_attention run by dynamo's eager backend: the same block mask and score_mod, no compiler."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    from bamctl.engine import flex

    eager = torch.compile(flex_attention, dynamic=False, backend="eager")
    monkeypatch.setattr(flex, "_compiled", lambda: eager)


@pytest.fixture(autouse=True)
def remembered_consents_kept_in_the_tests_own_file(tmp_path_factory, monkeypatch):
    # Consents to run a checkpoint's code are remembered per file digest (bamctl.consent); a test
    # neither reads the user's nor leaves its own behind. The processes a test starts inherit it.
    monkeypatch.setenv("BAMCTL_TRUSTED_CODE", str(tmp_path_factory.mktemp("consent") / "trusted-code.json"))
