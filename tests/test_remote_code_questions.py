"""transformers never asks its y/N question about a folder's own code: bamctl always says whether it
may run, for the model and for the tokenizer, and stdin is closed to transformers besides. Run as a
user runs it, with stdin open and never written to (a terminal, or a scheduler's pipe): without that,
the question waits 15 s on a terminal and for ever where no alarm fires."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="transformers not installed (pip install 'bamctl[hf]')")

from test_remote_code import remote_code_folder  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "Do you wish to run the custom code"
TOKENIZATION = """
from transformers import PreTrainedTokenizerFast


class HalvedTokenizer(PreTrainedTokenizerFast):
    \"\"\"The folder's own tokenizer class, which only its code defines.\"\"\"
"""


def _with_tokenizer_code(folder: Path) -> Path:
    """The folder's tokenizer named by its tokenizer_config.json's auto_map, as remote-code models ship it."""
    (folder / "tokenization_halved.py").write_text(TOKENIZATION)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(tokenizer_class="HalvedTokenizer", auto_map={"AutoTokenizer": [None, "tokenization_halved.HalvedTokenizer"]})
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def _bamctl_with_stdin_open(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``bamctl ARGS`` with a pipe for stdin that stays open and empty, as a terminal nobody types into."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, "-m", "bamctl", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = process.communicate(timeout=timeout)  # communicate closes stdin only after the process ends
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"bamctl {' '.join(args)} still waited after {timeout} s: {out[-500:]} {err[-500:]}")
    return subprocess.CompletedProcess(args, process.returncode, out, err)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return _with_tokenizer_code(remote_code_folder(tmp_path_factory.mktemp("remote") / "m"))


def test_with_the_flag_a_folders_tokenizer_code_runs_and_nothing_is_asked(folder, tmp_path):
    done = _bamctl_with_stdin_open("passkey", f"hf:{folder}", "--trust-remote-code", "--lengths", "128", "--samples", "1",
                                   "--depths", "0.5", "--device", "cpu", "--dir", str(tmp_path / "res"), "--json")
    assert QUESTION not in done.stdout + done.stderr
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)  # stdout holds the JSON document alone: nothing transformers printed


def test_without_the_flag_a_folders_tokenizer_code_is_one_line_at_once(folder, tmp_path):
    done = _bamctl_with_stdin_open("passkey", f"hf:{folder}", "--lengths", "128", "--samples", "1", "--device", "cpu",
                                   "--dir", str(tmp_path / "res"), timeout=60)
    assert QUESTION not in done.stdout + done.stderr
    said = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(said) == 1, done.stderr
    assert "tokenization_halved.py" in said[0] and "tokenizer_config.json" in said[0] and "--trust-remote-code" in said[0]


def test_inspect_takes_the_run_commands_flag(folder):
    """One flag, one help text: `bamctl inspect --help` says what `bamctl passkey --help` says of it."""
    from bamctl.cli.options import TRUST_REMOTE_CODE_HELP

    done = _bamctl_with_stdin_open("inspect", f"hf:{folder}", "--trust-remote-code", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["model_type"] == "halved-llama", done.stderr
    import typer

    from bamctl.cli.app import app

    commands = typer.main.get_command(app).commands
    helps = {name: [p.help for p in commands[name].params if "--trust-remote-code" in p.opts] for name in ("inspect", "passkey")}
    assert helps == {"inspect": [TRUST_REMOTE_CODE_HELP], "passkey": [TRUST_REMOTE_CODE_HELP]}
