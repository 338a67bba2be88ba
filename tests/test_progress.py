"""Progress of a run: an ETA priced by length (attention grows with it), a line per finished cell."""

from __future__ import annotations

import pytest

from bamctl.checkpoint import new_random_model, save_checkpoint
from bamctl.cli import main
from bamctl.runs.progress import CostFit, RunProgress, cells_of, prior_cost
from bamctl.model import ModelConfig
from bamctl.tasks.sample import SampleSlot


def slot(length: int, seed: int = 0, index: int = 0) -> SampleSlot:
    return SampleSlot(task="passkey", protocol="exact", scoring="teacher_forced", metric="passkey_exact",
                      max_new_tokens=0, length=length, depth=None, seed=seed, index=index)


def plan(lengths, per_length: int = 4, seeds=(0,)) -> list[SampleSlot]:
    return [slot(length, seed, i) for seed in seeds for length in lengths for i in range(per_length)]


def cost(length: int) -> float:
    """A run's true seconds per sample: linear work plus attention's quadratic share."""
    return 1e-4 * length + 2e-8 * length**2


def row(s: SampleSlot) -> dict:
    return {"seed": s.seed, "length": s.length, "seconds": cost(s.length), "n_tokens": s.length}


def test_the_eta_prices_long_prompts_by_their_quadratic_cost():
    slots = plan([1024, 2048, 4096, 32768, 131072])
    progress = RunProgress(slots, "passkey m")
    for s in slots[:12]:  # the three short lengths timed, the two long ones still to do
        progress.row_written(row(s))
    truth = sum(cost(s.length) for s in slots[12:])
    per_sample = sum(cost(s.length) for s in slots[:12]) / 12 * len(slots[12:])  # what counting samples says
    assert truth / 1.5 < progress.eta() < truth * 1.5  # past 4k: the prior shape, anchored at 4k's price
    assert per_sample < truth / 100  # the old estimate was off by two orders of magnitude here


def test_one_timed_length_takes_the_prior_shape():
    fit = CostFit()
    fit.add(1024, 2.0)
    assert fit.price(1024) == pytest.approx(2.0)
    assert fit.price(4096) > 4 * fit.price(1024)  # a longer prompt is priced more than linearly


def test_a_constant_cost_per_sample_is_priced_as_constant():
    # Generation-bound samples (a fixed answer budget) take about as long at every length.
    fit = CostFit()
    for length, seconds in ((256, 4.1), (256, 4.0), (512, 3.3), (512, 3.4)):
        fit.add(length, seconds)
    c, a, b = fit.coefficients()
    assert (a, b) == (0.0, 0.0) and c == pytest.approx(3.7)
    assert fit.price(384) == pytest.approx(3.7)  # within the lengths timed: the fit
    assert fit.price(8192) == pytest.approx(3.7 * prior_cost(8192, 0) / prior_cost(512, 0))  # past them: the prior's growth


def test_the_fit_recovers_a_constant_plus_quadratic_cost():
    fit = CostFit()
    for length in (512, 1024, 2048, 4096):
        fit.add(length, 0.5 + 3e-4 * length + 1e-7 * length**2)
    c, a, b = fit.coefficients()
    assert (c, a, b) == pytest.approx((0.5, 3e-4 * 1024, 1e-7 * 1024**2), rel=1e-6)
    assert fit.price(3000) == pytest.approx(0.5 + 3e-4 * 3000 + 1e-7 * 3000**2, rel=1e-6)


def test_cells_stored_already_leave_the_price_once_the_run_passes_them():
    slots = plan([128, 256, 512], per_length=2)
    lines = []
    progress = RunProgress(slots, "passkey m", say=lines.append)
    progress.row_written(row(slots[0]))
    progress.row_written(row(slots[1]))
    # The 256 cell was stored already: the next row written is of 512.
    progress.row_written(row(slots[4]))
    assert progress.eta() == pytest.approx(cost(512), rel=0.5)  # one 512 sample left, none of 256
    assert progress.done_fraction() > 0.5
    progress.row_written(row(slots[5]))
    progress.finish()
    assert len(lines) == 2 and lines[0].startswith("passkey m 128: 2 samples") and lines[1].startswith("passkey m 512: 2 samples")
    assert "100% of the run done" in lines[1]


