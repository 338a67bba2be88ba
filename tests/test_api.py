"""The Python API: ``bamctl.evaluate`` and ``bamctl.compare`` make the command line's run, and take
models still in memory (a bamctl ``Transformer``, a Hugging Face module with its tokenizer)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import bamctl
from bamctl.backends.in_memory import state_digest
from bamctl.checkpoint import new_random_model, save_checkpoint
from bamctl.cli import main
from bamctl.errors import BamctlError
from bamctl.model import ModelConfig
from bamctl.results.store import ResultStore

ROOT = Path(__file__).resolve().parents[1]
VOLATILE = ["run_id", "created_at", "seconds", "tokens_per_s", "peak_mem_bytes", "git_revision"]
KEYS = ["model", "task", "protocol", "setting", "length", "depth", "seed", "sample", "position"]
PASSKEY = dict(lengths="256,512", samples=1, depths=2, seeds=[0, 1])
PASSKEY_FLAGS = ["--lengths", "256,512", "--samples", "1", "--depths", "2", "--seed", "0,1"]


def tiny(pe: str = "bam-ssmax", seed: int = 0):
    return new_random_model(ModelConfig.from_preset("micro", pe, train_length=128), seed)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("api-models")
    return {pe: str(save_checkpoint(tiny(pe, seed), root / pe)) for pe, seed in (("bam-ssmax", 0), ("rope", 1))}


def cli(*args) -> int:
    with pytest.raises(SystemExit) as done:
        main(list(args))
    return done.value.code


def stable(frame):
    return frame.drop(columns=VOLATILE).sort_values(KEYS).reset_index(drop=True)


@pytest.mark.parametrize("task, api, flags", [
    ("passkey", PASSKEY, PASSKEY_FLAGS),
    ("ppl", dict(lengths="64,128", doc_tokens=200, stride=32), ["--lengths", "64,128", "--doc-tokens", "200", "--stride", "32"]),
])
def test_the_api_writes_the_rows_the_command_line_writes(models, tmp_path, task, api, flags):
    assert cli(task, models["bam-ssmax"], *flags, "--dir", str(tmp_path / "cli"), "--quiet") == 0
    returned = bamctl.evaluate(models["bam-ssmax"], task, **api, dir=tmp_path / "api", quiet=True)
    by_cli, by_api = ResultStore(tmp_path / "cli").read(), ResultStore(tmp_path / "api").read()
    assert len(by_cli) == len(by_api) == len(returned) > 0
    assert list(by_cli.columns) == list(by_api.columns)
    assert stable(by_cli).equals(stable(by_api))
    assert stable(returned).equals(stable(by_api))  # what evaluate returns is what it stored


def test_compare_gives_the_summary_the_command_line_prints(models, tmp_path, capsys):
    both = [models["bam-ssmax"], models["rope"]]
    assert cli("compare", *both, *PASSKEY_FLAGS, "--dir", str(tmp_path), "--json", "--quiet", "--baseline", "rope") == 0
    printed = json.loads(capsys.readouterr().out)
    result = bamctl.compare(both, "passkey", **PASSKEY, dir=tmp_path, baseline="rope", quiet=True)
    assert result.to_json() == printed  # every row read back from the command line's run
    assert set(result.rows["model"]) == {"bam-ssmax", "rope"}
    table = result.table()
    assert "effective length" in table and "rope" in table and "bam-ssmax" in table


def test_the_api_loads_no_command_line_code(models, tmp_path):
    script = (
        "import sys, bamctl\n"
        "assert 'torch' not in sys.modules and 'typer' not in sys.modules  # import bamctl stays light\n"
        f"rows = bamctl.evaluate({models['rope']!r}, 'passkey', lengths='256', samples=1, depths=1, dir={str(tmp_path)!r}, quiet=True)\n"
        "assert len(rows) == 1, rows\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('bamctl.cli') or m in ('typer', 'click'))\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("call, message", [
    (dict(task="passkey", lengths="1k..abc"), "length"),
    (dict(task="nosuchtask"), "nosuchtask"),
    (dict(task="passkey", seeds="x"), "^seeds takes integers"),  # the keyword, not the command line's --seed
    (dict(task="passkey", seeds=[0.5]), "^seeds takes integers"),
    (dict(task="passkey", batch_size=0), "batch_size"),
    (dict(task="passkey", stride=4), "^stride applies to task ppl only"),
    (dict(task="passkey", no_such_option=1), "no keyword 'no_such_option'"),
    (dict(task="passkey", seed=3), "no keyword 'seed'; did you mean seeds"),
    (dict(task="passkey", samples=0), "samples takes a positive integer"),  # not the task's default
    (dict(task="passkey", samples="3"), "samples takes a positive integer .*'3'"),
    (dict(task="passkey", samples=2.7), "samples takes a positive integer .*2.7"),
    (dict(task="passkey", lengths=[128.5]), "lengths takes token counts .*128.5"),  # not 128
    (dict(task="passkey", depths=[0.5, "x"]), "depths takes a count"),
    (dict(task="passkey", chunk_size=0), "^chunk_size takes a positive integer"),
    (dict(task="passkey", force="yes"), "^force takes True or False"),
    (dict(task=3), "^task takes a task name"),
])
def test_bad_input_is_one_error_before_any_work(models, tmp_path, call, message):
    out = tmp_path / "results"
    with pytest.raises(BamctlError, match=message):
        bamctl.evaluate(models["rope"], dir=out, **call)
    assert not out.exists()


def test_no_model_and_one_depth_are_what_they_say(models, tmp_path):
    with pytest.raises(BamctlError, match="models is an empty list"):
        bamctl.evaluate([], dir=tmp_path / "r")
    assert not (tmp_path / "r").exists()
    rows = bamctl.evaluate(models["rope"], lengths=[256], samples=1, depths=0.5, dir=tmp_path / "r")  # one depth, a fraction
    assert len(rows) == 1 and float(rows["depth"].iloc[0]) == 0.5


def test_dir_is_the_results_directory_and_out_its_old_name(models, tmp_path):
    ask = dict(lengths="256", samples=1, depths=0.5, quiet=True)
    rows = bamctl.evaluate(models["rope"], dir=tmp_path / "new", **ask)
    with pytest.warns(DeprecationWarning, match="out= is now dir="):
        old = bamctl.evaluate(models["rope"], out=tmp_path / "old", **ask)
    assert len(ResultStore(tmp_path / "new").read()) == len(ResultStore(tmp_path / "old").read()) == 1
    assert old["score"].tolist() == rows["score"].tolist()
    with pytest.raises(BamctlError, match="^out is the old name of dir: give dir alone$"):
        bamctl.compare([models["rope"]], out=tmp_path / "a", dir=tmp_path / "b", **ask)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_quiet_says_nothing_when_the_run_goes_as_planned(models, tmp_path, capfd):
    ask = dict(lengths="256", samples=1, depths=0.5, dir=tmp_path)
    bamctl.evaluate(models["rope"], **ask)
    assert "batches (batch_size auto)" in capfd.readouterr().err
    bamctl.evaluate(models["rope"], **ask, quiet=True)  # its rows reused, as asked
    bamctl.evaluate(models["rope"], **ask, force=True, quiet=True)
    assert capfd.readouterr().err == ""


def test_compare_refuses_a_keyword_evaluate_does_not_take(models, tmp_path):
    with pytest.raises(BamctlError, match="no keyword 'no_such_option' .it takes: lengths"):
        bamctl.compare([models["rope"]], "passkey", no_such_option=1, dir=tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_a_baseline_that_is_not_compared_is_refused_before_any_work(models, tmp_path):
    with pytest.raises(BamctlError, match="baseline alibi is not one of the models compared"):
        bamctl.compare([models["rope"]], "passkey", lengths="256", dir=tmp_path / "r", baseline="alibi")
    assert not (tmp_path / "r").exists()


# -- a bamctl Transformer in memory ---------------------------------------------------------


def test_a_transformer_in_memory_scores_what_its_saved_folder_scores(tmp_path):
    model = tiny()
    folder = save_checkpoint(model, tmp_path / "saved")
    in_memory = bamctl.evaluate(model, "passkey", **PASSKEY, dir=tmp_path / "a", quiet=True)
    on_disk = bamctl.evaluate(str(folder), "passkey", **PASSKEY, dir=tmp_path / "b", quiet=True)
    a, b = stable(in_memory), stable(on_disk)
    assert len(a) == len(b) == 8
    for column in ("score", "predicted", "correct", "expected", "request_digest", "fingerprint", "backend", "compute_version"):
        assert a[column].tolist() == b[column].tolist(), column
    assert set(a["model"]) == {"in-memory-bam-ssmax"} and set(b["model"]) == {"saved"}
    assert a["model_hash"].iloc[0] != b["model_hash"].iloc[0]  # its identity is its state dict's, not a file's


def _train(model, steps: int) -> None:
    """A few steps of next-token training on the shipped training text."""
    from bamctl.tokenizer import get_tokenizer
    from bamctl.train.data import shipped_text_tokens

    tokens = shipped_text_tokens(get_tokenizer("gpt2"), "train")
    rng = np.random.default_rng(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        rows = torch.from_numpy(np.stack([tokens.window(129, u) for u in rng.random(8)]))
        logits = model(rows[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), rows[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def perplexity(rows) -> dict[int, float]:
    cells = rows.groupby("length")[["nll", "n_scored"]].sum()
    return dict(np.exp(cells["nll"] / cells["n_scored"]))


def test_training_a_few_steps_changes_the_curve_and_each_weights_keep_their_rows(tmp_path):
    model = tiny()
    ask = dict(lengths="64,128,256", doc_tokens=300, dir=tmp_path, quiet=True, names="run")
    before = bamctl.evaluate(model, "ppl", **ask)
    _train(model, steps=20)
    assert model.training  # evaluate left it as the loop had it
    after = bamctl.evaluate(model, "ppl", **ask)
    again = bamctl.evaluate(model, "ppl", **ask)
    assert before["model_hash"].nunique() == after["model_hash"].nunique() == 1
    assert before["model_hash"].iloc[0] != after["model_hash"].iloc[0]
    curve_before, curve_after = perplexity(before), perplexity(after)
    assert set(curve_before) == set(curve_after) == {64, 128, 256}
    assert all(curve_after[n] < 0.8 * curve_before[n] for n in curve_before)  # it learned, and the curve says so
    assert stable(again).equals(stable(after))
    assert again.sort_values(KEYS)["created_at"].tolist() == after.sort_values(KEYS)["created_at"].tolist()  # read back
    assert len(ResultStore(tmp_path).read()) == len(before) + len(after)


def test_a_model_in_memory_is_left_as_it_was_found(tmp_path):
    model = tiny()
    model.train()
    digest = state_digest(model)
    rows = bamctl.evaluate(model, "passkey", lengths="256", samples=1, depths=1, dtype="bfloat16", dir=tmp_path, quiet=True)
    assert rows["dtype"].tolist() == ["bfloat16"]
    assert model.training and state_digest(model) == digest  # evaluated on a copy in bfloat16
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_a_model_in_memory_cannot_be_sharded(tmp_path):
    with pytest.raises(BamctlError, match="a model in memory cannot be sharded"):
        bamctl.evaluate(tiny(), "passkey", lengths="256", shard="0/2", dir=tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_what_is_not_a_model_is_refused_by_name(tmp_path):
    with pytest.raises(BamctlError, match="cannot evaluate a int"):
        bamctl.evaluate(42, "passkey", dir=tmp_path)
    with pytest.raises(BamctlError, match="a dict with unknown key 'weights'"):  # a dict describes a module
        bamctl.evaluate({"weights": 1}, "passkey", dir=tmp_path)


# -- a Hugging Face module in memory -------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    pytest.importorskip("transformers", reason="transformers not installed (pip install 'bamctl[hf]')")
    from tiny_llama import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def test_a_hugging_face_module_in_memory_scores_what_hf_folder_scores(tiny_llama, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from tiny_llama import WORDS

    corpus = tmp_path / "words.txt"
    corpus.write_text(" ".join(f"w{(5 * i + i // 7) % WORDS}" for i in range(300)))
    ask = dict(lengths="8,16", doc_tokens=40, stride=4, corpus=corpus, device="cpu", quiet=True)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama), local_files_only=True)
    model.train()
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_llama), local_files_only=True)
    in_memory = bamctl.evaluate((model, tokenizer), "ppl", **ask, dir=tmp_path / "a")
    on_disk = bamctl.evaluate(f"hf:{tiny_llama}", "ppl", **ask, dir=tmp_path / "b")
    a, b = stable(in_memory), stable(on_disk)
    assert len(a) == len(b) > 10
    assert a["request_digest"].tolist() == b["request_digest"].tolist()  # the same ids fed, BOS included
    assert np.abs(a["nll"].to_numpy() - b["nll"].to_numpy()).max() <= 1e-5
    assert set(a["backend"]) == {"hf"} and a["model_hash"].iloc[0] != b["model_hash"].iloc[0]
    assert model.training


def test_a_hugging_face_module_without_its_tokenizer_is_refused(tiny_llama, tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama), local_files_only=True)
    with pytest.raises(BamctlError, match="needs its tokenizer"):
        bamctl.evaluate(model, "ppl", dir=tmp_path)


# -- the example scripts --------------------------------------------------------------------


def _run_example(name: str, *args: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / name), *args], capture_output=True, text=True, cwd=cwd,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_plain_training_loop_example_prints_a_curve_per_evaluation(tmp_path):
    out = _run_example("evaluate_while_training.py", "--steps", "4", "--every", "2", "--lengths", "128,256",
                       "--dir", str(tmp_path / "r"), cwd=tmp_path)
    lines = [line for line in out.splitlines() if line.startswith("step ")]
    assert [line.split(":")[0] for line in lines] == ["step 2", "step 4"]
    assert all("128:" in line and "256:" in line for line in lines)
    assert ResultStore(tmp_path / "r").read()["model"].nunique() == 2


def test_the_trainer_callback_example_evaluates_the_model_being_trained(tiny_llama, tmp_path):
    pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate (pip install 'bamctl[hf]')")
    from tiny_llama import WORDS

    text = tmp_path / "words.txt"
    text.write_text(" ".join(f"w{(5 * i + i // 7) % WORDS}" for i in range(2000)))
    out = _run_example("trainer_callback.py", "--model", str(tiny_llama), "--steps", "4", "--every", "2",
                       "--train-length", "16", "--lengths", "8,16", "--text", str(text), "--corpus", str(text),
                       "--dir", str(tmp_path / "r"), cwd=tmp_path)
    lines = [line for line in out.splitlines() if line.startswith("step ")]
    assert [line.split(":")[0] for line in lines] == ["step 2", "step 4"]
    rows = ResultStore(tmp_path / "r").read()
    assert rows.groupby("model")["model_hash"].nunique().tolist() == [1, 1] and rows["model_hash"].nunique() == 2
