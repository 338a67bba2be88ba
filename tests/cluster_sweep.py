"""The sweep the cluster tests submit (local executor and real Slurm alike): two micro models,
a dozen rows, and the same sweep run the ordinary way to compare against."""

from __future__ import annotations

import io
from contextlib import redirect_stdout

import pytest

from bamctl.checkpoint import new_random_model, save_checkpoint
from bamctl.cli import main
from bamctl.model import ModelConfig
from bamctl.results.store import ResultStore

# skipped_blocks and key_blocks count the work of the batch a sample ran in (its padding, its
# chunks' query blocks), as seconds time it: other batches or shards count otherwise
VOLATILE = ["run_id", "created_at", "seconds", "tokens_per_s", "peak_mem_bytes", "git_revision", "skipped_blocks",
            "key_blocks",
            # a sum of log-probs, which other batches round otherwise (to 1e-4: the batched-rows test holds it)
            "answer_logprob"]
KEYS = ["model", "task", "protocol", "setting", "length", "depth", "seed", "sample", "position"]
SWEEP = ["--task", "passkey", "--lengths", "128", "--samples", "2", "--depths", "0,0.5,1", "--device", "cpu"]
ROWS = 2 * 3 * 2  # models x depths x samples


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return [str(save_checkpoint(new_random_model(ModelConfig.from_preset("micro", pe, train_length=128), seed), root / pe))
            for pe, seed in (("bam-ssmax", 0), ("rope", 1))]


@pytest.fixture(scope="module")
def one_process(models, tmp_path_factory):
    """The sweep run the ordinary way: its rows and the table it printed."""
    out = tmp_path_factory.mktemp("whole") / "results"
    printed = io.StringIO()
    with redirect_stdout(printed):
        assert run_cli("compare", *models, *SWEEP, "--quiet", "--dir", out) == 0
    return ResultStore(out).read(), printed.getvalue()


def run_cli(*args):
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    return exit_info.value.code


def stable(frame):
    return frame.drop(columns=VOLATILE, errors="ignore").sort_values(KEYS).reset_index(drop=True)


def compare_command(models, out):
    return ["compare", *models, *SWEEP, "--dir", str(out)]


def shard_slow_to_start(command, shard, sweep_id, threads):
    """Each shard waits before its work: a test's Ctrl-C then comes while it runs, however fast or
    loaded the machine (a shard of this tiny sweep can otherwise finish before the cancel lands)."""
    import time

    time.sleep(15)
    from bamctl.cli.submit_commands import run_shard

    run_shard(command, shard, sweep_id, threads)
