"""A model that runs a bounded number of positions (nanoGPT's learned table of block_size rows), asked
for a length past them, or one its answer's tokens take past them: one line that says what was fed,
what the model runs, and the longest ``--lengths`` that fits; that length then runs, and one more
does not."""

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


def _run(tmp_path, capsys, task: str, reference: str, length: int):
    capsys.readouterr()
    extra = ["--depths", "0.5"] if task == "passkey" else []
    with pytest.raises(SystemExit) as exited:
        main([task, reference, "--lengths", str(length), "--samples", "1", *extra, "--dir", str(tmp_path / task), "--quiet"])
    return exited.value.code, capsys.readouterr().err


@pytest.mark.parametrize("task, asked, why", [
    ("passkey", BLOCK, "of the answer after it"),  # the prompt fits; the answer's tokens fed after it do not
    ("ppl", 2 * BLOCK, f"feeds {2 * BLOCK};"),  # a window longer than the model's positions
])
def test_a_length_past_the_models_positions_names_the_longest_that_fits(tmp_path, capsys, task, asked, why):
    path = tmp_path / "my_model.py"
    path.write_text(textwrap.dedent(BUILDER))
    reference = f"py:{path}:build:block_size={BLOCK}"
    code, err = _run(tmp_path, capsys, task, reference, asked)
    said = err.strip().splitlines()
    assert code == 2 and len(said) == 1, err
    assert f"runs at most {BLOCK} tokens" in said[0] and f"--lengths {asked} feeds" in said[0] and why in said[0], err
    fits = int(re.search(r"the longest --lengths that fits is (\d+)", said[0]).group(1))
    assert fits <= BLOCK
    code, err = _run(tmp_path, capsys, task, reference, fits)
    assert code == 0, err  # the length it names runs
    code, err = _run(tmp_path, capsys, task, reference, fits + 1)
    assert code == 2 and f"the longest --lengths that fits is {fits}" in err, err  # and is the longest
