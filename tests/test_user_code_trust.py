"""Code users bring, trusted as far as they asked and identified by what it is (``bamctl.consent``,
``bamctl.local_code``, ``bamctl.plugins``): a checkpoint's own code runs only with
``--trust-remote-code``; a ``py:`` model's identity is the bytes of every file it imports from its
folder and its arguments, never where the files lie; two files with same-named helpers each run
their own. Each case runs the command line as a user runs it, on files written here in two folders."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "positional"

MODEL = textwrap.dedent("""\
    import torch
    from bamctl.tokenizer import gpt2_tokenizer
    import helper

    class Tiny(torch.nn.Module):
        train_length = 128

        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(50257, 8)
            self.head = torch.nn.Linear(8, 50257)

        def forward(self, ids):
            return self.head(self.emb(ids)) + helper.bias(50257)

    def build(temperature=1.0):
        torch.manual_seed(0)
        model = Tiny()
        # reaches the logits unseen by the weights, the repr and the module's settings
        model.register_forward_hook(lambda module, inputs, out: out / temperature)
        return model, gpt2_tokenizer()
    """)


def helper_favouring(digit: str) -> str:
    """A helper whose bias makes the model predict ``digit`` everywhere."""
    from bamctl.tokenizer import gpt2_tokenizer

    (token,) = gpt2_tokenizer().encode(digit)
    return f"import torch\n\ndef bias(vocab):\n    b = torch.zeros(vocab)\n    b[{token}] = 100.0\n    return b\n"


def write_model(folder: Path, digit: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(MODEL)
    (folder / "helper.py").write_text(helper_favouring(digit))
    return folder / "model.py"


def passkey(reference: str, out: Path, capsys, *extra: str) -> tuple[pd.DataFrame, str]:
    """``bamctl passkey REFERENCE`` in this process; its rows and what it said on stderr."""
    from bamctl.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["passkey", reference, "--lengths", "128", "--samples", "1", "--depths", "0.5", "--dir", str(out), *extra])
    said = capsys.readouterr().err
    assert exited.value.code == 0, said
    return pd.read_parquet(out), said


def test_two_files_with_same_named_helpers_each_run_their_own(tmp_path, capsys):
    first, second = write_model(tmp_path / "a", "1"), write_model(tmp_path / "b", "2")
    from bamctl.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["compare", f"py:{first}:build", f"py:{second}:build", "--task", "passkey", "--lengths", "128",
              "--samples", "2", "--depths", "0.5", "--dir", str(tmp_path / "res")])
    assert exited.value.code == 0, capsys.readouterr().err
    rows = pd.read_parquet(tmp_path / "res")
    predicted = {name: set(group["predicted"]) for name, group in rows.groupby("model_hash")}
    assert len(predicted) == 2  # two models: their helpers differ
    texts = sorted("".join(sorted(p)) for p in predicted.values())
    assert "1" in texts[0] and "2" not in texts[0] and "2" in texts[1] and "1" not in texts[1], predicted


def test_an_edited_helper_is_another_model_and_recomputes(tmp_path, capsys):
    model = write_model(tmp_path / "a", "1")
    first, _ = passkey(f"py:{model}:build", tmp_path / "res", capsys)
    (tmp_path / "a" / "helper.py").write_text(helper_favouring("7"))
    rows, said = passkey(f"py:{model}:build", tmp_path / "res", capsys)
    assert "skipped" not in said, said  # nothing reused: the helper the model imports changed
    assert rows["model_hash"].nunique() == 2
    newest = rows[rows["model_hash"] != first["model_hash"].iloc[0]]
    assert all("7" in p and "1" not in p for p in newest["predicted"]), newest["predicted"]


def test_a_copy_in_another_folder_is_the_same_model_and_reuses_its_rows(tmp_path, capsys):
    model = write_model(tmp_path / "a", "1")
    first, _ = passkey(f"py:{model}:build", tmp_path / "res", capsys)
    shutil.copytree(tmp_path / "a", tmp_path / "elsewhere" / "copy")
    rows, said = passkey(f"py:{tmp_path / 'elsewhere' / 'copy' / 'model.py'}:build", tmp_path / "res", capsys)
    assert "1 sample already in" in said and "skipped" in said, said
    assert rows["model_hash"].nunique() == 1 and len(rows) == len(first)


def test_arguments_are_part_of_the_identity_and_of_the_rows_name(tmp_path, capsys):
    model = write_model(tmp_path / "a", "1")
    cool, _ = passkey(f"py:{model}:build:temperature=1.0", tmp_path / "res", capsys)
    rows, said = passkey(f"py:{model}:build:temperature=7.0", tmp_path / "res", capsys)
    assert "skipped" not in said, said  # the temperature reaches the numbers: computed again
    assert rows["model_hash"].nunique() == 2
    assert set(rows["model"]) == {"model.py:build:temperature=1.0", "model.py:build:temperature=7.0"}


def test_one_module_through_the_api_and_through_py_is_one_model(tmp_path, capsys, monkeypatch):
    import bamctl

    model = write_model(tmp_path / "a", "1")
    through_py, _ = passkey(f"py:{model}:build", tmp_path / "res", capsys)
    monkeypatch.syspath_prepend(str(tmp_path / "a"))
    import importlib

    module = importlib.import_module("model")
    try:
        rows = bamctl.evaluate(module.build(), task="passkey", lengths="128", samples=1, depths=[0.5],
                               dir=tmp_path / "res", quiet=True)
    finally:
        for name in ("model", "helper"):
            sys.modules.pop(name, None)
    assert rows["model_hash"].iloc[0] == through_py["model_hash"].iloc[0]


@pytest.mark.parametrize("body, words", [
    ("import sys\nimport torch\ndef build():\n    sys.exit(0)\n", "raised SystemExit: 0"),
    ("import sys\nsys.exit(3)\n", "raised SystemExit: 3"),
])
def test_user_code_that_calls_sys_exit_is_one_line_and_exit_2(tmp_path, body, words):
    path = tmp_path / "quits.py"
    path.write_text(body)
    done = subprocess.run([sys.executable, "-m", "bamctl", "passkey", f"py:{path}:build", "--lengths", "128",
                           "--samples", "1", "--dir", str(tmp_path / "res")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize("text, parsed", [
    ("dim=64,pe=rope,scale=0.5", {"dim": 64, "pe": "rope", "scale": 0.5}),
    ("sizes=[1, 2, 3],pair=(4,5),name='a,b'", {"sizes": [1, 2, 3], "pair": (4, 5), "name": "a,b"}),
    ("path=./data/x.bin,flag=True,none=None", {"path": "./data/x.bin", "flag": True, "none": None}),
    ("mapping={'a': 1, 'b': [2, 3]}", {"mapping": {"a": 1, "b": [2, 3]}}),
])
def test_py_arguments_are_python_literals_or_bare_words(text, parsed):
    from bamctl.backends.module import parse_arguments

    assert parse_arguments(text) == parsed


@pytest.mark.parametrize("text", ["scale=0.5.2", "sizes=[1,2", "x=1e", "dim=64,dim=32", "=3"])
def test_a_mistyped_py_argument_is_one_line_and_exit_2(tmp_path, capsys, text):
    from bamctl.cli import main

    model = write_model(tmp_path / "a", "1")
    with pytest.raises(SystemExit) as exited:
        main(["passkey", f"py:{model}:build:{text}", "--lengths", "128", "--samples", "1", "--dir", str(tmp_path / "r")])
    said = capsys.readouterr().err
    assert exited.value.code == 2 and "py: argument" in said and len(said.strip().splitlines()) == 1, said


def test_the_submit_guard_sees_an_edited_helper(tmp_path):
    """A sweep's shards must import the code it was submitted with: the digest it records covers
    the helpers the builder's file imports, not only that file."""
    from bamctl.backends.module import PyReference

    model = write_model(tmp_path / "a", "1")
    reference = PyReference.parse(f"{model}:build")
    before = reference.code_digest()
    (tmp_path / "a" / "helper.py").write_text(helper_favouring("7"))
    assert reference.code_digest() != before
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    assert PyReference.parse(f"{tmp_path / 'b' / 'model.py'}:build").code_digest() == reference.code_digest()


