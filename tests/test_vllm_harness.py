"""``--model bamctl`` over ``vllm:``: lm-eval's requests answered by real vLLM, against lm-eval's
own HF back-end (``HFLM``) on the same folder and requests.

Marker ``vllm`` (``bash scripts/test.sh --vllm``; skipped where vLLM is not installed). The model
is ``test_vllm_engine``'s tiny BPE Llama (64-wide heads, 1,024 positions), in float32 on both
sides; the tolerance is that module's per-answer one (vLLM's float32 kernels sum in another
order). Two engine starts (30-100 s each on 2 cores: one here, one in the ``bamctl lm-eval``
process of the command-line test), in a module of its own so that the engine of
``test_vllm_engine`` is stopped first.
"""

from __future__ import annotations

import importlib.util
import json

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


ROLL_MINI = """task: roll_mini
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
"""


def test_lm_evals_command_line_runs_a_vllm_model(folder, tmp_path):
    """``bamctl lm-eval --model_args model=vllm:PATH`` from lm-eval's own command line: lm-eval passes a
    device to every model (``cuda:0`` unless told; here ``--device cpu``), which vLLM, picking its own,
    had refused ("device does not apply to vllm: models", exit 2). It now goes only to back-ends that
    take a device. Multiple choice, then rolling log-likelihoods of strings longer than the model's
    1,024 positions (``--tasks arc_mini,roll_mini``): one engine start (the engine had restarted for
    the rolling windows, "restarting vLLM for 1026 tokens"), and each number lm-eval logs is HFLM's
    on the same request."""
    pytest.importorskip("lm_eval", reason="lm-eval not installed (the dev extra)")
    from test_harness import TASKS, _bamctl, _document, hflm, requests

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "arc_mini.yaml").write_text((TASKS / "arc_mini.yaml").read_text())
    texts = [_document(words) for words in (700, 900)]
    (tasks / "roll_mini.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    (tasks / "roll_mini.yaml").write_text(ROLL_MINI.format(data=tasks / "roll_mini.jsonl"))
    out = tmp_path / "out"
    done = _bamctl("lm-eval", "--model_args", f"model=vllm:{folder},dtype=float32", "--tasks", "arc_mini,roll_mini",
                   "--include_path", str(tasks), "--batch_size", "auto", "--device", "cpu", "--limit", "8",
                   "--log_samples", "--output_path", str(out), home=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("vllm: starting vLLM") == 1 and "restarting vLLM" not in done.stderr, done.stderr[-3000:]

    def logged(task: str) -> tuple[list, list[float]]:
        samples = [json.loads(line) for path in out.rglob(f"samples_{task}_*.jsonl") for line in path.read_text().splitlines()]
        # each request's arguments, as lm-eval logs them: {"gen_args_0": {"arg_0": ..., "arg_1": ...}, ...}
        asked = [tuple(args[key] for key in sorted(args)) for sample in samples for args in sample["arguments"].values()]
        return asked, [float(resp[0] if isinstance(resp, list) else resp) for sample in samples for resp in
                       (r[0] for r in sample["resps"])]

    reference = hflm(folder)
    asked, values = logged("arc_mini")
    assert len(asked) == len(values) == 32
    theirs = [value for value, _ in reference.loglikelihood(requests("loglikelihood", asked), disable_tqdm=True)]
    assert max(abs(a - b) for a, b in zip(values, theirs)) < ANSWER_TOL
    asked, values = logged("roll_mini")
    assert sorted(asked) == sorted((text,) for text in texts)
    assert min(len(reference.tok_encode(text)) for text in texts) > LIMIT + 1  # more than one window
    theirs = hflm(folder, add_bos_token=False).loglikelihood_rolling(requests("loglikelihood_rolling", asked), disable_tqdm=True)
    assert max(abs(a - b) for a, b in zip(values, theirs)) < ANSWER_TOL * len(asked[0][0]) / 100  # per 100 characters
