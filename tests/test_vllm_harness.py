"""``--model bamctl`` over ``vllm:``: lm-eval's requests answered by real vLLM, against lm-eval's
own HF back-end (``HFLM``) on the same folder and requests.

Marker ``vllm`` (``bash scripts/test.sh --vllm``; skipped where vLLM is not installed). The model
is ``test_vllm_engine``'s tiny BPE Llama (64-wide heads, 1,024 positions), in float32 on both
sides; the tolerance is that module's per-answer one (vLLM's float32 kernels sum in another
order). One engine start (30-100 s on 2 cores), in a module of its own so that the engine of
``test_vllm_engine`` is stopped first.
"""

from __future__ import annotations

import importlib.util

import pytest

from test_stop_strings import PROMPTS, _ends_at_the_first_stop
from test_vllm_engine import ANSWER_TOL, LIMIT, NO_VLLM
from tiny_llama import save_tiny_llama

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason=NO_VLLM)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("bpe-llama"), hidden=256, max_positions=LIMIT, seed=1, vocab="bpe")


def test_the_plugin_on_vllm_answers_as_lm_evals_hf_backend(folder):
    pytest.importorskip("lm_eval", reason="lm-eval not installed (the dev extra)")
    from bamctl.harness import BamctlLM
    from test_harness import choice_pairs, hflm, questions, requests

    lm = BamctlLM(model=f"vllm:{folder}", dtype="float32", batch_size="auto")
    try:
        pairs = choice_pairs()
        mine = lm.loglikelihood(requests("loglikelihood", pairs), disable_tqdm=True)
        args = [(f"Question: {q['question']}\nAnswer:", {"until": ["\n"], "max_gen_toks": 12}) for q in questions()[:5]]
        generated = lm.generate_until(requests("generate_until", args), disable_tqdm=True)
        # vLLM ends a generation at its stop strings as bamctl's engines do (tests/test_stop_strings.py)
        assert _ends_at_the_first_stop(lm.served, PROMPTS, [("e",), ("a",), ("o",), ("zzzz-never",)]) >= 2
    finally:
        lm.close()
    reference = hflm(folder)
    theirs = reference.loglikelihood(requests("loglikelihood", pairs), disable_tqdm=True)
    assert lm.served.dtype == "float32"
    assert [greedy for _, greedy in mine] == [greedy for _, greedy in theirs]
    assert max(abs(a - b) for (a, _), (b, _) in zip(mine, theirs)) < ANSWER_TOL
    assert generated == reference.generate_until(requests("generate_until", args), disable_tqdm=True)
