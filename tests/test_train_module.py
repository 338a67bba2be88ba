"""``bamctl train --model py:...``: a user's own module trained by a reference's recipe, saved with its
code, resumed after Ctrl-C, and compared beside the reference in one table.

The modules are written here as users write them: a nanoGPT-style file importing its blocks from a
helper beside it, and x-transformers' ``TransformerWrapper`` from the package index."""

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch

from bamctl.cli import main
from bamctl.errors import BamctlError
from bamctl.train import STATE_FILE, param_groups, prepare, recipe_from_dict, train
from test_train_recipe import BASE

REPO = Path(__file__).resolve().parents[1]

NANOGPT = '''
"""nanoGPT's shape: learned positions, pre-norm blocks from a helper file, a head tied to the embeddings."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from layers import Block


class GPT(nn.Module):
    def __init__(self, vocab_size=50304, block_size=256, n_layer=1, n_head=2, n_embd=16):
        super().__init__()
        self.block_size = block_size
        self.wte, self.wpe = nn.Embedding(vocab_size, n_embd), nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight

    def forward(self, idx, targets=None):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


def build(n_layer=1, block_size=256):
    return GPT(n_layer=n_layer, block_size=block_size)
'''

LAYERS = '''
import torch.nn as nn
import torch.nn.functional as F

FUTURE = False  # a test sets it to let attention see every token


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.c_attn, self.c_proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=not FUTURE).transpose(1, 2).reshape(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp(self.ln_2(x))
'''

X_TRANSFORMERS = '''
from x_transformers import Decoder, TransformerWrapper


def build(pe="alibi"):
    positions = {"alibi": dict(alibi_pos_bias=True, alibi_num_heads=2), "rope": dict(rotary_pos_emb=True)}[pe]
    return TransformerWrapper(num_tokens=50257, max_seq_len=4096, use_abs_pos_emb=False,
                              attn_layers=Decoder(dim=16, depth=1, heads=2, **positions))
'''


def write_nanogpt(folder: Path, *, future: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "layers.py").write_text(LAYERS.replace("FUTURE = False", f"FUTURE = {future}"))
    path = folder / "nanogpt.py"
    path.write_text(textwrap.dedent(NANOGPT))
    return path


def cli(*args):
    """``bamctl ARGS`` as the console script runs it (one line and exit 2 for a known error)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    return exit_info.value.code, out.getvalue()


def small_recipe(**train_section):
    """The unit tests' recipe: text and passkey rows of 96 tokens, a 256-id subset."""
    recipe = recipe_from_dict(BASE)
    return replace(recipe, train=replace(recipe.train, **train_section)) if train_section else recipe


def test_a_module_is_fed_the_recipes_rows_as_tokenizer_ids_and_scored_on_the_same_tokens(tmp_path):
    """The module sees GPT-2 ids where the recipe's own model sees its subset's, and the loss scores
    the same positions of the same rows: every model of a recipe is trained on one budget."""
    path = write_nanogpt(tmp_path)
    own, module = prepare(small_recipe()), prepare(small_recipe(), module=f"{path}:build")
    subset = own.batches.subset
    for step in range(3):
        ids, targets = own.batches.batch(step)
        tokens, token_targets = module.batches.batch(step)
        assert torch.equal(subset.to_model(tokens), ids)  # the same rows
        assert torch.equal(token_targets == -100, targets == -100)  # the same positions scored
        scored = targets != -100
        assert torch.equal(subset.to_tokenizer(targets[scored]), token_targets[scored])
        assert int(tokens.max()) >= subset.size  # ids the subset has no row for reach the module as they are


def test_the_initial_module_is_the_recipes_seed(tmp_path):
    path = write_nanogpt(tmp_path)
    a = prepare(small_recipe(), module=f"{path}:build").model.state_dict()
    b = prepare(small_recipe(), module=f"{path}:build").model.state_dict()
    c = prepare(small_recipe(seed=1), module=f"{path}:build").model.state_dict()
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert not torch.equal(a["h.0.c_attn.weight"], c["h.0.c_attn.weight"])


