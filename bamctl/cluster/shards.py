"""``--shard``: the slice of a sweep this process evaluates, ``I/N`` or ``auto``.

A shard ``(i, n)`` takes slots i, i + n, i + 2n, … of every plan. ``auto`` reads ``i`` and ``n``
from the scheduler that started the process; every process of one job array (or one
``srun``, or one ``torchrun``) then runs the same command line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from bamctl.errors import BamctlError

Shard = tuple[int, int]
AUTO = "auto"


def parse_shard(text: str | None) -> Shard:
    """``"I/N"`` -> (I, N): this process takes every N-th sample starting at I (0-based)."""
    if text is None:
        return (0, 1)
    index, sep, count = text.partition("/")
    try:
        shard = (int(index), int(count))
    except ValueError:
        shard = None
    if not sep or shard is None or not 0 <= shard[0] < shard[1]:
        raise BamctlError(f"--shard takes I/N with 0 <= I < N, or auto, e.g. 0/4 (got {text!r})")
    return shard


def _integer(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise BamctlError(f"--shard auto: {name}={env[name]!r} is not an integer") from None


def _slurm_array(env: Mapping[str, str]) -> tuple[Shard, str]:
    """The task's place in its array. MIN/MAX/STEP first: ``--array=1-2`` or ``0-4:2`` numbers its
    tasks 1, 2 or 0, 2, 4, so the task id is a shard index only once MIN is taken off and STEP
    divided out; COUNT alone holds only for arrays that start at 0 with step 1."""
    task = _integer(env, "SLURM_ARRAY_TASK_ID")
    if "SLURM_ARRAY_TASK_MIN" in env and "SLURM_ARRAY_TASK_MAX" in env:
        low, high = _integer(env, "SLURM_ARRAY_TASK_MIN"), _integer(env, "SLURM_ARRAY_TASK_MAX")
        step = _integer(env, "SLURM_ARRAY_TASK_STEP") if "SLURM_ARRAY_TASK_STEP" in env else 1
        if step < 1 or (task - low) % step:
            raise BamctlError(f"--shard auto: SLURM_ARRAY_TASK_ID={task} is not in the array {low}-{high}:{step}")
        return ((task - low) // step, (high - low) // step + 1), "SLURM_ARRAY_TASK_ID within SLURM_ARRAY_TASK_MIN..MAX:STEP"
    if "SLURM_ARRAY_TASK_COUNT" in env:
        return (task, _integer(env, "SLURM_ARRAY_TASK_COUNT")), "SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT"
    raise BamctlError("--shard auto: SLURM_ARRAY_TASK_ID is set but neither SLURM_ARRAY_TASK_MIN/MAX nor SLURM_ARRAY_TASK_COUNT")


def _pair(index: str, count: str) -> Callable[[Mapping[str, str]], tuple[Shard, str]]:
    return lambda env: ((_integer(env, index), _integer(env, count)), f"{index}/{count}")


# Checked in this order: an array task also carries its one-task job's SLURM_PROCID/NTASKS, and
# torchrun inside a Slurm job splits the work by its own ranks.
SCHEDULERS: tuple[tuple[str, Callable[[Mapping[str, str]], tuple[Shard, str]]], ...] = (
    ("SLURM_ARRAY_TASK_ID", _slurm_array),
    ("WORLD_SIZE", _pair("RANK", "WORLD_SIZE")),
    ("SLURM_NTASKS", _pair("SLURM_PROCID", "SLURM_NTASKS")),
)


def shard_from_environment(env: Mapping[str, str]) -> tuple[Shard, str | None]:
    """This process's shard and the variables it came from; (0, 1) and None outside any scheduler."""
    for marker, read in SCHEDULERS:
        if marker in env:
            (index, count), source = read(env)
            if not 0 <= index < count:
                raise BamctlError(f"--shard auto: {source} gives shard {index}/{count}, outside 0 <= I < N")
            return (index, count), source
    return (0, 1), None


def shard_option(text: str | None, env: Mapping[str, str], *, say: Callable[[str], None]) -> Shard:
    """The shard ``--shard`` asks for; ``auto`` says in one line where it found it."""
    if text != AUTO:
        return parse_shard(text)
    (index, count), source = shard_from_environment(env)
    if source is None:
        say("--shard auto: no Slurm array, Slurm tasks or torchrun in the environment; running the whole sweep (shard 0/1)")
    else:
        say(f"--shard auto: shard {index}/{count} (from {source})")
    return index, count
