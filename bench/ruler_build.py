"""Benchmark: build one 128k-token prompt of RULER's vt, cwe and fwe against NIAH's, in one run.

Not a test. Issue 14 asks what the new tasks cost to build next to the NIAH prompt of
the same length. Every task is built under both sizings with the GPT-2 tokenizer:
"first" is the first sample of the run (it also fills the caches a run fills once: the
essay's token counts, RULER's once-per-length search, vt's one-shot example); "warm" is
the median of the next samples (other indices, so other draws). The ratio is each
task's warm build over niah_single_1's (noise haystack) under the same sizing.

Usage: python bench/ruler_build.py [--length 131072] [--repeats 5] [--tasks vt,cwe,fwe]
"""

from __future__ import annotations

import argparse
import statistics
import time

from bamctl.tasks import plan_samples
from bamctl.tokenizer import get_tokenizer

BASELINE = "niah_single_1"


def timed_builds(task: str, length: int, repeats: int, sizing: str, tokenizer) -> tuple[float, float, int]:
    """(first build, median of the warm ones, mean prompt tokens) in seconds."""
    plan = plan_samples(task, [length], repeats + 1, [0], tokenizer, sizing=sizing)
    seconds, tokens = [], []
    for slot in plan.slots:
        start = time.perf_counter()
        sample = plan.build(slot)
        seconds.append(time.perf_counter() - start)
        tokens.append(sample.n_tokens)
        assert sample.n_tokens + sample.max_new_tokens <= length
    return seconds[0], statistics.median(seconds[1:]), round(statistics.mean(tokens))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=131_072)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tasks", default="niah_single_2,vt,cwe,fwe", help=f"compared with {BASELINE}, always built first")
    args = parser.parse_args()

    tokenizer = get_tokenizer("gpt2")
    tasks = [BASELINE] + [t for t in args.tasks.split(",") if t and t != BASELINE]
    print(f"one prompt of {args.length:,} tokens (GPT-2), first build and median of {args.repeats} warm builds")
    print(f"{'task':<16} {'sizing':<7} {'tokens':>9} {'first s':>9} {'warm s':>9} {'x ' + BASELINE:>18}")
    for sizing in ("exact", "ruler"):
        baseline = None
        for task in tasks:
            first, warm, tokens = timed_builds(task, args.length, args.repeats, sizing, tokenizer)
            baseline = warm if baseline is None else baseline
            print(f"{task:<16} {sizing:<7} {tokens:>9,} {first:>9.3f} {warm:>9.3f} {warm / baseline:>18.2f}")


if __name__ == "__main__":
    main()
