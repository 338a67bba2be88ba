"""`bamctl generate`: the JSONL it writes, byte-identical reruns, one-line errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import bamctl.cli.task_commands  # noqa: F401  (registers `generate` on the app)
from bamctl.cli.app import app

FIELDS = ["task", "protocol", "length", "n_tokens", "depth", "seed", "index", "prompt", "input_ids", "answers", "needle_positions"]


def _bamctl(*args: str) -> subprocess.CompletedProcess:
    code = "import sys; from bamctl.cli import main; main(sys.argv[1:])"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)


def test_generate_writes_one_object_per_sample(tmp_path):
    out = tmp_path / "p.jsonl"
    result = CliRunner().invoke(app, ["generate", "passkey", "--lengths", "1k,2k", "--samples", "2", "--depths", "0,1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 * 2 * 2
    for row in rows:
        assert all(field in row for field in FIELDS)
        assert row["n_tokens"] == row["length"] == len(row["input_ids"])
    assert [(r["length"], r["depth"], r["index"]) for r in rows[:4]] == [(1024, 0.0, 0), (1024, 0.0, 1), (1024, 1.0, 0), (1024, 1.0, 1)]
    assert not list(tmp_path.glob("*.partial"))


def test_generate_ruler_and_landmark(tmp_path):
    out = tmp_path / "r.jsonl"
    result = CliRunner().invoke(app, ["generate", "niah_multivalue", "--lengths", "2k", "--samples", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(row["answers"]) == 4 and len(row["needle_positions"]) == 4
    assert row["n_tokens"] + row["max_new_tokens"] <= 2048
    result = CliRunner().invoke(app, ["generate", "passkey", "--protocol", "landmark", "--lengths", "1k", "--depths", "1", "--samples", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["protocol"] == "landmark" and "\nThe pass key is" in row["prompt"]


def test_same_seed_gives_identical_bytes_across_processes(tmp_path):
    paths = [tmp_path / f"{name}.jsonl" for name in ("a", "b", "c")]
    args = ["--lengths", "1k,2k", "--samples", "2"]
    runs = [
        _bamctl("generate", "niah_multikey_3", *args, "--seed", seed, "--out", str(path))
        for seed, path in zip(("1", "1", "2"), paths)
    ]
    assert all(run.returncode == 0 for run in runs), [run.stderr for run in runs]
    a, b, c = (path.read_bytes() for path in paths)
    assert a == b
    assert a != c
    assert a.count(b"\n") == 4


def test_passkey_seeds_differ(tmp_path):
    out = tmp_path / "x.jsonl"
    keys = []
    for seed in ("0", "1"):
        assert CliRunner().invoke(app, ["generate", "passkey", "--lengths", "1k", "--samples", "3", "--depths", "1", "--seed", seed, "--out", str(out)]).exit_code == 0
        keys.append([json.loads(line)["answers"] for line in out.read_text().splitlines()])
    assert keys[0] != keys[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["generate", "pasky", "--lengths", "1k"], "did you mean passkey"),
        (["generate", "passkey", "--lengths", "1k..3k"], "never reaches"),
        (["generate", "passkey", "--lengths", "1k", "--depths", "2.5"], "fractions in [0, 1]"),
        (["generate", "passkey", "--lengths", "1k", "--protocol", "lndmark"], "'lndmark' is not one of"),
        (["generate", "ppl", "--lengths", "1k", "--protocol", "landmark"], "unknown protocol 'landmark' for ppl"),
        (["generate", "passkey"], "pass --lengths"),
        (["generate", "passkey", "--lengths", "1k", "--sizing", "ruler"], "--sizing applies to RULER's tasks only"),
        (["generate", "vt", "--lengths", "1k", "--corpus", "x.txt"], "--corpus applies to --task ppl only"),
        (["generate", "niah_single_1", "--lengths", "1k", "--haystack", "missing.txt"], "is not a file"),
        (["generate", "niah_single_1", "--lengths", "1k", "--chat-template"], "has no chat template"),
        (["generate", "niah_single_1", "--lengths", "1k", "--protocol", "landmark"], "unknown protocol"),
        (["generate", "passkey", "--lengths", "30"], "too short"),
        (["generate", "passkey", "--lengths", "1k", "--tokenizer", "gpt3"], "neither a known name"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    from bamctl.cli import main

    out = tmp_path / "bad.jsonl"
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--out", str(out)])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert not out.exists() and not list(tmp_path.glob("*.partial"))


@pytest.mark.parametrize("where", ["a file as its folder", "a folder nothing can be made in"])
def test_an_out_that_cannot_be_written_is_one_line_and_exit_2(tmp_path, capsys, where):
    """Both had been an "internal error" (FileExistsError, FileNotFoundError), exit 1."""
    from bamctl.cli import main

    if where == "a file as its folder":
        (tmp_path / "notes.txt").write_text("x")
        out = tmp_path / "notes.txt" / "p.jsonl"
    else:
        out = Path("/proc/p.jsonl")  # procfs: no file can be created there, by root either
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "passkey", "--lengths", "128", "--samples", "1", "--out", str(out)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: cannot write {out}: ") and "internal error" not in lines[0]


def test_bad_input_in_a_real_process(tmp_path):
    run = _bamctl("generate", "niah_single_9", "--lengths", "1k", "--out", str(tmp_path / "x.jsonl"))
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0 and "did you mean" in run.stderr


# -- generate writes what the run commands feed ----------------------------------------------


@pytest.fixture(scope="module")
def micro_model(tmp_path_factory):
    from bamctl.checkpoint import new_random_model, save_checkpoint
    from bamctl.model import ModelConfig

    config = ModelConfig.from_preset("micro", "bam", train_length=128)
    return str(save_checkpoint(new_random_model(config, 0), tmp_path_factory.mktemp("micro") / "m"))


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    """A haystack or corpus of our own: plain prose, a few thousand tokens."""
    path = tmp_path_factory.mktemp("text") / "text.txt"
    sentences = [f"The {w} river runs past {n} old mills before it reaches the sea." for n in range(40) for w in ("north", "quiet")]
    path.write_text("\n\n".join(" ".join(sentences[i : i + 8]) for i in range(0, len(sentences), 8)), encoding="utf-8")
    return path


@pytest.fixture
def fed(monkeypatch):
    """A recording back-end: the engine back-end's three requests keep the ids they are handed (and
    answer with placeholders, as no score is looked at); the runner's answer functions keep the
    samples they are given, as ``generate`` would write them."""
    import torch

    from bamctl import evaluation
    from bamctl.backends.base import Backend, ContinuationScore
    from bamctl.backends.native import EngineBackend
    from bamctl.cli.task_commands import sample_line

    record = {"ids": [], "lines": []}

    def score_continuation(self, prompt_ids, target_ids):
        record["ids"].append(list(prompt_ids))
        return ContinuationScore(predicted_ids=list(target_ids), logprobs=[0.0] * len(target_ids))

    def generate(self, prompt_ids, max_new_tokens):
        record["ids"].append(list(prompt_ids))
        return []

    def token_nll(self, ids, score_from=1):
        record["ids"].append(list(ids))
        return torch.zeros(len(ids) - score_from)

    for name, method in (("score_continuation", score_continuation), ("generate", generate), ("token_nll", token_nll)):
        monkeypatch.setattr(EngineBackend, name, method)
    for batched in ("score_continuations", "generate_many", "token_nlls"):  # batches: the base's loop over the above
        monkeypatch.setattr(EngineBackend, batched, getattr(Backend, batched))
    for kind, answer in list(evaluation.ANSWERS.items()):
        def recorded(backend, samples, answer=answer):
            record["lines"].extend(sample_line(sample) for sample in samples)
            return answer(backend, samples)

        monkeypatch.setitem(evaluation.ANSWERS, kind, recorded)
    return record


# (run command and its task option, generate's task argument, options both take); every task
# appears with its defaults and with options that change its prompts.
SAME_PROMPTS = [
    (["passkey"], "passkey", ["--lengths", "512", "--samples", "1"]),
    (["passkey"], "passkey", ["--lengths", "512,700", "--samples", "2", "--depths", "0,0.3", "--seed", "3,4", "--protocol", "landmark"]),
    (["ruler", "--task", "all"], "all", ["--lengths", "1k", "--samples", "1"]),
    (["ruler", "--task", "all"], "all", ["--lengths", "1k", "--samples", "1", "--seed", "2", "--sizing", "ruler", "--haystack", "TEXT", "--depths", "0.25"]),
    (["ppl"], "ppl", ["--lengths", "256,512"]),
    (["ppl"], "ppl", ["--lengths", "256", "--stride", "100", "--doc-tokens", "700", "--corpus", "TEXT"]),
    (["ppl"], "ppl", ["--lengths", "512", "--protocol", "buckets", "--bucket", "128", "--corpus", "TEXT"]),
    (["compare", "--task", "niah_multikey_2"], "niah_multikey_2", ["--lengths", "1k", "--samples", "2", "--sizing", "ruler", "--depths", "3"]),
]


@pytest.mark.parametrize(("command", "task", "options"), SAME_PROMPTS, ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_generate_writes_the_prompts_and_ids_a_run_feeds(micro_model, text_file, fed, tmp_path, capsys, command, task, options):
    from bamctl.cli import main

    options = [str(text_file) if o == "TEXT" else o for o in options]
    out = tmp_path / "prompts.jsonl"
    with pytest.raises(SystemExit) as done:
        main(["generate", task, *options, "--out", str(out)])
    assert done.value.code == 0, capsys.readouterr().err
    written = out.read_text(encoding="utf-8").splitlines(keepends=True)
    with pytest.raises(SystemExit) as done:
        main([command[0], micro_model, *command[1:], *options, "--dir", str(tmp_path / "r"), "--quiet", "--json"])
    assert done.value.code == 0, capsys.readouterr().err
    assert written and fed["lines"] == written  # byte for byte: text, ids, answers, needle positions
    assert fed["ids"] == [json.loads(line)["input_ids"] for line in written]  # what reached the model
    if task in ("all", "passkey"):
        assert len({json.loads(line)["task"] for line in written}) == (11 if task == "all" else 1)


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory, text_file):
    """hf: a tiny random Llama whose tokenizer (a byte-level BPE trained here, offline) has a chat template."""
    pytest.importorskip("transformers", reason="transformers not installed (pip install 'bamctl[hf]')")
    import tokenizers
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("chat-llama")
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<s>", "</s>"], initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    bpe.train([str(text_file)], trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>")
    tok.chat_template = "{% for m in messages %}<s>[user] {{ m['content'] }} [/user]{% endfor %}{% if add_generation_prompt %} [bot]{% endif %}"
    tok.save_pretrained(folder)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, max_position_embeddings=2048, bos_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def test_generate_with_a_chat_template_writes_what_an_hf_chat_model_is_fed(chat_model, text_file, monkeypatch, tmp_path, capsys):
    """--chat-template through a tokenizer folder: generate's prompts are the ids the model's forward pass gets."""
    from bamctl.backends.hf_common import LengthPolicy
    from bamctl.cli import main

    streamed = []
    fit_prefix = LengthPolicy.fit_prefix

    def recorded(self, prefix, ids, after=0):
        streamed.append(fit_prefix(self, prefix, ids, after))  # the ids generation starts from
        return streamed[-1]

    monkeypatch.setattr(LengthPolicy, "fit_prefix", recorded)
    options = ["--lengths", "1k", "--samples", "1", "--tokenizer", str(chat_model), "--chat-template", "--haystack", str(text_file)]
    out = tmp_path / "prompts.jsonl"
    with pytest.raises(SystemExit) as done:
        main(["generate", "niah_single_1,niah_multivalue", *options, "--out", str(out)])
    assert done.value.code == 0, capsys.readouterr().err
    written = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    with pytest.raises(SystemExit) as done:
        main(["ruler", f"hf:{chat_model}", "--task", "niah_single_1,niah_multivalue", *options, "--dir", str(tmp_path / "r"), "--quiet", "--json"])
    assert done.value.code == 0, capsys.readouterr().err
    assert len(written) == 2 and all(row["prompt"].startswith("<s>[user] ") for row in written)
    assert streamed == [row["input_ids"] for row in written]
