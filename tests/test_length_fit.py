"""A model that runs a bounded number of positions (nanoGPT's learned table of block_size rows), asked
for a length its answer's tokens take past them: one line that says what was fed, what the model runs,
and the longest ``--lengths`` that fits; that length then runs, and one more does not."""

from __future__ import annotations

import re
import textwrap

import pytest

from bamctl.cli import main

BUILDER = """
    from own_models import gpt2_encoding, nanogpt

    def build(block_size=256):
        return nanogpt(0, n_layer=1, block_size=block_size), gpt2_encoding()
"""
BLOCK = 128  # the model's positions: the nanoGPT table's rows, and its training length


def _passkey(tmp_path, capsys, reference: str, length: int):
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(["passkey", reference, "--lengths", str(length), "--samples", "1", "--depths", "0.5",
              "--dir", str(tmp_path / "res"), "--quiet"])
    return exited.value.code, capsys.readouterr().err


def test_a_length_the_answer_takes_past_the_models_positions_names_the_longest_that_fits(tmp_path, capsys):
    path = tmp_path / "my_model.py"
    path.write_text(textwrap.dedent(BUILDER))
    reference = f"py:{path}:build:block_size={BLOCK}"
    code, err = _passkey(tmp_path, capsys, reference, BLOCK)
    said = err.strip().splitlines()
    assert code == 2 and len(said) == 1, err
    assert f"runs at most {BLOCK} tokens" in said[0] and f"--lengths {BLOCK} feeds" in said[0], err
    assert "of the answer after it" in said[0], err  # why: the answer's tokens are fed after the prompt
    fits = int(re.search(r"the longest --lengths that fits is (\d+)", said[0]).group(1))
    assert fits < BLOCK
    code, err = _passkey(tmp_path, capsys, reference, fits)
    assert code == 0, err  # the length it names runs
    code, err = _passkey(tmp_path, capsys, reference, fits + 1)
    assert code == 2 and f"the longest --lengths that fits is {fits}" in err, err  # and is the longest