# -- a checkpoint's own code -----------------------------------------------------------------------

MARKED_PLUGIN = "from pathlib import Path\nPath(__file__).with_name('ran').write_text('imported')\n"


def _bamctl(*args: str, trust_file: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "BAMCTL_TRUSTED_CODE": str(trust_file)}
    return subprocess.run([sys.executable, "-m", "bamctl", *args], capture_output=True, text=True, timeout=300,
                          env=env, stdin=subprocess.DEVNULL)


@pytest.fixture
def downloaded_checkpoint(tmp_path):
    """A checkpoint whose config names a PE plugin file inside its own folder, which writes a marker
    beside itself when imported; as if downloaded (this machine remembers no consent to it)."""
    from bamctl.checkpoint import new_random_model, save_checkpoint
    from bamctl.model import ModelConfig

    folder = tmp_path / "ckpt"
    folder.mkdir()
    plugin = folder / "my_pe.py"
    plugin.write_text(MARKED_PLUGIN + (EXAMPLES / "alibi.py").read_text())
    save_checkpoint(new_random_model(ModelConfig.from_preset("micro", f"{plugin}:ALiBi", train_length=128), 0), folder)
    (folder / "ran").unlink(missing_ok=True)  # written where this process first imported these bytes
    return folder


def test_a_checkpoints_code_runs_only_with_the_flag_and_the_consent_is_remembered_by_digest(downloaded_checkpoint, tmp_path):
    folder, trust = downloaded_checkpoint, tmp_path / "fresh-machine.json"
    refused = _bamctl("inspect", str(folder), trust_file=trust)
    assert refused.returncode == 2, refused.stderr
    assert "my_pe.py" in refused.stderr and "--trust-remote-code" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert not (folder / "ran").exists()  # nothing of it was imported

    refused = _bamctl("passkey", str(folder), "--lengths", "128", "--samples", "1", "--dir", str(tmp_path / "res"),
                      trust_file=trust)
    assert refused.returncode == 2 and "--trust-remote-code" in refused.stderr and not (folder / "ran").exists()

    trusted = _bamctl("inspect", str(folder), "--trust-remote-code", trust_file=trust)
    assert trusted.returncode == 0, trusted.stderr
    assert (folder / "ran").exists()
    again = _bamctl("passkey", str(folder), "--lengths", "128", "--samples", "1", "--dir", str(tmp_path / "res"),
                    trust_file=trust)
    assert again.returncode == 0, again.stderr  # remembered: the same bytes

    (folder / "ran").unlink()
    plugin = folder / "my_pe.py"
    plugin.write_text(plugin.read_text() + "\n# edited\n")
    changed = _bamctl("inspect", str(folder), "--trust-remote-code", trust_file=trust)
    assert changed.returncode == 2 and "is not the code this checkpoint was made with" in changed.stderr
    assert not (folder / "ran").exists()  # its digest is checked before any import


