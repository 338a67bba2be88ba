"""Where the main job's time goes: prompt generation, the model, writing rows, and the rest.

Runs the two comparisons of ``scripts/main.sh``, read from it (the nine passkey references at 128 to
8k, 35 keys a cell, chunks of 1,024; the six language-model references on perplexity at 256 to 4k, 9
documents), through the Python API into a fresh folder, so that every sample is computed, as ``main.sh --force``
does, with timers around:

- **prompts**: planning a request and building its samples (``TaskRequest.plan``, ``TaskPlan.build``:
  the haystack, the needle, tokenization);
- **model**: the back-end answering them (``bamctl.answers.ANSWERS``: every forward pass);
- **rows**: writing them (``ResultStore.append``, ``merge``, ``supersede``);
- **other**: everything else (opening each model, the checks before any work, reading the store,
  the summary and its statistics).

It prints, per comparison, the tokens fed (the samples' prompt tokens), the seconds of each part, and
tokens per second of the whole and of the model alone, so that the slowest part of what a user
waits for is named. The plots are not drawn.

    python bench/pipeline.py                     # both comparisons (about 3 minutes on 2 cores)
    python bench/pipeline.py --task passkey --models bam-ssmax,rope
"""

from __future__ import annotations

import argparse
import functools
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

MAIN_SH = Path(__file__).resolve().parent.parent / "scripts" / "main.sh"
# main.sh's compare options -> the API's keywords; --dir and --plot are this bench's own choice
OPTIONS = {"--lengths": ("lengths", str), "--chunk-size": ("chunk_size", int), "--depths": ("depths", str),
           "--seed": ("seeds", str), "--samples": ("samples", int)}


def main_job() -> dict[str, dict]:
    """The comparisons ``scripts/main.sh`` runs, read from it: task -> models and the API's options."""
    text = MAIN_SH.read_text().replace("\\\n", " ")
    jobs = {}
    for line in text.splitlines():
        if "-m bamctl compare " not in line:
            continue
        words = shlex.split(line.split("-m bamctl compare ", 1)[1])
        flags = next(i for i, word in enumerate(words) if word.startswith("--"))
        models, options, task = words[:flags], {}, "passkey"
        for flag, value in zip(words[flags:], words[flags + 1:]):
            if flag == "--task":
                task = value
            elif flag in OPTIONS:
                name, kind = OPTIONS[flag]
                options[name] = kind(value)
        jobs[task] = dict(models=models, options=options)
    return jobs


class Timers:
    """Seconds per part, summed over calls; a call inside another timed one counts once, in the outer."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.tokens = 0
        self._depth = 0

    def wrap(self, part: str, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if self._depth:
                return fn(*args, **kwargs)
            self._depth += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[part] = self.seconds.get(part, 0.0) + time.perf_counter() - start
                self._depth -= 1

        return timed


def instrument(timers: Timers) -> None:
    """Put the timers around the functions of each part (for this process)."""
    from bamctl import answers, evaluation
    from bamctl.results.store import ResultStore
    from bamctl.tasks.registry import TaskPlan

    build = TaskPlan.build

    def counted_build(self, slot):
        sample = build(self, slot)
        timers.tokens += sample.n_tokens
        return sample

    TaskPlan.build = timers.wrap("prompts", counted_build)
    evaluation.TaskRequest.plan = timers.wrap("prompts", evaluation.TaskRequest.plan)
    for scoring, answer in list(answers.ANSWERS.items()):
        answers.ANSWERS[scoring] = timers.wrap("model", answer)
    for name in ("append", "merge", "supersede"):
        setattr(ResultStore, name, timers.wrap("rows", getattr(ResultStore, name)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=["passkey", "ppl", "both"], default="both")
    parser.add_argument("--models", default=None, help="comma list instead of the main job's models")
    args = parser.parse_args()

    import torch

    import bamctl

    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} CPUs, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads; command: {' '.join(sys.argv)}", flush=True)
    print("\n| comparison | tokens | seconds | prompts | model | rows | other | tokens/s | model's tokens/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    timers = Timers()
    instrument(timers)
    jobs = main_job()
    for task in (jobs if args.task == "both" else [args.task]):
        job = jobs[task]
        models = args.models.split(",") if args.models else job["models"]
        timers.seconds, timers.tokens = {}, 0
        with tempfile.TemporaryDirectory() as folder:
            start = time.perf_counter()
            bamctl.compare(models, task, dir=folder, quiet=True, **job["options"])
            total = time.perf_counter() - start
        parts = {part: timers.seconds.get(part, 0.0) for part in ("prompts", "model", "rows")}
        other = total - sum(parts.values())
        shares = " | ".join(f"{s:.1f} ({s / total:.0%})" for s in (*parts.values(), other))
        print(f"| {task}, {len(models)} models | {timers.tokens:,} | {total:.1f} | {shares} | "
              f"{timers.tokens / total:,.0f} | {timers.tokens / parts['model']:,.0f} |", flush=True)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
