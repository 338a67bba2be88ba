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


@pytest.mark.parametrize("prefix,prompt,targets,limit,dropped", [
    (1, 9, 1, 10, 0),     # a one-token answer is only predicted: BOS + prompt is all that is fed, and it fits
    (1, 9, 2, 10, 1),     # the first of two answer tokens is fed: one prompt token makes room for it
    (1, 9, 5, 100, 0),    # well within the limit: nothing left out
    (1, 9, 5, None, 0),   # no limit
    (1, 12, 3, 10, 0),    # the prompt alone is past the limit: nothing left out, --beyond-max decides
    (0, 10, 3, 10, 2),    # no BOS: the two answer tokens fed take the prompt's first two
])
def test_teacher_forcing_leaves_out_the_prompts_first_tokens_only_when_the_fed_answer_takes_it_past_the_limit(
        prefix, prompt, targets, limit, dropped):
    """LengthPolicy.continuation_fitting's rule, restated from its docstring: what is fed is the prefix,
    the prompt and every answer token but the last; past the limit, and only when the prompt itself fits,
    that many of the prompt's first tokens are left out."""
    from bamctl.backends.base import Fitting
    from bamctl.backends.hf_common import LengthPolicy

    policy = LengthPolicy("m", limit, "warn")  # past the limit: warn and run
    assert policy.continuation_fitting(prefix, prompt, targets) == Fitting(bos=prefix > 0, dropped=dropped)
    bos = list(range(100, 100 + prefix))
    assert policy.fit(bos, list(range(prompt)), [7] * targets) == bos + list(range(dropped, prompt)) + [7] * (targets - 1)


@pytest.mark.parametrize("bos,leading,wanted", [("auto", [1], [1, 5, 6]), ("auto", [], [5, 6]), ("always", [], [9, 5, 6]),
                                                ("never", [1], [5, 6])])
def test_a_prompt_is_fed_after_the_bos_the_option_asks_for(bos, leading, wanted):
    from types import SimpleNamespace

    from bamctl.backends.hf_common import RequestShaper

    tokenizer = SimpleNamespace(name="t", has_chat_template=False, bos_id=9, leading_special_ids=leading)
    shaper = RequestShaper(tokenizer, chat_template=False, bos=bos)
    assert shaper.prompt((5, 6)) == wanted and shaper.bos_for("teacher_forced") == (wanted[0] in (1, 9))