def test_a_checkpoint_one_saved_oneself_opens_without_the_flag(tmp_path):
    """Saving remembers the code the process ran: one's own checkpoints are no chore."""
    from bamctl.cli import main

    plugin = tmp_path / "my_pe.py"
    shutil.copy(EXAMPLES / "alibi.py", plugin)
    with pytest.raises(SystemExit) as exited:
        main(["new", "--pe", f"{plugin}:ALiBi", "--preset", "micro", "--train-length", "128", "--out", str(tmp_path / "m")])
    assert exited.value.code == 0
    opened = _bamctl("inspect", str(tmp_path / "m"), trust_file=Path(os.environ["BAMCTL_TRUSTED_CODE"]))
    assert opened.returncode == 0, opened.stderr


def test_the_api_asks_the_same_consent_by_the_same_name(downloaded_checkpoint, tmp_path):
    script = textwrap.dedent(f"""\
        import bamctl
        from bamctl.errors import BamctlError
        ask = dict(task="passkey", lengths="128", samples=1, depths=[0.5], dir={str(tmp_path / 'res')!r}, quiet=True)
        try:
            bamctl.evaluate({str(downloaded_checkpoint)!r}, **ask)
        except BamctlError as err:
            print("refused:", err)
        print(len(bamctl.evaluate({str(downloaded_checkpoint)!r}, trust_remote_code=True, **ask)))
        """)
    env = {**os.environ, "BAMCTL_TRUSTED_CODE": str(tmp_path / "fresh-machine.json")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    refused, rows = done.stdout.strip().splitlines()
    assert refused.startswith("refused:") and "trust_remote_code=True" in refused and "my_pe.py" in refused
    assert rows == "1"


PLUGIN_WITH_HELPER = textwrap.dedent("""\
    import torch
    import helper

    class Slope(torch.nn.Module):
        def __init__(self, config):
            super().__init__()
            self.heads = config.n_heads

        def distance_table(self, max_distance):
            distance = torch.arange(max_distance + 1, dtype=torch.float32)
            return -helper.SLOPE * distance[None, :].expand(self.heads, -1)
    """)


def test_plugins_with_same_named_helpers_run_their_own_and_a_helper_is_part_of_the_identity(tmp_path):
    from bamctl.checkpoint import model_identity
    from bamctl.model import ModelConfig, Transformer

    for name, slope in (("a", 1.0), ("b", 2.0)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "pe.py").write_text(PLUGIN_WITH_HELPER)
        (tmp_path / name / "helper.py").write_text(f"SLOPE = {slope}\n")
    configs = [ModelConfig.from_preset("micro", f"{tmp_path / n / 'pe.py'}:Slope", train_length=128) for n in "ab"]
    tables = [Transformer(c).layers[0].attention.prior.distance_table(3) for c in configs]
    assert tables[0][0].tolist() == [0.0, -1.0, -2.0, -3.0] and tables[1][0].tolist() == [0.0, -2.0, -4.0, -6.0]
    assert model_identity("w", configs[0]) != model_identity("w", configs[1])

    (tmp_path / "a" / "helper.py").write_text("SLOPE = 3.0\n")
    edited = ModelConfig.from_preset("micro", f"{tmp_path / 'a' / 'pe.py'}:Slope", train_length=128)
    assert model_identity("w", edited) not in {model_identity("w", c) for c in configs}
    assert Transformer(edited).layers[0].attention.prior.distance_table(1)[0].tolist() == [0.0, -3.0]
    shutil.copytree(tmp_path / "b", tmp_path / "elsewhere")  # where the files lie is not identity
    moved = ModelConfig.from_preset("micro", f"{tmp_path / 'elsewhere' / 'pe.py'}:Slope", train_length=128)
    assert model_identity("w", moved) == model_identity("w", configs[1])


def test_a_checkpoint_of_an_entry_point_pe_from_a_package_on_the_path_opens_without_the_flag(tmp_path, monkeypatch):
    """A PE named by its entry point whose package lies on the path (an editable install, a
    PYTHONPATH) is local code: the process that names it runs it, saving remembers it, and another
    process opens the checkpoint without --trust-remote-code; an edited package asks again."""
    from test_pe_plugins import entry_point_site

    from bamctl.cli import main

    site = entry_point_site(tmp_path)
    monkeypatch.syspath_prepend(str(site))
    trust = tmp_path / "trusted.json"
    monkeypatch.setenv("BAMCTL_TRUSTED_CODE", str(trust))
    with pytest.raises(SystemExit) as exited:
        main(["new", "--pe", "sandwich", "--preset", "micro", "--train-length", "128", "--out", str(tmp_path / "m")])
    assert exited.value.code == 0
    monkeypatch.setenv("PYTHONPATH", str(site))
    opened = _bamctl("inspect", str(tmp_path / "m"), trust_file=trust)
    assert opened.returncode == 0, opened.stderr
    (site / "mype" / "pe.py").write_text((site / "mype" / "pe.py").read_text() + "\n# edited\n")
    changed = _bamctl("inspect", str(tmp_path / "m"), trust_file=trust)
    assert changed.returncode == 2 and "is not the code this checkpoint was made with" in changed.stderr
