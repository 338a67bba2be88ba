"""Generation that ends at stop strings (``generate_many(..., stop_strings=...)``).

lm-eval's generation tasks cut each text at its first stop string; generating the whole
budget and cutting afterwards gives that text too, with many decode steps more. Every
back-end that ends a row early must return the start of what the whole budget returns,
ended at the first token whose text holds a stop string, so the cut text is unchanged.
"""

from __future__ import annotations

import pytest

from bamctl.backends import RunOptions, open_backend
from bamctl.backends.base import holds_stop, stop_tests

PROMPTS = ["The river ran", "Once upon a time there was a", "Question: what is water?\nAnswer:", "It was late and"]
STOPS = [(" the",), ("e",), ("\n", "."), ("zzzz-never",)]
BUDGET = 24


def _ends_at_the_first_stop(backend, prompts, stops):
    encode, decode = backend.tokenizer.encode, backend.tokenizer.decode
    ids = [encode(p) for p in prompts]
    whole = backend.generate_many(ids, BUDGET)
    ended = backend.generate_many(ids, BUDGET, stop_strings=stops)
    early = 0
    for full, short, strings in zip(whole, ended, stops):
        assert short == full[: len(short)]  # the start of the whole budget's tokens
        if len(short) < len(full):
            early += 1
            assert any(s in decode(short) for s in strings)  # ended where its text holds a stop string ...
            assert not any(s in decode(short[:-1]) for s in strings)  # ... at the first token that does
        else:
            assert not any(s in decode(full[:-1]) for s in strings)
    return early


def test_the_native_engine_ends_each_row_at_its_first_stop_string():
    backend = open_backend("lm-bam", RunOptions(device="cpu", dtype="float32"))
    assert _ends_at_the_first_stop(backend, PROMPTS, STOPS) >= 2


def test_the_hf_back_end_ends_each_row_at_its_first_stop_string(tmp_path, monkeypatch):
    """Both of ``hf:``'s generation loops: decoding from its KV cache, and the loop for models whose
    forward takes no cache (the whole sequence each step), forced here on the same Llama: a spy
    counts its calls (the test had opened the back-end without a chunk size, which still decodes
    from the cache: 0 calls)."""
    pytest.importorskip("transformers", reason="transformers not installed (pip install 'bamctl[hf]')")
    from tiny_llama import save_tiny_llama

    folder = save_tiny_llama(tmp_path / "llama", vocab="bpe", max_positions=128)
    backend = open_backend(f"hf:{folder}", RunOptions(device="cpu", dtype="float32", chunk_size=16))
    stops = [("e",), ("a",), ("o",), ("zzzz-never",)]
    assert _ends_at_the_first_stop(backend, PROMPTS, stops) >= 2
    uncached = open_backend(f"hf:{folder}", RunOptions(device="cpu", dtype="float32"))
    uncached.chunked = False  # what a forward without a cache argument makes it
    calls = []
    generate_uncached = type(uncached)._generate_uncached
    monkeypatch.setattr(type(uncached), "_generate_uncached",
                        lambda self, *args: calls.append(args[0]) or generate_uncached(self, *args))
    assert _ends_at_the_first_stop(uncached, PROMPTS, stops) >= 2
    assert len(calls) == 2 * len(PROMPTS)  # each prompt, with and without its stop strings


def test_a_stop_string_is_found_in_the_last_tokens_and_confirmed_on_the_whole_text():
    pieces = {1: "Ques", 2: "tion", 3: ":", 4: " x", 5: " y"}
    calls = []

    def decode(tokens):  # a tokenizer that drops the text's leading space, as SentencePiece does
        calls.append(len(tokens))
        return "".join(pieces[t] for t in tokens).lstrip(" ")

    assert holds_stop(decode, ["Question:"], [4, 1, 2, 3])
    assert holds_stop(decode, [" y"], [4, 5])  # the space dropped from a window that began at it: one token more
    assert not holds_stop(decode, ["Question:"], [1, 2, 4])
    assert not holds_stop(decode, [], [1, 2, 3]) and not holds_stop(decode, ["x"], [])
    calls.clear()
    assert not holds_stop(decode, [":"], [4] * 500)
    assert calls == [2]  # only the window was decoded: no stop string there
    assert stop_tests(decode, None, 2) == [None, None]
    with pytest.raises(ValueError):
        stop_tests(decode, [("a",)], 2)
