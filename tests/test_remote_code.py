"""``hf:`` with a model folder's own modeling code (config.json's ``auto_map``): refused without
--trust-remote-code, run by transformers with it, and its code part of the model's identity.
The reference is transformers itself, loading the same folder with ``trust_remote_code=True``."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

pytest.importorskip("transformers", reason="transformers not installed (pip install 'bamctl[hf]')")

from bamctl.backends import RunOptions, open_backend  # noqa: E402
from bamctl.errors import BamctlError  # noqa: E402
from tiny_llama import save_tiny_llama  # noqa: E402

CONFIGURATION = """
    from transformers import LlamaConfig


    class HalvedConfig(LlamaConfig):
        model_type = "halved-llama"
"""
MODELING = """
    from transformers import LlamaForCausalLM

    from .configuration_halved import HalvedConfig


    class HalvedForCausalLM(LlamaForCausalLM):
        \"\"\"A Llama whose logits are scaled: its own computation, which only its code knows.\"\"\"

        config_class = HalvedConfig

        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 0.5
            return out
"""


def remote_code_folder(folder):
    save_tiny_llama(folder, max_positions=256, vocab="bpe")
    (folder / "configuration_halved.py").write_text(textwrap.dedent(CONFIGURATION))
    (folder / "modeling_halved.py").write_text(textwrap.dedent(MODELING))
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="halved-llama", architectures=["HalvedForCausalLM"], auto_map={
        "AutoConfig": "configuration_halved.HalvedConfig", "AutoModelForCausalLM": "modeling_halved.HalvedForCausalLM"})
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_folder_with_its_own_code_is_refused_without_the_flag_in_one_line(tmp_path, capsys):
    from bamctl.cli import main

    folder = remote_code_folder(tmp_path / "m")
    capsys.readouterr()  # saving the folder's progress bar is not bamctl's
    with pytest.raises(SystemExit) as exited:
        main(["passkey", f"hf:{folder}", "--lengths", "48", "--samples", "1", "--dir", str(tmp_path / "res")])
    said = capsys.readouterr().err
    assert exited.value.code == 2
    assert "--trust-remote-code" in said and "modeling_halved.py" in said and len(said.strip().splitlines()) == 1
    with pytest.raises(BamctlError, match="--trust-remote-code"):
        open_backend(f"hf:{folder}", RunOptions(device="cpu"))


def test_with_the_flag_the_folders_code_runs_as_transformers_runs_it(tmp_path):
    from transformers import AutoModelForCausalLM

    folder = remote_code_folder(tmp_path / "m")
    backend = open_backend(f"hf:{folder}", RunOptions(device="cpu", trust_remote_code=True))
    theirs = AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=True, local_files_only=True).eval()
    assert type(theirs).__name__ == "HalvedForCausalLM"
    prompt, target = [1, 40, 41, 42, 43, 44], [45, 46]
    with torch.no_grad():
        logprobs = torch.log_softmax(theirs(torch.tensor([prompt + target[:-1]])).logits[0, len(prompt) - 1:].float(), -1)
    wanted = logprobs.gather(1, torch.tensor(target)[:, None])[:, 0].tolist()
    got = backend.score_continuation(prompt[1:], target)  # the back-end puts the BOS (id 1) in front itself
    assert max(abs(a - b) for a, b in zip(got.logprobs, wanted)) < 1e-5
    plain = open_backend(f"hf:{save_tiny_llama(tmp_path / 'plain', max_positions=256, vocab='bpe')}", RunOptions(device="cpu"))
    assert plain.score_continuation(prompt[1:], target).logprobs != got.logprobs  # the halving ran


def test_the_folders_code_is_part_of_the_models_identity(tmp_path):
    folder = remote_code_folder(tmp_path / "m")
    options = RunOptions(device="cpu", trust_remote_code=True)
    before = open_backend(f"hf:{folder}", options).info.model_hash
    modeling = folder / "modeling_halved.py"
    modeling.write_text(modeling.read_text().replace("* 0.5", "* 0.25"))
    assert open_backend(f"hf:{folder}", options).info.model_hash != before


def test_the_api_takes_trust_remote_code(tmp_path):
    import bamctl

    folder = remote_code_folder(tmp_path / "m")
    rows = bamctl.evaluate(f"hf:{folder}", task="passkey", lengths="128", samples=1, depths=[0.5], device="cpu",
                           trust_remote_code=True, dir=tmp_path / "res", quiet=True)
    assert len(rows) == 1 and rows["backend"].tolist() == ["hf"]


def test_lm_evals_model_args_take_trust_remote_code(tmp_path):
    pytest.importorskip("lm_eval", reason="lm-eval is the dev extra's")
    from bamctl.harness import BamctlLM

    folder = remote_code_folder(tmp_path / "m")
    with pytest.raises(BamctlError, match="pass trust_remote_code to run it"):  # in model_args' words
        BamctlLM.create_from_arg_string(f"model=hf:{folder},device=cpu")
    lm = BamctlLM.create_from_arg_string(f"model=hf:{folder},device=cpu,trust_remote_code=True")
    assert lm.served.info.model_hash == open_backend(f"hf:{folder}", RunOptions(device="cpu", trust_remote_code=True)).info.model_hash
    with pytest.raises(BamctlError, match="trust_remote_code takes True or False"):
        BamctlLM.create_from_arg_string(f"model=hf:{folder},device=cpu,trust_remote_code=yes")


def test_inspect_reads_a_folder_with_its_own_code_with_the_flag_and_refuses_it_without(tmp_path, capsys):
    from bamctl.cli import main

    folder = remote_code_folder(tmp_path / "m")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(["inspect", f"hf:{folder}", "--json"])
    assert exited.value.code == 2 and "--trust-remote-code" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["inspect", f"hf:{folder}", "--json", "--trust-remote-code"])
    out, err = capsys.readouterr()
    assert exited.value.code == 0, err
    said = json.loads(out)
    assert said["model_type"] == "halved-llama" and said["parameters"] > 0
