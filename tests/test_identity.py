"""What a stored number is of: the model (weights and every config field that changes a forward
pass), the dtype it ran in, and, for perplexity, the tokens the model scores."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bamctl.checkpoint import CONFIG_FILE, load_checkpoint, new_random_model, save_checkpoint
from bamctl.model import ModelConfig
from bamctl.results.schema import VERSION_KEY
from bamctl.results.store import ResultStore
from test_fingerprints import run

PASSKEY = ["--task", "passkey", "--lengths", "128", "--samples", "2", "--depths", "0.5"]


def _summaries(captured) -> list[dict]:
    return json.loads(captured.out)["summaries"]


# -- model identity --------------------------------------------------------------------------


def test_nope_and_rope_of_one_seed_are_two_models(tmp_path, capsys):
    """The issue's scenario: parameter-free PEs leave the weights alike; the configs differ."""
    a, b, out = tmp_path / "A", tmp_path / "B", tmp_path / "r"
    run(capsys, "new", "--pe", "nope", "--preset", "micro", "--seed", "1", "--train-length", "128", "--out", str(a))
    run(capsys, "new", "--pe", "rope", "--preset", "micro", "--seed", "1", "--train-length", "128", "--out", str(b))
    assert load_checkpoint(a).sha256 == load_checkpoint(b).sha256  # same weights file ...
    assert load_checkpoint(a).model_hash != load_checkpoint(b).model_hash  # ... two models
    captured = run(capsys, "compare", str(a), str(b), *PASSKEY, "--dir", str(out), "--json")
    assert "skipped" not in captured.err
    (summary,) = _summaries(captured)
    assert summary["models"] == ["A", "B"]
    assert {row["model"] for row in ResultStore(out).read().to_dict("records")} == {"A", "B"}


def _edit_config(path, **model_fields):
    config = json.loads((path / CONFIG_FILE).read_text())
    config["model"].update(model_fields)
    (path / CONFIG_FILE).write_text(json.dumps(config))


