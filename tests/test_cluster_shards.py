"""`--shard auto`: which slice of a sweep this process takes, read from the scheduler's environment."""

import pytest

from bamctl.cluster.shards import shard_from_environment, shard_option
from bamctl.errors import BamctlError


@pytest.mark.parametrize("env, expected", [
    ({"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "4"}, (2, 4)),
    # no count: from MIN/MAX (and the step of --array=3-9:2, i.e. tasks 3,5,7,9)
    ({"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "3", "SLURM_ARRAY_TASK_MAX": "6"}, (2, 4)),
    ({"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_MIN": "3", "SLURM_ARRAY_TASK_MAX": "9", "SLURM_ARRAY_TASK_STEP": "2"}, (2, 4)),
    # what Slurm 22.05 sets for --array=1-2 (task 2) and --array=0-2:2 (task 2): COUNT is no index bound
    ({"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "2",
      "SLURM_ARRAY_TASK_STEP": "1"}, (1, 2)),
    ({"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "2",
      "SLURM_ARRAY_TASK_STEP": "2"}, (1, 2)),
    ({"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "2",
      "SLURM_ARRAY_TASK_STEP": "2"}, (0, 2)),
    # an array task carries SLURM_PROCID/NTASKS of its own one-task job too: the array decides
    ({"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, (1, 3)),
    ({"SLURM_PROCID": "3", "SLURM_NTASKS": "8"}, (3, 8)),
    ({"RANK": "1", "WORLD_SIZE": "2"}, (1, 2)),
    # torchrun inside a one-task Slurm job: torchrun's ranks split the work
    ({"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, (1, 2)),
])
def test_auto_reads_each_scheduler(env, expected):
    shard, source = shard_from_environment(env)
    assert shard == expected
    assert source


def test_auto_outside_a_scheduler_is_the_whole_sweep_and_says_so():
    notes = []
    assert shard_option("auto", {}, say=notes.append) == (0, 1)
    assert len(notes) == 1 and "0/1" in notes[0]


def test_auto_names_where_its_shard_came_from():
    notes = []
    assert shard_option("auto", {"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}, say=notes.append) == (1, 2)
    assert "SLURM_PROCID" in notes[0]


def test_auto_split_covers_every_slot_once():
    slots = list(range(23))
    taken = [slots[i::n] for i, n in (shard_option("auto", {"RANK": str(r), "WORLD_SIZE": "4"}, say=print) for r in range(4))]
    assert sorted(s for part in taken for s in part) == slots


@pytest.mark.parametrize("env", [
    {"SLURM_ARRAY_TASK_ID": "x", "SLURM_ARRAY_TASK_COUNT": "4"},
    {"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_COUNT": "4"},
    {"SLURM_ARRAY_TASK_ID": "2"},  # neither a count nor MIN/MAX
    {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "2", "SLURM_ARRAY_TASK_STEP": "2"},
    {"RANK": "0", "WORLD_SIZE": "0"},
])
def test_auto_refuses_a_broken_environment_by_name(env):
    with pytest.raises(BamctlError, match="SLURM|RANK|WORLD_SIZE"):
        shard_option("auto", env, say=print)


def test_explicit_shards_still_parse():
    assert shard_option("1/3", {"RANK": "0", "WORLD_SIZE": "2"}, say=print) == (1, 3)
    assert shard_option(None, {}, say=print) == (0, 1)
    with pytest.raises(BamctlError, match="--shard"):
        shard_option("3/3", {}, say=print)
