"""``bamctl inspect py:FILE.py:FUNCTION``: a module of the user's own, described as a run opens it, with
the identity and training length its rows carry."""

from __future__ import annotations

import json
import textwrap

import pandas as pd
import pytest

from bamctl.cli import main

BUILDER = """
    from own_models import gpt2_encoding, nanogpt

    def build(block_size=256):
        return nanogpt(0, n_layer=1, block_size=block_size), gpt2_encoding()
"""


def test_inspect_describes_a_py_model_with_the_identity_its_rows_carry(tmp_path, capsys):
    path = tmp_path / "my_model.py"
    path.write_text(textwrap.dedent(BUILDER))
    reference = f"py:{path}:build:block_size=192"
    with pytest.raises(SystemExit) as exited:
        main(["inspect", reference, "--json"])
    out, err = capsys.readouterr()
    assert exited.value.code == 0, err
    said = json.loads(out)
    with pytest.raises(SystemExit) as exited:
        main(["passkey", reference, "--lengths", "128", "--samples", "1", "--depths", "0.5", "--dir", str(tmp_path / "res"),
              "--quiet"])
    assert exited.value.code == 0, capsys.readouterr().err
    rows = pd.read_parquet(tmp_path / "res")
    assert said["model hash"] == rows["model_hash"].iloc[0] and said["training length"] == rows["train_length"].iloc[0] == 192
    assert said["module"] == "GPT" and said["layers"] == 1 and said["parameters"] > 0 and said["tokenizer"] == "gpt2"
    with pytest.raises(SystemExit) as exited:
        main(["inspect", reference])
    assert exited.value.code == 0 and said["model hash"] in capsys.readouterr().out  # the table says the same


def test_inspect_refuses_to_draw_a_py_model_in_one_line(tmp_path, capsys):
    path = tmp_path / "my_model.py"
    path.write_text(textwrap.dedent(BUILDER))
    with pytest.raises(SystemExit) as exited:
        main(["inspect", f"py:{path}:build", "--plot", str(tmp_path / "priors.png")])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "--plot draws bamctl's own models" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "priors.png").exists()