def test_a_modules_positional_parameters_get_the_recipes_positional_group(tmp_path):
    path = tmp_path / "learnt.py"
    path.write_text(textwrap.dedent('''
        import torch
        import torch.nn as nn

        class Learnt(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(50257, 8)
                self.slope = nn.Parameter(torch.ones(2))
                self.head = nn.Linear(8, 50257)

            def positional_parameters(self):
                return [self.slope]

            def forward(self, ids):
                return self.head(self.emb(ids))

        def build():
            return Learnt()
    '''))
    recipe = small_recipe()
    recipe = replace(recipe, optim=replace(recipe.optim, positional_lr_scale=10.0, embedding_lr_scale=0.5))
    setup = prepare(recipe, module=f"{path}:build")
    groups = {g["name"]: g for g in param_groups(setup.trainee, recipe)}
    assert [p is setup.model.slope for p in groups["positional"]["params"]] == [True]
    assert groups["positional"]["lr_scale"] == 10.0 and groups["positional"]["weight_decay"] == 0.0
    assert [p is setup.model.emb.weight for p in groups["embedding"]["params"]] == [True]
    assert {id(p) for p in groups["decay"]["params"]} == {id(setup.model.head.weight)}


def test_an_interrupted_module_run_resumes_to_the_same_losses_and_weights(tmp_path):
    path = write_nanogpt(tmp_path / "code")
    recipe, module = small_recipe(steps=5, save_every=2), f"{path}:build"
    straight = train(recipe, tmp_path / "straight", device="cpu", module=module)

    class Stop(Exception):
        pass

    def stop_at_3(report):
        if report.step == 3:
            raise Stop

    with pytest.raises(Stop):
        train(recipe, tmp_path / "resumed", device="cpu", module=module, on_step=stop_at_3)
    assert (tmp_path / "resumed" / STATE_FILE).exists()
    resumed = train(recipe, tmp_path / "resumed", device="cpu", module=module)
    assert resumed.resumed_from == 3 and resumed.losses == straight.losses
    from safetensors.torch import load_file

    a, b = load_file(tmp_path / "straight" / "model.safetensors"), load_file(tmp_path / "resumed" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_state_saved_by_other_code_is_not_resumed(tmp_path):
    path = write_nanogpt(tmp_path / "code")
    recipe = small_recipe(steps=4, save_every=1)

    def stop(report):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(recipe, tmp_path / "m", device="cpu", module=f"{path}:build", on_step=stop)
    (path.parent / "layers.py").write_text(LAYERS.replace("nn.GELU()", "nn.ReLU()"))  # an edited helper
    with pytest.raises(BamctlError, match="another recipe or model"):
        train(recipe, tmp_path / "m", device="cpu", module=f"{path}:build")
    with pytest.raises(BamctlError, match="another recipe or model"):  # other arguments, another model
        train(recipe, tmp_path / "m", device="cpu", module=f"{path}:build:n_layer=2")


def test_a_file_edited_during_training_does_not_reach_the_checkpoint(tmp_path):
    """The folder keeps the bytes the module was built from: a helper edited mid-run is not the code
    that trained, so neither the saved code nor the identity a resume checks may follow it."""
    path = write_nanogpt(tmp_path / "code")
    layers, original = path.parent / "layers.py", (path.parent / "layers.py").read_bytes()

    def edit_at_1(report):
        if report.step == 1:
            layers.write_text(LAYERS.replace("nn.GELU()", "nn.ReLU()"))

    train(small_recipe(steps=2, save_every=1), tmp_path / "m", device="cpu", module=f"{path}:build", on_step=edit_at_1)
    assert (tmp_path / "m" / "code" / "layers.py").read_bytes() == original


def test_ctrl_c_keeps_the_run_and_the_rerun_ends_on_the_uninterrupted_loss_curve(tmp_path):
    """A real SIGINT to ``bamctl train`` in its own process, as a user's Ctrl-C."""
    path = write_nanogpt(tmp_path / "code")
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(textwrap.dedent('''
        name = "sigint"
        [model]
        preset = "micro"
        pe = "nope"
        train_length = 96
        [data]
        text = "train"
        passkey_fraction = 0.5
        vocab_size = 256
        [optim]
        lr = 1e-3
        betas = [0.9, 0.95]
        weight_decay = 0.1
        grad_clip = 1.0
        [schedule]
        warmup_steps = 2
        min_lr_ratio = 0.1
        [train]
        steps = 60
        batch_size = 2
        seed = 0
        save_every = 1000
    '''))
    env = {**os.environ, "BAMCTL_TRUSTED_CODE": str(tmp_path / "trust.json"), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "bamctl", "train", "--recipe", str(recipe), "--model", f"py:{path}:build"]
    run = subprocess.Popen([*command, "--out", str(tmp_path / "cut")], stderr=subprocess.PIPE, text=True, env=env)
    for line in run.stderr:  # a line at every tenth of the run: the run is under way
        if line.startswith("train step"):
            run.send_signal(signal.SIGINT)
            break
    run.communicate(timeout=120)
    assert run.returncode != 0
    state = torch.load(tmp_path / "cut" / STATE_FILE, weights_only=True)
    assert 0 < state["step"] < 60
    resumed = subprocess.run([*command, "--out", str(tmp_path / "cut")], capture_output=True, text=True, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr
    straight = subprocess.run([*command, "--out", str(tmp_path / "straight")], capture_output=True, text=True, env=env,
                              timeout=300)
    assert straight.returncode == 0, straight.stderr
    cut, whole = (json.loads((tmp_path / name / "config.json").read_text())["provenance"] for name in ("cut", "straight"))
    assert cut["resumed_at_steps"] == [state["step"]]
    assert cut["loss_curve"] == whole["loss_curve"] and cut["final_loss"] == whole["final_loss"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A nanoGPT file and an x-transformers model, each trained by the shipped bam-ssmax recipe
    (its data, loss, optimiser and schedule; 3 steps instead of 3,000)."""
    pytest.importorskip("x_transformers", reason="x-transformers is the dev extra's user model")
    root = tmp_path_factory.mktemp("trained")
    nanogpt = write_nanogpt(root / "src")
    (root / "src" / "xt.py").write_text(textwrap.dedent(X_TRANSFORMERS))
    folders = {}
    with pytest.MonkeyPatch.context() as patch:  # the consents training remembers, kept for the tests below
        patch.setenv("BAMCTL_TRUSTED_CODE", str(root / "trusted-code.json"))
        for name, reference in (("nano", f"py:{nanogpt}:build"), ("xt", f"py:{root / 'src' / 'xt.py'}:build")):
            code, output = cli("train", "--recipe", "bam-ssmax", "--model", reference, "--steps", "3", "--out", root / name)
            assert code == 0, output
            folders[name] = root / name
    return root, folders, output


@pytest.fixture
def as_trainer(trained, monkeypatch):
    """The user who trained the modules: their code opens without asking."""
    monkeypatch.setenv("BAMCTL_TRUSTED_CODE", str(trained[0] / "trusted-code.json"))
    return trained


def test_a_trained_module_leaves_a_folder_with_its_weights_code_and_recipe(trained):
    root, folders, output = trained
    assert f"wrote py:xt.py:build (recipe bam-ssmax, 3 steps" in " ".join(output.split())
    config = json.loads((folders["nano"] / "config.json").read_text())
    module = config["module"]
    assert module["builder"] == "code/nanogpt.py" and module["function"] == "build"
    assert module["train_length"] == 128 and module["tokenizer"] == "gpt2"  # the recipe's
    assert sorted(p.name for p in (folders["nano"] / "code").iterdir()) == ["layers.py", "nanogpt.py"]
    assert (folders["nano"] / "code" / "layers.py").read_text() == (root / "src" / "layers.py").read_text()
    assert config["recipe"]["name"] == "bam-ssmax" and config["recipe"]["train"]["steps"] == 3
    assert config["provenance"]["model"] == "py:nanogpt.py:build" and config["provenance"]["finished"]
    xt = json.loads((folders["xt"] / "config.json").read_text())["module"]
    assert sorted(p.name for p in (folders["xt"] / "code").iterdir()) == ["xt.py"]  # x-transformers stays installed


def test_trained_modules_are_compared_beside_bam_ssmax_in_one_table(as_trainer, tmp_path):
    _, folders, _ = as_trainer
    code, output = cli("compare", "bam-ssmax", folders["nano"], folders["xt"], "--task", "passkey", "--lengths", "128",
                       "--samples", "1", "--depths", "0.5", "--dir", tmp_path / "res", "--plot", tmp_path / "p.png")
    assert code == 0, output
    text = " ".join(output.split())
    assert "summarised apart" not in text and "other prompts" not in text
    assert text.count("passkey / exact") == 1  # one table
    assert "bam-ssmax (baseline)" in text and " nano " in text and " xt " in text
    assert "same keys" in text  # the paired test
    rows = pd.read_parquet(tmp_path / "res")
    assert set(rows["model"]) == {"bam-ssmax", "nano", "xt"}
    by_model = rows.groupby("model")["draw"].apply(sorted)
    assert by_model["bam-ssmax"] == by_model["nano"] == by_model["xt"]
    assert set(rows.loc[rows["model"] != "bam-ssmax", "train_length"]) == {128}
    assert set(rows.loc[rows["model"] != "bam-ssmax", "backend"]) == {"module"}


def _model_hash(folder, tmp_path, name):
    code, output = cli("passkey", folder, "--lengths", "128", "--samples", "1", "--depths", "0.5", "--dir", tmp_path / name)
    assert code == 0, output
    return set(pd.read_parquet(tmp_path / name)["model_hash"])


def test_a_trained_module_is_the_py_model_of_its_file_with_its_weights(as_trainer, tmp_path):
    """Its identity is a py: model's: the module its code builds, with these weights, wherever the
    folder lies."""
    from safetensors.torch import load_file

    from bamctl.backends.module import build_fresh, load_trained, module_identity
    
    root, folders, _ = as_trainer
    here = _model_hash(folders["nano"], tmp_path, "a")
    moved = shutil.copytree(folders["nano"], tmp_path / "elsewhere" / "nano")
    assert _model_hash(moved, tmp_path, "b") == here
    # built from the file it was trained from, the trained weights loaded by hand: the same identity
    original = build_fresh(f"{root / 'src' / 'nanogpt.py'}:build")
    original.module.load_state_dict(load_file(folders["nano"] / "model.safetensors"))
    assert {module_identity(original)} == here
    assert {module_identity(load_trained(folders["nano"]))} == here
    code, output = cli("inspect", folders["nano"], "--json")  # what inspect says the rows carry, they carry
    assert code == 0, output
    shown = json.loads(output)
    assert {shown["model hash"]} == here and shown["module"] == "GPT" and shown["training length"] == 128
    assert shown["files"] == ["layers.py", "nanogpt.py"]
    code, output = cli("ppl", folders["nano"], "--lengths", "128", "--samples", "1", "--dir", tmp_path / "ppl")
    assert code == 0 and "nano was trained on synthetic passkey prompts only" in output, output  # the recipe's kind


def test_a_trained_modules_code_runs_only_with_consent(trained, tmp_path, monkeypatch):
    """Another user (no remembered consent) opens the folder only with --trust-remote-code; nothing
    of its code runs before."""
    _, folders, _ = trained
    folder = shutil.copytree(folders["nano"], tmp_path / "nano")
    marker = tmp_path / "ran"
    layers = folder / "code" / "layers.py"
    monkeypatch.setenv("BAMCTL_TRUSTED_CODE", str(tmp_path / "someone-else.json"))
    code, output = cli("compare", "bam-ssmax", folder, "--task", "passkey", "--lengths", "128", "--samples", "1",
                       "--dir", tmp_path / "res")
    assert code == 2 and "--trust-remote-code" in output and "Traceback" not in output, output
    assert "bam-ssmax" not in output  # refused before any work
    # an edited copy of the code is not the model that trained: refused before it runs
    layers.write_text(f"open({str(marker)!r}, 'w').close()\n" + layers.read_text())
    code, output = cli("passkey", folder, "--lengths", "128", "--samples", "1", "--dir", tmp_path / "res",
                       "--trust-remote-code")
    assert code == 2 and "not the code the model was trained with" in output and not marker.exists()
    shutil.copyfile(folders["nano"] / "code" / "layers.py", layers)
    code, output = cli("passkey", folder, "--lengths", "128", "--samples", "1", "--dir", tmp_path / "res",
                       "--trust-remote-code")
    assert code == 0, output


def test_a_folder_naming_an_installed_function_calls_it_only_with_consent(trained, tmp_path, monkeypatch):
    """An installed module's function has no bytes in the folder to check or remember: a folder that
    names one (here os.makedirs, with arguments the folder chose) runs it only when the user asks,
    whoever trained it."""
    _, folders, _ = trained
    folder = shutil.copytree(folders["nano"], tmp_path / "nano")
    marker = tmp_path / "made-by-the-folder"
    config = json.loads((folder / "config.json").read_text())
    config["module"].update(builder="os", function="makedirs", code_digest=None, arguments={"name": str(marker)})
    (folder / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("BAMCTL_TRUSTED_CODE", str(trained[0] / "trusted-code.json"))  # the trainer's consents
    for args in (["passkey", folder, "--lengths", "128", "--samples", "1", "--dir", tmp_path / "res"], ["inspect", folder]):
        code, output = cli(*args)
        assert code == 2 and "os:makedirs" in output and "--trust-remote-code" in output, output
        assert not marker.exists()


@pytest.mark.parametrize("edit, words", [
    (lambda folder: write_nanogpt(folder, future=True), "is not causal"),
    (lambda folder: write_nanogpt(folder).write_text(NANOGPT.replace("block_size=256)", "block_size=64)")),
     "holds 64 positions, but the recipe's batches are 132 tokens long"),
])
def test_a_module_the_evaluation_could_not_use_never_trains(tmp_path, edit, words):
    edit(tmp_path / "src")
    code, output = cli("train", "--recipe", "bam-ssmax", "--model", f"py:{tmp_path / 'src' / 'nanogpt.py'}:build",
                       "--steps", "2", "--out", tmp_path / "m")
    assert code == 2 and words in " ".join(output.split()), output
    assert not (tmp_path / "m" / "config.json").exists()


def test_a_module_with_another_tokenizer_or_a_reference_that_is_not_py_is_one_line(tmp_path):
    path = write_nanogpt(tmp_path)
    path.write_text(NANOGPT + textwrap.dedent('''

        def bytes_level():
            import tiktoken

            encoding = tiktoken.Encoding(name="bytes", pat_str=r"\\S+|\\s+", special_tokens={},
                                         mergeable_ranks={bytes([i]): i for i in range(256)})
            return build(), encoding
    '''))
    code, output = cli("train", "--recipe", "bam-ssmax", "--model", f"py:{path}:bytes_level", "--steps", "2",
                       "--out", tmp_path / "m")
    assert code == 2 and "comes with the tokenizer bytes, but recipes build their batches with GPT-2's tokens" in output, output
    code, output = cli("train", "--recipe", "bam-ssmax", "--model", "bam-ssmax", "--steps", "2", "--out", tmp_path / "m")
    assert code == 2 and "--model takes a py: reference" in output
