"""Every registered back-end states what goes into a row's identity; none is left to a fallback."""

from __future__ import annotations

import inspect

import pytest

from bamctl.backends import BACKENDS, RunOptions, open_backend
from bamctl.backends.base import Backend
from bamctl.checkpoint import new_random_model, save_checkpoint
from bamctl.model import ModelConfig
from test_external_vllm import fake_vllm  # noqa: F401  (a fixture, used by name)
from test_vllm_served import served, smollm2  # noqa: F401  (fixtures, used by name)


def _native(tmp_path, request):
    model = new_random_model(ModelConfig.from_preset("micro", "rope", train_length=128), 0)
    return str(save_checkpoint(model, tmp_path / "native"))


def _authors(tmp_path, request):
    from test_external_authors import VOCAB, _word_tokenizer, build

    folder, *_ = build(tmp_path, "bam_ssmax")
    _word_tokenizer(folder / "tokenizer.json", VOCAB - 2)
    return f"bam:{folder}"


def _hf(tmp_path, request):
    pytest.importorskip("transformers", reason="transformers not installed (pip install 'bamctl[hf]')")
    from tiny_llama import save_tiny_llama

    return f"hf:{save_tiny_llama(tmp_path / 'hf', max_positions=32, seed=1)}"


def _vllm(tmp_path, request):
    folder, _ = request.getfixturevalue("fake_vllm")  # a stand-in vllm module and a tiny Llama
    return f"vllm:{folder}"


def _py(tmp_path, request):
    builder = tmp_path / "builder.py"
    builder.write_text("from own_models import gpt2_encoding, nanogpt\n\n\ndef build():\n    return nanogpt(), gpt2_encoding()\n")
    return f"py:{builder}:build"


def _trained_py(tmp_path, request):
    """A folder as ``bamctl train --model py:...`` leaves it (its module saved untrained: the
    back-end reads the folder, whatever the weights are)."""
    from bamctl.backends.module import PyReference, build_fresh
    from bamctl.module_checkpoint import save_module_checkpoint, snapshot_code

    reference = _py(tmp_path, request).removeprefix("py:")
    found, parsed = build_fresh(reference), PyReference.parse(reference)
    return str(save_module_checkpoint(found.module, snapshot_code(parsed), parsed.function, parsed.arguments,
                                      tmp_path / "trained", train_length=256, recipe={}, provenance={}))


def _openai(tmp_path, request):
    server = request.getfixturevalue("served")  # a real vllm serve of SmolLM2 (test_vllm_served.py); skips without vLLM
    OPTIONS["openai"] = RunOptions(base_url=server.url)
    return "openai:smollm2"


OPENERS = {"native": _native, "bam": _authors, "hf": _hf, "vllm": _vllm, "py": _py, "trained-py": _trained_py,
           "openai": _openai}
OPTIONS = {"native": RunOptions(device="cpu"), "bam": RunOptions(device="cpu"), "hf": RunOptions(device="cpu"), "vllm": RunOptions(),
           "py": RunOptions(device="cpu"), "trained-py": RunOptions(device="cpu")}
# openai: needs a real server, which only the vllm environment starts (marker vllm)
NAMES = [pytest.param(name, marks=pytest.mark.vllm) if name == "openai" else name for name in sorted(BACKENDS)]


def test_every_registered_back_end_is_covered_here():
    assert set(OPENERS) == set(BACKENDS)


@pytest.mark.parametrize("name", NAMES)
def test_each_back_end_states_its_feeding_and_tokenizer(name, tmp_path, request):
    cls = _class(BACKENDS[name].target)
    assert issubclass(cls, Backend) and not inspect.isabstract(cls)
    backend = open_backend(OPENERS[name](tmp_path, request), OPTIONS[name])
    for stated in (backend.feeding, backend.tokenizer.fingerprint, backend.scored_tokens):
        assert isinstance(stated, str) and stated


def _class(target: str):
    import importlib

    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def test_a_back_end_without_its_feeding_cannot_be_built():
    class Silent(Backend):
        scored_tokens = "x"

        def score_continuation(self, prompt_ids, target_ids): ...
        def generate(self, prompt_ids, max_new_tokens): ...
        def token_nll(self, ids, score_from=1): ...
        def bos_for(self, scoring): ...
        def check_fits(self, n_prompt, n_answer): ...

    with pytest.raises(TypeError, match="feeding"):
        Silent()


def test_a_tokenizer_without_fingerprint_is_refused_not_guessed():
    from dataclasses import replace

    from bamctl.tasks import plan_samples
    from bamctl.tokenizer import get_tokenizer

    nameless = replace(get_tokenizer("gpt2"), fingerprint="")
    with pytest.raises(ValueError, match="fingerprint"):
        plan_samples("passkey", [256], 1, [0], nameless)


def test_vllm_auto_dtype_is_what_vllm_resolves_and_an_engine_running_another_is_refused(fake_vllm, monkeypatch):  # noqa: F811
    """A row's dtype is vLLM's own resolution of --dtype (vllm.config.ModelConfig: bfloat16 for a
    float32 model on the CPU build, ``test_vllm_engine.py`` holds it on real vLLM), never a rule of
    ours; should the started engine run another, no row is written under the wrong name."""
    import sys

    import torch

    from bamctl.errors import BamctlError

    folder, _ = fake_vllm
    resolved = {"auto": torch.bfloat16, "float32": torch.float32}
    monkeypatch.setattr(sys.modules["vllm.config"].ModelConfig, "__init__",
                        lambda self, model, tokenizer, dtype: setattr(self, "dtype", resolved[dtype]))
    assert open_backend(f"vllm:{folder}", RunOptions(dtype="float32")).dtype == "float32"
    backend = open_backend(f"vllm:{folder}", RunOptions())
    assert backend.dtype == "bfloat16"
    with pytest.raises(BamctlError, match="runs .* in float32, not the bfloat16 resolved for --dtype auto; pass --dtype float32"):
        backend.generate([5, 6, 7], 2)  # the stand-in engine reports float32 for dtype auto
