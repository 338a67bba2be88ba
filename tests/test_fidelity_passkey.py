"""Passkey ``--protocol authors`` is the BAM authors' evaluator, token for token.

The expected prompts are derived here from the authors' documented algorithm
(``PromptGenerator`` / ``PasskeyEvaluator``), with Mistral-7B-v0.3's vocabulary encoded by
``sentencepiece`` itself on the ``.model`` file the ``mistral-common`` package ships: the
ids their tokenizer gave (no BOS per piece, SentencePiece's dummy prefix). Neither
bamctl's generator nor its tokenizer loader is called to make the expectation.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from mistral_vocab import INFO, QUESTION, SOURCES, TASK, UNIT, reference_processor, source_path

from bamctl.backends.hf_tokenizer import load_hf_tokenizer
from bamctl.errors import BamctlError
from bamctl.tasks import generate_samples
from bamctl.tasks.passkey import linspace_point


@pytest.fixture(scope="module")
def reference():
    """The authors' tokenizer: SentencePiece on Mistral v0.3's model file."""
    sp = reference_processor()
    assert sp.get_piece_size() == 32768
    return sp


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """What a user passes as --tokenizer: Mistral's repository layout, a folder with only tokenizer.model, the .model file."""
    root = tmp_path_factory.mktemp("mistral-v3")
    return {kind: source_path(kind, root) for kind in SOURCES}


def authors_prompt(sp, length: int, n_prefix_of, key: str):
    """PromptGenerator: each piece tokenised alone, n whole units, the info line in one call."""
    enc = sp.encode
    task, unit, question = enc(TASK), enc(UNIT), enc(QUESTION)
    info_len = len(enc(INFO.format(pass_key=10**5 - 1)))
    n = max(0, (length - len(task) - info_len - len(question)) // len(unit))
    n_prefix = n_prefix_of(n)
    prompt = task + unit * n_prefix + enc(INFO.format(pass_key=key)) + unit * (n - n_prefix) + question
    answer = enc(" " + key)
    return prompt, answer, answer[1:]  # PasskeyEvaluator: the argmax must equal ans[1:]


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("length", [100, 256, 1000, 4096])
def test_authors_prompts_are_the_reference_token_for_token(reference, paths, source, length):
    ours = load_hf_tokenizer(paths[source])
    k = 5
    samples = list(generate_samples("passkey", [length], 3, 7, ours, [i / (k - 1) for i in range(k)], protocol="authors"))
    assert len(samples) == k * 3
    for sample in samples:
        i = round(sample.depth * (k - 1))
        depth_of = lambda n: int(torch.linspace(0, n, k).long()[i])  # noqa: E731 - their equidistant depths
        prompt, answer, target = authors_prompt(reference, length, depth_of, sample.answers[0])
        assert sample.input_ids == prompt
        assert sample.answer_ids == answer and sample.target_ids == target
        assert sample.n_tokens == len(prompt) <= length  # the achieved length, recorded
        assert 10000 <= int(sample.answers[0]) <= 99999
    assert any(len(set(s.answers[0])) < 5 for s in samples)  # keys with repeated digits are covered


def test_mistral_scores_five_digit_tokens_after_a_space_token(reference):
    answer = reference.encode(" 11223")
    assert [reference.id_to_piece(t) for t in answer] == ["▁▁", *"11223"]  # the dummy prefix doubles the space


def test_the_depths_are_torchs_float32_linspace():
    for n in range(0, 400):
        for k in range(1, 12):
            expected = torch.linspace(0, n, k).long().tolist()
            assert [linspace_point(n, i, k) for i in range(k)] == expected, (n, k)


def test_gpt2_cannot_run_the_authors_scoring_and_auto_takes_exact():
    from bamctl.tokenizer import get_tokenizer

    gpt2 = get_tokenizer("gpt2")
    with pytest.raises(BamctlError, match="use --protocol exact"):
        next(generate_samples("passkey", [256], 1, 0, gpt2, protocol="authors"))
    assert next(generate_samples("passkey", [256], 1, 0, gpt2)).protocol == "exact"


@pytest.mark.parametrize("source", SOURCES)
def test_auto_takes_authors_with_mistral(paths, source):
    assert next(generate_samples("passkey", [256], 1, 0, load_hf_tokenizer(paths[source]))).protocol == "authors"


def test_teacher_forcing_scores_the_answer_tokens_but_the_first(paths):
    """Fed prompt + answer; the argmax read where each of ans[1:] is predicted."""
    from bamctl.backends.base import EngineOptions
    from bamctl.backends.native import EngineBackend
    from bamctl.checkpoint import new_random_model
    from bamctl.answers import answer_teacher_forced
    from bamctl.model import ModelConfig

    tokenizer = load_hf_tokenizer(paths["model-folder"])
    model = new_random_model(ModelConfig.from_preset("micro", "bam", vocab_size=32768, tokenizer="mistral"), 0)
    backend = EngineBackend(SimpleNamespace(model=model, model_hash="0" * 16), tokenizer, "m", EngineOptions(device="cpu"))
    sample = next(generate_samples("passkey", [300], 1, 0, tokenizer, [0.5], protocol="authors"))
    (row,) = answer_teacher_forced(backend, sample)
    logits = model(torch.tensor([sample.input_ids + sample.answer_ids]))[0]
    argmax = logits.argmax(-1).tolist()
    scored = argmax[len(sample.input_ids) : len(sample.input_ids) + 5]  # positions predicting ans[1:]
    assert row["predicted"] == tokenizer.decode(scored).strip()
    assert row["correct"] == (scored == sample.target_ids)


@pytest.mark.parametrize("source", SOURCES)
def test_generate_writes_the_authors_prompt_answer_and_targets(reference, paths, source, tmp_path):
    """`generate --protocol authors --tokenizer PATH`, from a folder or the .model file: the JSONL's ids are SentencePiece's."""
    import json

    from typer.testing import CliRunner

    import bamctl.cli.task_commands  # noqa: F401  (registers `generate`)
    from bamctl.cli.app import app

    out = tmp_path / "authors.jsonl"
    args = ["generate", "passkey", "--protocol", "authors", "--tokenizer", str(paths[source]),
            "--lengths", "1000", "--depths", "0,1", "--samples", "2", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 4
    for row in rows:
        i = round(row["depth"])
        prompt, answer, target = authors_prompt(reference, 1000, lambda n: int(torch.linspace(0, n, 2).long()[i]), row["answers"][0])  # noqa: B023
        assert (row["input_ids"], row["answer_ids"], row["target_ids"]) == (prompt, answer, target)
        assert row["n_tokens"] == len(prompt) < 1000
