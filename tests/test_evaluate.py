"""End-to-end evaluation: scores against the dense forward, resume after kills, compare, perplexity counts."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas
import pytest
import torch

from bamctl.backends import RunOptions, open_backend
from bamctl.checkpoint import load_checkpoint, new_random_model, save_checkpoint
from bamctl.cli import main
from bamctl.evaluation import Evaluation, TaskRequest, default_lengths
from bamctl.model import ModelConfig
from bamctl.results.store import ResultStore
from bamctl.tasks import generate_samples
from bamctl.tokenizer import get_tokenizer

# skipped_blocks and key_blocks count the work of the batch a sample ran in (its padding, its
# chunks' query blocks), as seconds time it: other batches or shards count otherwise
VOLATILE = ["run_id", "created_at", "seconds", "tokens_per_s", "peak_mem_bytes", "git_revision", "skipped_blocks",
            "key_blocks",
            # a sum of log-probs, which other batches round otherwise (to 1e-4: the batched-rows test holds it)
            "answer_logprob"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    paths = {}
    for pe, seed in (("bam-ssmax", 0), ("rope", 1)):
        model = new_random_model(ModelConfig.from_preset("micro", pe, train_length=128), seed)
        paths[pe] = str(save_checkpoint(model, root / pe))
    return paths


def run_cli(*args):
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    return exit_info.value.code


KEYS = ["model", "task", "protocol", "setting", "length", "depth", "seed", "sample", "position"]


def stable(frame):
    return frame.drop(columns=VOLATILE, errors="ignore").sort_values(KEYS).reset_index(drop=True)


def test_teacher_forced_passkey_score_equals_dense_forward(models, tmp_path):
    backend = open_backend(models["bam-ssmax"], RunOptions(device="cpu", chunk_size=64))
    request = TaskRequest("passkey", [256], samples=2, seeds=[0], depths=[0.0, 0.5, 1.0])
    stats = Evaluation(backend, request, ResultStore(tmp_path), model_name="m").run()
    assert stats.written == 6
    dense = load_checkpoint(models["bam-ssmax"]).model
    tokenizer = get_tokenizer("gpt2")
    samples = list(generate_samples("passkey", [256], 2, 0, tokenizer, [0.0, 0.5, 1.0]))
    for sample, row in zip(samples, stats.rows):
        ids = torch.tensor([sample.input_ids + sample.target_ids])
        logits = dense(ids)[0, len(sample.input_ids) - 1 : -1]
        predicted = logits.argmax(-1).tolist()
        assert row["predicted"] == tokenizer.decode(predicted).strip()
        assert row["correct"] == (predicted == sample.target_ids)
        assert row["n_tokens"] == 256 and row["length"] == 256


def test_sliding_perplexity_scores_every_token_once(models, tmp_path):
    backend = open_backend(models["rope"], RunOptions(device="cpu", chunk_size=50))
    request = TaskRequest("ppl", [64, 128, 300], samples=1, seeds=[0], options={"doc_tokens": 300})
    evaluation = Evaluation(backend, request, ResultStore(tmp_path), model_name="m")
    rows = evaluation.run().rows
    for window in (64, 128, 300):
        assert sum(r["n_scored"] for r in rows if r["length"] == window) == 299
    single = [r for r in rows if r["length"] == 300]
    assert len(single) == 1
    # Windows of the full document length see all context: equal to one full pass.
    document = evaluation.plan.build(next(s for s in evaluation.plan.slots if s.length == 300))
    full = backend.token_nll(document.input_ids, 1)
    assert single[0]["nll"] == pytest.approx(float(full.double().sum()), rel=1e-5)
    assert single[0]["score"] == pytest.approx(single[0]["nll"] / 299)  # mean_nll, through the metric registry


def test_bucket_perplexity_rows_cover_the_document(models, tmp_path):
    backend = open_backend(models["rope"], RunOptions(device="cpu"))
    request = TaskRequest("ppl", [256], samples=1, seeds=[0], protocol="buckets", options={"bucket": 100})
    rows = Evaluation(backend, request, ResultStore(tmp_path), model_name="m").run().rows
    assert [r["position"] for r in rows] == [0, 100, 200]
    # No BOS before bamctl's own models: 257 tokens fed, the first context only, 256 scored
    # (100, 100, 56), as the authors' FineWeb validation cuts its rows.
    assert [r["n_scored"] for r in rows] == [100, 100, 56] and {r["n_tokens"] for r in rows} == {257}


def test_compare_writes_table_plot_and_identical_sample_keys(models, tmp_path, capsys):
    out = tmp_path / "res"
    code = run_cli("compare", models["bam-ssmax"], models["rope"], "--lengths", "128,256", "--samples", "1", "--dir", str(out), "--quiet")
    assert code == 0
    printed = capsys.readouterr().out
    assert "bam-ssmax" in printed and "rope" in printed and "effective length" in printed
    png = out.parent / "res-passkey.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    frame = ResultStore(out).read()
    keys = {m: set(map(tuple, g[["length", "depth", "seed", "sample"]].itertuples(index=False))) for m, g in frame.groupby("model")}
    assert keys["bam-ssmax"] == keys["rope"] and len(keys["rope"]) == 2 * 5


def test_rerun_skips_done_samples_and_force_recomputes(models, tmp_path, capsys):
    args = ["passkey", models["rope"], "--lengths", "128", "--samples", "1", "--dir", str(tmp_path), "--quiet"]
    assert run_cli(*args) == 0
    first = ResultStore(tmp_path).part_files()
    rows = len(ResultStore(tmp_path).read())
    assert len(first) == 1 and rows == 5  # the run's per-row parts were merged into one file
    capsys.readouterr()
    assert run_cli(*args) == 0
    assert ResultStore(tmp_path).part_files() == first  # nothing new written
    assert capsys.readouterr().err == ""  # --quiet: rows reused as asked is no news
    assert run_cli(*[a for a in args if a != "--quiet"]) == 0
    assert "5 samples already in" in capsys.readouterr().err
    assert run_cli(*args, "--force") == 0
    assert len(ResultStore(tmp_path).part_files()) == 1 and ResultStore(tmp_path).part_files() != first
    assert len(ResultStore(tmp_path).read(dedupe=False)) == rows  # the rows it replaced are gone: each sample once


# Long enough that the interrupt lands mid-run on an idle machine too: 5 lengths x 5 depths x 4 samples.
RUN = ["--lengths", "128,256,512,1k,2k", "--samples", "4"]
RUN_ROWS = 100


BATCH = 5  # the interrupted runs' --batch-size: a part file per 5 samples


def _passkey_process(model, out):
    cmd = [sys.executable, "-m", "bamctl", "passkey", model, *RUN, "--batch-size", str(BATCH), "--dir", str(out), "--quiet"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_for_parts(out: Path, n: int, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if len(list(out.glob("part-*.parquet"))) >= n:
            return
        if proc.poll() is not None:
            pytest.fail(f"process ended early: {proc.stderr.read()}")
        time.sleep(0.05)
    pytest.fail("no part files appeared")


@pytest.mark.parametrize("sig, code", [(signal.SIGKILL, -signal.SIGKILL), (signal.SIGINT, 130)])
def test_interrupted_run_keeps_finished_rows_and_rerun_equals_uninterrupted(models, tmp_path, sig, code):
    reference, interrupted = tmp_path / "reference", tmp_path / "interrupted"
    assert run_cli("passkey", models["rope"], *RUN, "--dir", str(reference), "--quiet") == 0
    for _ in range(5):  # an idle machine may finish the run before the signal lands: then try again afresh
        proc = _passkey_process(models["rope"], interrupted)
        _wait_for_parts(interrupted, 3, proc)
        proc.send_signal(sig)
        proc.wait(timeout=60)
        if proc.returncode != 0:
            break
        shutil.rmtree(interrupted)
    assert proc.returncode == code
    kept = ResultStore(interrupted).read()
    assert 3 <= len(kept) < RUN_ROWS
    assert len(kept) % BATCH == 0  # whole batches: nothing finished lost, only the batch in flight
    if sig == signal.SIGINT:
        assert "interrupted" in proc.stderr.read()
        assert len(ResultStore(interrupted).part_files()) == 1  # Ctrl-C still merges the run's parts
    rerun = _passkey_process(models["rope"], interrupted)
    assert rerun.wait(timeout=300) == 0
    expected, got = stable(ResultStore(reference).read()), stable(ResultStore(interrupted).read())
    assert len(got) == RUN_ROWS
    assert got.equals(expected)


def test_default_lengths_double_from_training_length():
    assert default_lengths([128]) == [128 * 2**i for i in range(7)]
    assert default_lengths([128, 256])[0] == 128 and default_lengths([128, 256])[-1] == 256 * 64


@pytest.mark.parametrize("task, extra", [("passkey", []), ("ppl", ["--doc-tokens", "400", "--stride", "64"])])
def test_three_shards_give_exactly_the_unsharded_table(models, tmp_path, task, extra):
    base = ["--lengths", "128,256", "--samples", "2", "--quiet", *extra]
    command = ["compare", models["rope"], "--task", task] if task == "passkey" else ["ppl", models["rope"]]
    assert run_cli(*command, *base, "--dir", str(tmp_path / "whole")) == 0
    for i in range(3):
        assert run_cli(*command, *base, "--dir", str(tmp_path / "sharded"), "--shard", f"{i}/3") == 0
    whole, sharded = stable(ResultStore(tmp_path / "whole").read()), stable(ResultStore(tmp_path / "sharded").read())
    assert len(sharded) == len(whole) > 3
    # A shard batches other windows together than the whole run: a window's summed NLL may then
    # move in its last bits (a batch's rows are their requests' alone to 1e-5, tests/test_batching.py).
    sums = ["nll", "score"] if task == "ppl" else []
    assert sharded.drop(columns=sums).equals(whole.drop(columns=sums))
    for column in sums:
        assert ((sharded[column] - whole[column]).abs() <= 1e-6 * whole[column].abs()).all()  # float32 sums


@pytest.mark.parametrize("bad", ["3/3", "1", "a/b", "-1/2", "1/0"])
def test_malformed_shard_is_refused(models, tmp_path, capsys, bad):
    assert run_cli("passkey", models["rope"], "--lengths", "128", "--shard", bad, "--dir", str(tmp_path)) == 2
    assert "--shard" in capsys.readouterr().err


# -- batches ----------------------------------------------------------------------------------
def _table(rows):
    return stable(pandas.DataFrame(rows))


class Appends:
    """A store that remembers the rows of each part file it writes."""

    def __init__(self, store):
        self.store, self.parts = store, []

    def __getattr__(self, name):
        return getattr(self.store, name)

    def append(self, rows):
        self.parts.append([(r["length"], r["request_digest"], r["position"]) for r in rows])  # a digest per sample
        return self.store.append(rows)


@pytest.mark.parametrize("task, protocol, options", [
    ("passkey", None, {}), ("ppl", None, {"doc_tokens": 400, "stride": 64}), ("passkey", "landmark", {}),
], ids=["teacher_forced", "nll", "generate"])
def test_batched_runs_write_the_rows_of_one_at_a_time_and_a_part_per_batch(models, tmp_path, task, protocol, options):
    backend = open_backend(models["bam-ssmax"], RunOptions(device="cpu", chunk_size=96))
    request = TaskRequest(task, [128, 256], samples=3, seeds=[0, 1], depths=[0.0, 1.0] if task == "passkey" else None,
                          protocol=protocol, options=options)
    one = Evaluation(backend, request, ResultStore(tmp_path / "one"), model_name="m").run(batch_size=1).rows
    store = Appends(ResultStore(tmp_path / "batched"))
    batched = Evaluation(backend, request, store, model_name="m").run(batch_size=4).rows
    assert len(batched) == len(one) > 8
    a, b = _table(batched), _table(one)
    sums = [c for c in ("nll", "score") if c in a and task == "ppl"]  # float sums over a span's tokens
    assert a.drop(columns=sums).equals(b.drop(columns=sums))  # same answers and identities
    for column in sums:
        assert (a[column] - b[column]).abs().max() <= 1e-4
    # a sum of log-probs (stable() leaves it out): batches round it otherwise, within 1e-4
    a, b = (pandas.DataFrame(rows).sort_values(KEYS).reset_index(drop=True).get("answer_logprob") for rows in (batched, one))
    assert (a is None) == (b is None)
    if a is not None:
        assert a.isna().equals(b.isna()) and (a - b).abs().fillna(0).max() <= 1e-4
    assert {r["request_digest"] for r in batched} == {r["request_digest"] for r in one}  # keys and digests unchanged
    samples_per_part = [len({row[1] for row in part}) for part in store.parts]
    assert max(samples_per_part) == 4 and all(len({row[0] for row in part}) == 1 for part in store.parts)  # one length
    assert sum(len(part) for part in store.parts) == len(batched)
    # The batch's time is shared by its rows; its throughput is the batch's tokens over that time.
    first = [r for r in batched if (r["length"], r["request_digest"], r["position"]) in store.parts[0]]
    assert len({r["seconds"] for r in first}) == 1 and len({r["tokens_per_s"] for r in first}) == 1


@pytest.mark.parametrize("task, seeds, samples, options, lengths", [
    ("passkey", [0, 1], 2, {}, [128, 256]),  # the seed outside the length: batches of 20, not 10
    ("ppl", [5], 4, {"stride": 64}, [128, 256]),  # the document outside the length: all its windows of a length together
], ids=["seeds", "documents"])
def test_the_batches_a_run_announces_are_the_batches_it_runs(models, tmp_path, task, seeds, samples, options, lengths):
    """Finding 6 of the fourth trust pass: a run's batches are as large as announced (``batch_sizes``),
    not cut at every change of seed or document."""
    backend = open_backend(models["bam-ssmax"], RunOptions(device="cpu"))
    request = TaskRequest(task, lengths, samples=samples, seeds=seeds, depths=None, protocol=None, options=options)
    evaluation = Evaluation(backend, request, Appends(ResultStore(tmp_path / "r")), model_name="m")
    announced = evaluation.batch_sizes()
    assert announced[min(lengths)] > samples  # more than one seed's or one document's worth
    evaluation.run()
    ran = [(part[0][0], len({row[1:] for row in part})) for part in evaluation.store.parts]
    assert [size for length, size in ran if size == announced[length]] and all(size <= announced[length] for length, size in ran)
    first = {}
    for length, size in ran:
        first.setdefault(length, size)
    assert first == announced  # every length's first batch is the announced size


def test_auto_batches_are_said_in_the_first_lines_and_bad_sizes_are_refused(models, tmp_path, capsys):
    args = ["passkey", models["rope"], "--lengths", "128,256", "--samples", "2", "--dir", str(tmp_path)]
    assert run_cli(*args) == 0
    err = capsys.readouterr().err
    assert "rope passkey: batches (--batch-size auto) of 10 at 128, 10 at 256 samples" in err
    assert run_cli(*args, "--batch-size", "3", "--force") == 0
    assert "batches (--batch-size 3) of 3 at 128, 3 at 256 samples" in capsys.readouterr().err
    for bad in ("0", "many", "-2"):
        assert run_cli(*args, "--batch-size", bad) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "--batch-size must be auto or a positive number" in lines[0]


def test_a_batch_size_that_cannot_fit_is_refused_before_any_sample(models, tmp_path, capsys, monkeypatch):
    from bamctl import devices

    monkeypatch.setattr(devices, "available_bytes", lambda device: 1 << 30)
    args = ["passkey", models["rope"], "--lengths", "64k", "--samples", "1", "--dir", str(tmp_path), "--quiet"]
    assert run_cli(*args, "--batch-size", "500") == 2
    assert "--batch-size 500:" in capsys.readouterr().err
    assert ResultStore(tmp_path).part_files() == []
