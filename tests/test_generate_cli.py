"""`bamctl generate`: the JSONL it writes, byte-identical reruns, one-line errors."""

import json
import subprocess
import sys

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
    result = CliRunner().invoke(app, ["generate", "niah_multivalue", "--lengths", "2k", "--out", str(out)])
    assert result.exit_code == 0, result.output
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(row["answers"]) == 4 and len(row["needle_positions"]) == 4
    assert row["n_tokens"] + row["max_new_tokens"] <= 2048
    result = CliRunner().invoke(app, ["generate", "passkey", "--protocol", "landmark", "--lengths", "1k", "--depths", "1", "--out", str(out)])
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
        (["generate", "passkey", "--lengths", "1k", "--protocol", "lndmark"], "did you mean landmark"),
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


def test_bad_input_in_a_real_process(tmp_path):
    run = _bamctl("generate", "niah_single_9", "--lengths", "1k", "--out", str(tmp_path / "x.jsonl"))
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0 and "did you mean" in run.stderr
