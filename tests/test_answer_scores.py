"""Continuous answer scores (``answer_logprob``, ``answer_rank``): each row's teacher-forced answer
held to a plain loop over the model's own forward (written here and in ``own_models``, not bamctl's
engine), on bamctl's native engine and on a user's module; and a model that never finds a key but
grows less sure of it with length shows that fall in ``compare --metric answer_logprob``, where its
accuracy shows nothing."""

from __future__ import annotations

import json
import math
import textwrap

import pytest
import torch
from typer.testing import CliRunner

import bamctl
from bamctl.checkpoint import new_random_model
from bamctl.cli.app import app
from bamctl.model import ModelConfig
from bamctl.tasks.registry import generate_samples
from bamctl.tokenizer import get_tokenizer
from own_models import gpt2_encoding, logits_of, nanogpt

TOLERANCE = 1e-5  # nats, on a sum of five log-probabilities


def plain_answer_scores(model, sample, answer: list[int] | None = None) -> tuple[float, range]:
    """The reference: one forward over prompt + answer (the model's own, no cache, no chunks); the
    log-probabilities of the scored answer tokens summed, and the ranks the first of them may have
    (1 + the tokens with a strictly higher log-probability at its position): a random model's
    distribution is nearly flat, so tokens within TOLERANCE of the answer's may fall either side of
    it under another order of summation (chunks, a cache), and only they."""
    prompt = sample.input_ids
    answer, targets = (sample.answer_ids, sample.target_ids) if answer is None else (answer, answer)
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


def test_generated_rows_teacher_force_the_expected_answer_only_when_asked(tmp_path):
    model, encoding = nanogpt(seed=3), gpt2_encoding()
    ask = dict(task="niah_single_1", lengths="240", samples=2, dir=tmp_path, quiet=True)
    plain = bamctl.evaluate((model, encoding), **ask)
    assert plain["answer_logprob"].isna().all() and plain["answer_rank"].isna().all()
    asked = bamctl.evaluate((model, encoding), answer_logprob=True, **ask)
    assert not set(asked["request_digest"]) & set(plain["request_digest"])  # the null rows are not reused
    assert list(asked["predicted"]) == list(plain["predicted"])  # the generation itself is unchanged
    samples = {s.index: s for s in generate_samples("niah_single_1", [240], 2, 0, get_tokenizer("gpt2"))}
    for _, row in asked.iterrows():
        sample = samples[row["sample"]]
        # restated: the answer written as a generation would write it, after the prompt's last word
        assert not sample.prompt[-1].isspace()
        logprob, ranks = plain_answer_scores(model, sample, encoding.encode(" " + ", ".join(sample.answers)))
        assert abs(row["answer_logprob"] - logprob) < TOLERANCE and row["answer_rank"] in ranks


# A model that is never right and grows less sure of the key with length: every position's argmax is
# token 0 ("!", never a digit), by a margin that grows with the position, so each digit's
# log-probability falls as the prompt grows while every row scores 0.
FADING_BUILDER = """
    import torch
    from own_models import gpt2_encoding

    class Fading(torch.nn.Module):
        train_length = 128

        def __init__(self):
            super().__init__()
            self.vocab = gpt2_encoding().n_vocab
            self.margin = torch.nn.Parameter(torch.tensor(8.0))  # the argmax's lead at the first position

        def forward(self, ids):
            batch, length = ids.shape
            logits = torch.zeros(batch, length, self.vocab)
            logits[:, :, 0] = self.margin + torch.arange(length) / 64.0
            return logits

    def build():
        return Fading(), gpt2_encoding()
"""