def test_a_cell_partly_stored_says_so():
    slots = plan([128, 256], per_length=3)
    lines = []
    progress = RunProgress(slots, "passkey m", say=lines.append)
    progress.row_written(row(slots[0]))
    progress.row_written(row(slots[3]))
    progress.finish()
    assert "1 sample (2 stored already)" in lines[0]


def test_cells_follow_the_plan_order_of_seeds_and_lengths():
    cells = cells_of(plan([128, 256], per_length=2, seeds=(0, 1)))
    assert [(c.seed, c.length, c.rows) for c in cells] == [(0, 128, 2), (0, 256, 2), (1, 128, 2), (1, 256, 2)]


def test_without_a_terminal_each_finished_cell_prints_one_line(tmp_path, capsys):
    model = save_checkpoint(new_random_model(ModelConfig.from_preset("micro", "bam", train_length=128), 0), tmp_path / "m")
    with pytest.raises(SystemExit) as done:
        main(["passkey", str(model), "--lengths", "128,256", "--samples", "1", "--depths", "2", "--seed", "0,1",
              "--dir", str(tmp_path / "r")])
    err = capsys.readouterr().err  # captured: not a terminal
    assert done.value.code == 0, err
    cells = [line for line in err.splitlines() if line.startswith("passkey m ")]
    assert [line.split(":")[0] for line in cells] == ["passkey m 128 seed 0", "passkey m 128 seed 1",  # one length at a time
                                                       "passkey m 256 seed 0", "passkey m 256 seed 1"]
    assert all("2 samples in" in line and "of the run done" in line for line in cells)
    with pytest.raises(SystemExit):
        main(["passkey", str(model), "--lengths", "128,256", "--samples", "1", "--depths", "2", "--seed", "0,1",
              "--dir", str(tmp_path / "quiet"), "--quiet"])
    assert not [line for line in capsys.readouterr().err.splitlines() if line.startswith("passkey m ")]


def test_an_interrupted_cell_says_what_it_computed_and_claims_nothing_more():
    """Ctrl-C at 16k after 7 of its 20 rows, in a folder that held nothing: the line says 7
    computed and 13 not, not "13 stored already", and the cells after it stay unresolved, so
    the share done counts the rows computed (it once closed every cell left as stored)."""
    slots = plan([1024, 16384, 65536], per_length=20)
    lines = []
    progress = RunProgress(slots, "passkey m", say=lines.append)
    for s in slots[:27]:  # the 1k cell, then 7 rows of 16k
        progress.row_written(row(s))
    progress.finish(interrupted=True)
    assert len(lines) == 2
    assert "16k: interrupted, 7 samples computed" in lines[1] and "and 13 not" in lines[1]
    assert "stored already)" not in lines[1].split("and 13 not")[0]
    assert 0 < progress.done_fraction() < 0.1  # the 64k cell unresolved (closing it as stored said 100%)


def test_a_run_interrupted_from_the_command_line_keeps_its_line(tmp_path, capsys, monkeypatch):
    """The runner tells the tracker the run was interrupted: a KeyboardInterrupt in the second
    cell prints that cell's interrupted line, not every later cell as stored."""
    from bamctl.evaluation import Evaluation

    model = save_checkpoint(new_random_model(ModelConfig.from_preset("micro", "bam", train_length=128), 0), tmp_path / "m")
    answer = Evaluation._answer
    calls = []

    def interrupted(self, batch):
        calls.append(len(batch))
        if len(calls) == 4:  # two batches of 128, one of 256 answered
            raise KeyboardInterrupt
        return answer(self, batch)

    monkeypatch.setattr(Evaluation, "_answer", interrupted)
    with pytest.raises(SystemExit) as done:
        main(["passkey", str(model), "--lengths", "128,256,512", "--samples", "2", "--batch-size", "5",
              "--dir", str(tmp_path / "r")])
    assert done.value.code == 130
    err = capsys.readouterr().err
    assert "256: interrupted, 5 samples computed" in err and "and 5 not" in err
    assert "512:" not in err