EDITS = {
    "rope_base": ("rope", {}, {"rope_base": 500000.0}),
    "ssmax_scope": ("alibi-ssmax", {}, {"ssmax_scope": "content"}),
    "bam_prior_form": ("bam", {}, {"bam_prior_form": "scaled_distance"}),
    "token_subset": ("rope", {"vocab_size": 4, "token_subset": [10, 11, 12]}, {"token_subset": [10, 11, 13]}),
    "architecture": ("rope", {}, {"n_heads": 2}),  # same weight shapes, other heads
    "train_length": ("rope", {}, {"train_length": 256}),
    "tokenizer_name": ("nope", {}, {"tokenizer": "other"}),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_every_forward_field_of_the_config_moves_the_hash(tmp_path, edit):
    pe, overrides, change = EDITS[edit]
    config = ModelConfig.from_preset("micro", pe, train_length=128, **overrides)
    path = save_checkpoint(new_random_model(config, 0), tmp_path / "m")
    before = load_checkpoint(path).model_hash
    _edit_config(path, **change)
    assert load_checkpoint(path).model_hash != before


def test_descriptive_fields_and_the_folder_name_keep_the_hash(tmp_path):
    model = new_random_model(ModelConfig.from_preset("micro", "bam", train_length=128), 0)
    path = save_checkpoint(model, tmp_path / "m", recipe={"description": "one"}, provenance={"created_by": "x"})
    before = load_checkpoint(path).model_hash
    config = json.loads((path / CONFIG_FILE).read_text())
    config["recipe"], config["provenance"], config["bamctl_version"] = {"description": "two"}, {}, "9.9"
    config["model"]["rope_base"] = int(config["model"]["rope_base"])  # 10000 and 10000.0 are one value
    (path / CONFIG_FILE).write_text(json.dumps(config))
    renamed = tmp_path / "renamed"
    shutil.copytree(path, renamed)
    assert load_checkpoint(path).model_hash == before == load_checkpoint(renamed).model_hash


def test_a_renamed_checkpoint_finds_its_rows_by_content(tmp_path, capsys):
    model = new_random_model(ModelConfig.from_preset("micro", "rope", train_length=128), 0)
    first = save_checkpoint(model, tmp_path / "first")
    out = tmp_path / "r"
    run(capsys, "compare", str(first), *PASSKEY, "--dir", str(out))
    second = tmp_path / "second"
    first.rename(second)
    captured = run(capsys, "compare", str(second), *PASSKEY, "--dir", str(out), "--json")
    assert "2 samples already in" in captured.err
    (summary,) = _summaries(captured)
    assert summary["models"] == ["second"]


def test_weights_verification_is_apart_from_the_model_identity(tmp_path):
    model = new_random_model(ModelConfig.from_preset("micro", "rope", train_length=128), 0)
    path = save_checkpoint(model, tmp_path / "m")
    checkpoint = load_checkpoint(path)
    assert checkpoint.sha256 == json.loads((path / CONFIG_FILE).read_text())["weights_sha256"]
    assert not checkpoint.sha256.startswith(checkpoint.model_hash)


def _rewrite_as_version(out, version: int, **changes):
    """The stored rows, rewritten as a file of schema ``version`` (changes applied)."""
    store = ResultStore(out)
    table = store.read_table()
    rows = [{**row, **changes} for row in table.to_pylist()]
    shutil.rmtree(out)
    out.mkdir()
    old = pa.Table.from_pylist(rows, schema=table.schema).replace_schema_metadata({VERSION_KEY: str(version).encode()})
    pq.write_table(old, out / "part-00000000000000000001-old.parquet")


def test_rows_of_the_old_hash_definition_are_recomputed(tmp_path, capsys):
    model = new_random_model(ModelConfig.from_preset("micro", "rope", train_length=128), 0)
    path = save_checkpoint(model, tmp_path / "m")
    out = tmp_path / "r"
    run(capsys, "compare", str(path), *PASSKEY, "--dir", str(out))
    _rewrite_as_version(out, 5, score=0.123)  # before request digests (version 6)
    captured = run(capsys, "compare", str(path), *PASSKEY, "--dir", str(out), "--json")
    assert "skipped" not in captured.err
    (summary,) = _summaries(captured)
    assert all(cell["score"] != pytest.approx(0.123) for cell in summary["cells"])


def test_authors_args_and_prior_form_move_the_hash(tmp_path):
    from test_external_authors import build

    from bamctl.backends.authors import load_authors_checkpoint

    folder, *_ = build(tmp_path, "bam")
    base = load_authors_checkpoint(folder).model_hash
    assert load_authors_checkpoint(folder, "scaled_distance").model_hash != base
    args = json.loads((folder / "args.json").read_text())
    args["model_args"]["norm_eps"] = 1e-6
    (folder / "args.json").write_text(json.dumps(args))
    assert load_authors_checkpoint(folder).model_hash != base


# -- numeric identity ------------------------------------------------------------------------


def test_a_bfloat16_rerun_after_float32_is_computed_and_summarised_apart(tmp_path, capsys):
    model = new_random_model(ModelConfig.from_preset("micro", "rope", train_length=128), 0)
    path = save_checkpoint(model, tmp_path / "m")
    out = tmp_path / "r"
    run(capsys, "compare", str(path), *PASSKEY, "--dir", str(out), "--dtype", "float32")
    captured = run(capsys, "compare", str(path), *PASSKEY, "--dir", str(out), "--dtype", "bfloat16", "--json")
    assert "skipped" not in captured.err
    rows = ResultStore(out).read()
    assert sorted(rows["dtype"]) == ["bfloat16"] * 2 + ["float32"] * 2
    assert set(rows["attention"]) <= {"native", "blockwise", "fused", "dense"}  # what ran, never "auto"
    assert set(rows["device"]) == {"cpu"}
    captured = run(capsys, "results", "show", "--dir", str(out), "--engines")
    assert "float32" in captured.out and "bfloat16" in captured.out  # two tables, each titled by its dtype
    assert captured.out.count("passkey / exact") == 2
    assert "native" in captured.out and "cpu" in captured.out  # --engines: what each ran on


def test_tables_never_pool_dtypes():
    from results_fakes import fake_row

    from bamctl.results.schema import rows_to_table
    from bamctl.results.store import to_pandas
    from bamctl.results.summary import summarize

    rows = [fake_row("tiny-rope", score=1.0), fake_row("tiny-rope", score=0.0)]
    rows[1]["dtype"] = "bfloat16"
    rows[1]["attention"] = "other path"  # a path alone never splits a table
    summaries = summarize(to_pandas(rows_to_table(rows)))
    assert len(summaries) == 2
    assert sorted(s.dtype for s in summaries) == ["bfloat16", "float32"]
    assert all(s.dtype in s.title for s in summaries)
    rows[1]["dtype"] = "float32"
    rows[1]["sample"] = 1
    (summary,) = summarize(to_pandas(rows_to_table(rows)))
    assert "float32" not in summary.title  # one dtype: nothing to tell apart


# -- perplexity's token set ------------------------------------------------------------------


def test_models_scoring_other_token_sets_have_other_ppl_fingerprints(tmp_path):
    from bamctl.backends import RunOptions, open_backend
    from bamctl.evaluation import Evaluation, TaskRequest

    paths = {}
    for name, subset in (("full", None), ("small", list(range(300))), ("small-again", list(range(300))), ("other", list(range(1, 301)))):
        vocab = {} if subset is None else {"vocab_size": len(subset) + 1, "token_subset": subset}
        config = ModelConfig.from_preset("micro", "rope", train_length=128, **vocab)
        paths[name] = str(save_checkpoint(new_random_model(config, 0), tmp_path / name))

    def fingerprint(name, task):
        backend = open_backend(paths[name], RunOptions(device="cpu"))
        request = TaskRequest(task, [128], samples=1, seeds=[0], **({"depths": [0.5]} if task == "passkey" else {}))
        return Evaluation(backend, request, ResultStore(tmp_path / "r"), model_name=name).common["fingerprint"]

    ppl = {name: fingerprint(name, "ppl") for name in paths}
    assert ppl["small"] == ppl["small-again"]
    assert len({ppl["full"], ppl["small"], ppl["other"]}) == 3
    assert fingerprint("full", "passkey") == fingerprint("small", "passkey")  # same prompts, scored by argmax


# -- training's protocol ---------------------------------------------------------------------


class CharTokenizer:
    """One token per character: the authors' passkey scoring accepts it (one token per digit)."""

    name, vocab_size, eos_id, bos_id, fingerprint = "chars", 256, None, None, "chars-v1"

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_training_rows_use_their_own_protocol_whatever_the_tokenizer():
    from bamctl.tasks.passkey import authors_scoring
    from bamctl.train.data import passkey_row

    tokenizer = CharTokenizer()
    assert authors_scoring(tokenizer, 5) is None  # `auto` would pick the authors' form here
    ids, digits = passkey_row(tokenizer, 400, seed=0, depth=0.5)
    n = len(digits) // 3  # the key twice in the needle, then the answer
    copies = [tokenizer.decode([ids[i] for i in digits[k * n:(k + 1) * n]]) for k in range(3)]
    assert len(ids) == 400 and len(set(copies)) == 1 and copies[0].strip().isdigit() and len(copies[0].strip()) == 5


def test_hf_config_files_move_the_hash(tmp_path):
    pytest.importorskip("transformers", reason="transformers not installed (pip install 'bamctl[hf]')")
    from tiny_llama import save_tiny_llama

    from bamctl.backends.hf_common import model_fingerprint

    folder = save_tiny_llama(tmp_path / "hf", max_positions=32, seed=1)
    hashes = [model_fingerprint(folder, None)]
    generation = folder / "generation_config.json"
    generation.write_text(json.dumps({**json.loads(generation.read_text()), "eos_token_id": [2, 5]}))
    hashes.append(model_fingerprint(folder, None))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "rope_theta": 1234.0}))
    hashes.append(model_fingerprint(folder, None))
    assert len(set(hashes)) == 3
    renamed = tmp_path / "renamed"
    shutil.copytree(folder, renamed)
    assert model_fingerprint(renamed, None) == hashes[-1]