def test_compare_shows_the_fall_of_a_never_right_models_answer_logprob(tmp_path):
    path = tmp_path / "fading.py"
    path.write_text(textwrap.dedent(FADING_BUILDER))
    lengths = [128, 256, 512, 1024]
    result = CliRunner().invoke(app, [
        "compare", f"py:{path}:build", "--task", "passkey", "--lengths", ",".join(map(str, lengths)), "--samples", "2",
        "--depths", "0.5", "--dir", str(tmp_path / "res"), "--plot", str(tmp_path / "p.png"), "--json",
        "--metric", "answer_logprob",
    ])
    assert result.exit_code == 0, result.output
    summary, = json.loads(result.stdout)["summaries"]
    assert summary["metric"] == "answer_logprob"
    cells = {cell["length"]: cell for cell in summary["cells"]}
    means = [cells[n]["answer_logprob"] for n in lengths]
    assert all(a > b for a, b in zip(means, means[1:])), means  # falls with length
    for n in lengths:
        assert cells[n]["lo"] <= cells[n]["answer_logprob"] <= cells[n]["hi"]
    import pandas as pd

    rows = pd.read_parquet(tmp_path / "res")
    assert (rows["score"] == 0).all() and (rows["answer_rank"] > 1).all()  # never right: accuracy shows nothing
    # the stored rows give the same cells to `results show` and to a paper's table
    shown = CliRunner().invoke(app, ["results", "show", "--dir", str(tmp_path / "res"), "--metric", "answer_logprob", "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["summaries"][0]["cells"] == summary["cells"]
    exported = CliRunner().invoke(app, ["results", "export", "--dir", str(tmp_path / "res"), "--metric", "answer_logprob",
                                        "--format", "json"])
    assert exported.exit_code == 0, exported.output
    assert json.loads(exported.stdout)["summaries"][0]["cells"] == summary["cells"]
    refused = CliRunner().invoke(app, ["results", "export", "--dir", str(tmp_path / "res"), "--metric", "logprob"])
    assert refused.exit_code != 0


# -- the table: a cell's mean and its interval count draws (keys), not prompts ------------------


def _logprob_rows(model: str, values: dict[tuple[int, float], float], length: int = 1024) -> list[dict]:
    from results_fakes import fake_row

    return [fake_row(model, length=length, seed=0, sample=sample, depth=depth, score=0.0, answer_logprob=value)
            for (sample, depth), value in values.items()]


def test_a_cells_answer_logprob_interval_resamples_keys_not_prompts():
    import numpy as np

    from results_fakes import frame_of

    from bamctl.results.summary import summarize

    rng = np.random.default_rng(5)
    # 4 keys at 5 depths each: the depths of one key share it, so 20 prompts are 4 outcomes
    values = {(sample, depth): float(-3 * sample + rng.normal(0, 0.5)) for sample in range(4) for depth in (0, .25, .5, .75, 1)}
    summary, = summarize(frame_of(_logprob_rows("tiny-rope", values)), metric="answer_logprob")
    cell = summary.table.loc[1024]
    assert summary.metric == "answer_logprob" and summary.effective is None
    assert cell[("n", "tiny-rope")] == 20 and cell[("n_draws", "tiny-rope")] == 4
    assert cell[("answer_logprob", "tiny-rope")] == pytest.approx(np.mean(list(values.values())))
    # the reference restates the cluster bootstrap: each key's mean, keys resampled with replacement
    per_key = np.array([np.mean([v for (s, _), v in values.items() if s == k]) for k in range(4)])
    picks = np.random.default_rng(0).integers(0, 4, size=(2000, 4))
    means = per_key[picks].mean(axis=1)
    assert (cell[("lo", "tiny-rope")], cell[("hi", "tiny-rope")]) == pytest.approx(
        (np.quantile(means, 0.025), np.quantile(means, 0.975)))


def test_one_key_has_no_interval_and_rows_without_log_probs_say_why():
    from results_fakes import fake_row, frame_of

    from bamctl.errors import BamctlError
    from bamctl.results.summary import summarize

    summary, = summarize(frame_of(_logprob_rows("tiny-rope", {(0, 0.0): -2.0, (0, 1.0): -4.0})), metric="answer_logprob")
    cell = summary.table.loc[1024]
    assert cell[("answer_logprob", "tiny-rope")] == -3.0 and cell[("n_draws", "tiny-rope")] == 1
    assert math.isnan(cell[("lo", "tiny-rope")])  # one key says nothing of the spread
    generated = [fake_row(task="niah_single_1", protocol="ruler", scoring="generate", answer_logprob=None, answer_rank=None)]
    with pytest.raises(BamctlError, match="--answer-logprob"):
        summarize(frame_of(generated), metric="answer_logprob")
    with pytest.raises(BamctlError, match="one of score, answer_logprob"):
        summarize(frame_of(generated), metric="answer_rank")


def test_plots_draw_the_answer_logprob_from_stored_rows(tmp_path, capsys):
    from results_fakes import fake_row

    from bamctl.cli import main
    from bamctl.results.plots import curves_figure
    from bamctl.results.store import ResultStore

    rows = [fake_row(model, length=length, sample=i, score=0.0, answer_logprob=-length / 512 - i / 10 - bump)
            for model, bump in (("tiny-rope", 0.0), ("tiny-bam", 1.0)) for length in (512, 1024, 2048) for i in range(3)]
    ResultStore(tmp_path / "res").append(rows)
    ax, = curves_figure(ResultStore(tmp_path / "res").read(), metric="answer_logprob").axes
    drawn = {line.get_label().split(" (")[0]: list(line.get_ydata()) for line in ax.get_lines() if line.get_label()[0] != "_"}
    # each model's line is its mean answer log-probability per length, falling as the rows do
    assert drawn["tiny-rope"] == pytest.approx([-1.1, -2.1, -4.1]) and drawn["tiny-bam"] == pytest.approx([-2.1, -3.1, -5.1])
    assert "log-prob" in ax.get_ylabel()
    for command in ("curves", "grid"):
        with pytest.raises(SystemExit) as exit_:
            main(["plot", command, "--dir", str(tmp_path / "res"), "--metric", "answer_logprob", "--out", str(tmp_path / f"{command}.png")])
        assert exit_.value.code in (0, None) and (tmp_path / f"{command}.png").stat().st_size > 0


def test_the_authors_protocols_unscored_leading_token_is_left_out_of_both_scores():
    """The authors' protocol feeds " " + key but scores only the digits: the space's log-probability
    and rank are not the answer's (what a sum over every fed token would get wrong)."""
    from types import SimpleNamespace

    from bamctl.answers import ANSWERS
    from bamctl.backends.base import ContinuationScore
    from bamctl.tasks.sample import SampleSlot

    slot = SampleSlot("passkey", "authors", "teacher_forced", "passkey_exact", 0, 64, 0.5, 0, 0)
    sample = slot.sample(input_ids=[7] * 10, prompt="...", answers=["123"], answer_ids=[220, 16, 17, 18],
                         target_ids=[16, 17, 18])
    fed = ContinuationScore(predicted_ids=[220, 16, 17, 99], logprobs=[-9.0, -0.5, -0.25, -2.0], ranks=[40, 1, 1, 3])
    backend = SimpleNamespace(score_continuations=lambda requests: [fed],
                              tokenizer=SimpleNamespace(decode=lambda ids: "".join(map(str, ids)), vocab_size=50257))
    (row,), = ANSWERS["teacher_forced"](backend, [sample])
    assert row["answer_logprob"] == -2.75 and row["answer_rank"] == 1 and row["score"] == 0.0


def test_a_near_certain_answer_keeps_its_digits_in_the_table():
    from results_fakes import frame_of

    from bamctl.results.render import format_cell
    from bamctl.results.summary import summarize

    values = {(sample, 0.5): -3e-4 * (1 + sample) for sample in range(3)}  # a trained model's found keys
    summary, = summarize(frame_of(_logprob_rows("tiny-rope", values)), metric="answer_logprob")
    assert format_cell(summary, 1024, "tiny-rope").startswith("-6.0e-04 [")  # not "-0.00", which hides the scale


def test_answer_logprob_cells_leave_out_rows_without_one_and_keep_the_asked_model_order():
    from results_fakes import fake_row, frame_of

    from bamctl.results.summary import answer_logprob_table

    rows = _logprob_rows("tiny-rope", {(0, 0.5): -2.0, (1, 0.5): -4.0}) + _logprob_rows("tiny-bam", {(0, 0.5): -1.0})
    rows.append(fake_row("tiny-rope", sample=2, answer_logprob=None))  # a generated row asked without it
    table = answer_logprob_table(frame_of(rows), models=["tiny-rope", "tiny-bam"])
    assert list(table["answer_logprob"].columns) == ["tiny-rope", "tiny-bam"]  # as asked, not sorted
    assert table.loc[1024, ("answer_logprob", "tiny-rope")] == -3.0 and table.loc[1024, ("n", "tiny-rope")] == 2
    assert list(answer_logprob_table(frame_of(rows))["n"].columns) == ["tiny-bam", "tiny-rope"]  # by default, by name


def test_metric_answer_logprob_over_rows_that_hold_none_says_why_in_one_line():
    from results_fakes import fake_row, frame_of, perplexity_rows

    from bamctl.errors import BamctlError
    from bamctl.results.summary import summarize

    with pytest.raises(BamctlError) as refused:
        summarize(frame_of(perplexity_rows()), metric="answer_logprob")
    assert str(refused.value) == ("--metric answer_logprob: ppl rows have no answer to score (perplexity); it "
                                  "applies to passkey and RULER")
    generated = [fake_row(task="niah_single_1", protocol="ruler", scoring="generate", answer_logprob=None)]
    with pytest.raises(BamctlError) as refused:
        summarize(frame_of(generated), metric="answer_logprob")
    assert str(refused.value) == (
        "--metric answer_logprob: no niah_single_1 row holds an answer log-probability (generated rows hold one only "
        "when run with --answer-logprob; rows written before schema 9 hold none)")
