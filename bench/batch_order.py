"""Runs that span seeds or documents, before and after the plan lists each length's samples together.

The same bamctl commands, each in a process of its own, on this checkout and on another source
tree (``--before``: a checkout of an earlier commit, e.g. ``git worktree add /tmp/before 0906855``),
alternating, ``--repeats`` times each. Every run recomputes (``--force``, a fresh results folder);
the table gives the seconds the rows took (the sum of their ``seconds``, the engine's time, start-up
left out), the number of batches (the rows of one batch share its tokens_per_s) and the rows' scores, which must agree.

    OMP_NUM_THREADS=1 python bench/batch_order.py --before /tmp/before --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

COMMANDS = {  # the two the trust issue measured: seeds outermost, and a document before the length
    "passkey rope, 2 seeds": ["passkey", "rope", "--lengths", "128,256", "--seed", "0,1", "--samples", "2"],
    "ppl lm-bam, 4 documents": ["ppl", "lm-bam", "--lengths", "256,512", "--seed", "5", "--samples", "4"],
    "passkey rope, 8 seeds": ["passkey", "rope", "--lengths", "128,256,512", "--seed", "0,1,2,3,4,5,6,7", "--samples", "2"],
    "ppl lm-bam, 16 documents": ["ppl", "lm-bam", "--lengths", "256,512,1k", "--seed", "5", "--samples", "16"],
}


def one_run(tree: Path, args: list[str]) -> tuple[float, int, float]:
    """(the rows' seconds, their batches, their mean score or NLL) of one run on ``tree``'s code."""
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        subprocess.run([sys.executable, "-m", "bamctl", *args, "--device", "cpu", "--force", "--quiet", "--dir", out],
                       check=True, capture_output=True, cwd=tree, env=env)
        rows = pd.read_parquet(out)
        batches = rows["tokens_per_s"].nunique()  # a batch's rows share its throughput
    value = rows["nll"].sum() if "nll" in rows and rows["nll"].notna().any() else rows["score"].mean()
    return float(rows["seconds"].sum()), int(batches), float(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="a source tree of the earlier code")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": Path(__file__).resolve().parents[1]}
    print("| run | code | batches | seconds (median) | value |")
    print("|---|---|---|---|---|")
    for label, command in COMMANDS.items():
        measured = {name: [] for name in trees}
        for _ in range(args.repeats):
            for name, tree in trees.items():
                measured[name].append(one_run(tree, command))
        for name, runs in measured.items():
            seconds = statistics.median(r[0] for r in runs)
            print(f"| {label} | {name} | {runs[0][1]} | {seconds:.3f} | {runs[0][2]:.6g} |")
        before, after = (statistics.median(r[0] for r in measured[n]) for n in ("before", "after"))
        same = len({round(r[2], 9) for runs in measured.values() for r in runs}) == 1
        print(f"| {label} | after / before | | {after / before:.2f} | {'same values' if same else 'VALUES DIFFER'} |")


if __name__ == "__main__":
    main()