def test_an_eta_that_reaches_far_past_the_timed_lengths_says_it_is_an_extrapolation():
    """The design card's command, ``bamctl passkey --lengths 1k..512k`` (20 rows a length), timed
    by a fake clock: while lengths more than 4x the longest timed are left, each line says the
    ETA is extrapolated and from which length; from 128k on, it is not."""
    from bamctl.lengths import parse_lengths

    slots = plan(parse_lengths("1k..512k"), per_length=20)
    lines = []
    progress = RunProgress(slots, "passkey bam-ssmax", say=lines.append)
    for s in slots:
        progress.row_written(row(s))
    progress.finish()
    assert len(lines) == 10
    assert "(extrapolated from lengths up to 1k)" in lines[0]
    assert all("extrapolated from lengths up to 64k" in line for line in lines[6:7])
    assert all("extrapolated" not in line for line in lines[7:])


# Seconds per prompt of bam-ssmax on this 2-core machine (one thread, passkey, teacher-forced):
# 1k-8k from the held-out compare's cell lines (1,024 / 24,949 tok/s ...), 64k and 128k from the
# baselines record (steps 14 and 19: median 25 and 79 s), 512k the ~25 min the trust issue timed.
MEASURED = [(1024, 0.041), (2048, 0.0866), (4096, 0.2325), (8192, 0.608), (65536, 25.0), (131072, 79.0), (524288, 1500.0)]


def measured_cost(length: int) -> float:
    """Log-log interpolation between the measured points."""
    import math

    for (a, ya), (b, yb) in zip(MEASURED, MEASURED[1:]):
        if a <= length <= b:
            t = math.log(length / a) / math.log(b / a)
            return math.exp(math.log(ya) + t * math.log(yb / ya))
    raise ValueError(length)


@pytest.mark.parametrize("seed", range(4))
def test_the_design_cards_eta_moves_by_less_than_2x_from_one_cell_line_to_the_next(seed):
    """``bamctl passkey --lengths 1k..512k`` (20 prompts a length) on a fake clock: bam-ssmax's
    measured seconds per prompt, each row off by up to 25% (seeded). Every cell line's time left
    is within 2x of the line before, and of the truth from the first line on (the fit's own
    curve, extrapolated, moved by up to 14x between lines and said 0.37x the truth)."""
    import random
    import re

    from bamctl.lengths import parse_lengths

    slots = plan(parse_lengths("1k..512k"), per_length=20)
    noise = random.Random(seed)
    lines, left = [], []
    progress = RunProgress(slots, "passkey bam-ssmax", say=lines.append)
    for index, s in enumerate(slots):
        progress.row_written({**row(s), "seconds": measured_cost(s.length) * noise.uniform(0.8, 1.25)})
        if index + 1 < len(slots) and slots[index + 1].length != s.length:
            left.append(sum(measured_cost(t.length) for t in slots[index + 1 :]))
    progress.finish()
    said = [3600 * int(h) + 60 * int(m) + int(sec) for h, m, sec in
            (re.search(r"about (\d+):(\d+):(\d+) left", line).groups() for line in lines[:-1])]
    assert len(said) == len(left) == 9
    assert all(max(a, b) / min(a, b) < 2 for a, b in zip(said, said[1:]))
    assert all(truth / 2 < eta < truth * 2 for eta, truth in zip(said, left))
    assert sum(measured_cost(s.length) for s in slots) / 3600 == pytest.approx(10.9, abs=0.1)  # the run: ~11 h
