"""`bamctl new`, `inspect`, `models` and the one-line error contract, through the real entry point."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from bamctl.checkpoint import load_checkpoint
from bamctl.cli import main
from bamctl.cli.model_commands import PE_NAMES, PRESET_NAMES
from bamctl.model import PRESETS
from bamctl.positional import PE_REGISTRY


@pytest.fixture
def bamctl(capsys, monkeypatch):
    """Run the real entry point in-process; returns returncode, stdout, stderr."""

    def run(*args, env=None):
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
        with pytest.raises(SystemExit) as exit_info:
            main(list(args))
        captured = capsys.readouterr()
        return SimpleNamespace(returncode=exit_info.value.code, stdout=captured.out, stderr=captured.err)

    return run


def test_new_then_inspect_shows_per_head_priors(bamctl, tmp_path):
    out = tmp_path / "m"
    result = bamctl("new", "--pe", "bam-ssmax", "--preset", "micro", "--seed", "3", "--out", str(out))
    assert result.returncode == 0, result.stderr
    checkpoint = load_checkpoint(out)
    assert checkpoint.model.config.pe == "bam" and checkpoint.model.config.ssmax
    shown = bamctl("inspect", str(out), "--json")
    assert shown.returncode == 0, shown.stderr
    payload = json.loads(shown.stdout)
    assert payload["n_params"] == checkpoint.model.n_params()
    assert len(payload["heads"]) == 2 * 4  # micro: 2 layers x 4 heads
    first = payload["heads"][0]
    assert first["beta"] == 0.0 and first["ssmax_s"] == 1.0  # flat init, SSMax s = 1
    table = bamctl("inspect", str(out))
    assert "bam-ssmax" in table.stdout and "ssmax_s" in table.stdout


def test_models_lists_the_catalog(bamctl, tmp_path):
    root = tmp_path / "baselines"
    assert bamctl("new", "--pe", "alibi", "--preset", "micro", "--out", str(root / "alibi-test")).returncode == 0
    env = {"BAMCTL_BASELINES_DIR": str(root)}
    listed = json.loads(bamctl("models", "--json", env=env).stdout)
    assert [entry["name"] for entry in listed] == ["alibi-test"]
    assert listed[0]["pe"] == "alibi" and listed[0]["train_length"] == 512


@pytest.mark.parametrize(
    "args, message",
    [
        (["new", "--out", "X", "--pe", "bamm"], "did you mean bam"),
        (["new", "--out", "X", "--preset", "huge"], "unknown preset"),
        (["new"], "Missing option"),
        (["new", "--out", "X", "--seed", "abc"], "Invalid value"),
        (["inspect", "no/such/model"], "unknown model"),
        (["frobnicate"], "No such command"),
        # the choice's own words, without the validation library's "Value error, " before them
        (["passkey", "rope", "--lengths", "128", "--dtype", "f32"], "Invalid value for '--dtype': 'f32' is not one of 'auto', "),
    ],
)
def test_bad_input_is_one_line_and_exit_2(bamctl, tmp_path, args, message):
    args = [str(tmp_path / a) if a == "X" else a for a in args]
    result = bamctl(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_debug_variable_shows_the_traceback(tmp_path):
    env = {**__import__("os").environ, "BAMCTL_DEBUG": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "bamctl", "inspect", str(tmp_path / "missing")], capture_output=True, text=True, env=env
    )
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_entry_point_exit_code_and_single_line_from_a_real_process():
    result = subprocess.run([sys.executable, "-m", "bamctl", "new", "--out", "x", "--pe", "nothing"], capture_output=True, text=True)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1


def test_version_and_help(bamctl):
    assert bamctl("--version").stdout.startswith("bamctl ")
    helped = bamctl("new", "--help")
    assert helped.returncode == 0 and "Example" in helped.stdout


def test_help_lists_every_preset():
    assert PRESET_NAMES == ", ".join(PRESETS)


def test_help_lists_every_positional_encoding_of_the_zoo():
    # the help is written without importing torch; the zoo's registry is what `--pe NAME` builds
    assert PE_NAMES == ", ".join(PE_REGISTRY)
