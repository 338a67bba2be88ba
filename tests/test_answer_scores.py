"""Continuous answer scores (``answer_logprob``, ``answer_rank``): each row's teacher-forced answer
held to a plain loop over the model's own forward (written here and in ``own_models``, not bamctl's
engine), on bamctl's native engine and on a user's module."""

from __future__ import annotations

import math

import torch

import bamctl
from bamctl.checkpoint import new_random_model
from bamctl.model import ModelConfig
from bamctl.tasks.registry import generate_samples
from bamctl.tokenizer import get_tokenizer
from own_models import gpt2_encoding, logits_of, nanogpt

TOLERANCE = 1e-5  # nats, on a sum of five log-probabilities


def plain_answer_scores(model, sample) -> tuple[float, range]:
    """The reference: one forward over prompt + answer (the model's own, no cache, no chunks); the
    log-probabilities of the scored answer tokens summed, and the ranks the first of them may have
    (1 + the tokens with a strictly higher log-probability at its position): a random model's
    distribution is nearly flat, so tokens within TOLERANCE of the answer's may fall either side of
    it under another order of summation (chunks, a cache), and only they."""
    prompt, answer, targets = sample.input_ids, sample.answer_ids, sample.target_ids
    logprobs = torch.log_softmax(logits_of(model, prompt + answer[:-1])[len(prompt) - 1:].double(), dim=-1)
    first = len(answer) - len(targets)
    chosen = [float(logprobs[first + i, token]) for i, token in enumerate(targets)]
    row, own = logprobs[first], logprobs[first, targets[0]]
    surely_above, maybe_above = int((row > own + TOLERANCE).sum()), int((row > own - TOLERANCE).sum()) - 1
    return math.fsum(chosen), range(1 + surely_above, 2 + maybe_above)


def _check_rows(rows, samples, model):
    assert len(rows) == len(samples) > 0
    by_draw = {(row["draw"], row["depth"]): row for _, row in rows.iterrows()}
    for sample in samples:
        row = by_draw[(sample.draw, sample.depth)]
        logprob, rank = plain_answer_scores(model, sample)
        assert abs(row["answer_logprob"] - logprob) < TOLERANCE
        assert row["answer_rank"] in rank and len(rank) < 50  # (the answer's own token is never above itself)
        # the rank agrees with the 0/1 score: a right first digit is the argmax
        assert (row["answer_rank"] == 1) >= bool(row["correct"])


def test_a_users_module_rows_carry_the_plain_loops_answer_logprob_and_rank(tmp_path):
    model, encoding = nanogpt(seed=3), gpt2_encoding()
    rows = bamctl.evaluate((model, encoding), task="passkey", lengths="96,160", samples=2, depths=[0.0, 0.5],
                           dir=tmp_path, quiet=True)
    samples = list(generate_samples("passkey", [96, 160], 2, 0, get_tokenizer("gpt2"), depths=[0.0, 0.5], protocol="exact"))
    _check_rows(rows[rows["length"] == 96], [s for s in samples if s.length == 96], model)
    _check_rows(rows[rows["length"] == 160], [s for s in samples if s.length == 160], model)
    assert (rows["answer_rank"] > 1).any()  # a random model: ranks other than the argmax are met, and held


def test_bamctls_engine_rows_carry_the_plain_loops_answer_logprob_and_rank(tmp_path):
    model = new_random_model(ModelConfig.from_preset("micro", "bam-ssmax", train_length=128), 0)
    # chunks of 64 over prompts of 256: the cache and the chunking are what this holds to one forward
    rows = bamctl.evaluate(model, "passkey", lengths="256", samples=2, depths=[0.25, 1.0], chunk_size=64, dir=tmp_path,
                           quiet=True)
    samples = list(generate_samples("passkey", [256], 2, 0, get_tokenizer("gpt2"), depths=[0.25, 1.0], protocol="exact"))
    _check_rows(rows, samples, model.eval())
