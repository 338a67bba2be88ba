"""Two local shards against one process: the same passkey sweep, wall time and rows per second.

One process runs the sweep as `bamctl passkey`; then `bamctl submit --shards 2 --executor
local` runs it as two processes on this machine (each with its share of the cores) and
a third that prints the table. Each run writes a fresh results directory. The model's
own time is the sum of the rows' `seconds`; the rest of the wall time is starting
processes, importing torch, loading the model and (for submit) the table job.

    python bench/shards.py --lengths 512,1k,2k --samples 2
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from _common import default_model, run_measured

from bamctl.results.store import ResultStore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="512,1k,2k")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    model = args.model or default_model()
    sweep = ["passkey", model, "--lengths", args.lengths, "--samples", str(args.samples), "--device", "cpu", "--quiet"]
    bamctl = [sys.executable, "-m", "bamctl"]
    print(f"model {model}, {os.cpu_count()} cores, passkey --lengths {args.lengths} --samples {args.samples} (5 depths)")
    print(f"{'run':<24} | {'wall s':>7} | {'rows':>4} | {'rows/s':>6} | {'speed-up':>8} | {'model s':>7} | {'other s':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        runs = {
            "1 process": [*bamctl, *sweep, "--dir", f"{tmp}/one"],
            f"submit, {args.shards} local shards": [*bamctl, "submit", "--shards", str(args.shards), "--executor", "local",
                                                   "--logs", f"{tmp}/logs", "--", *sweep, "--dir", f"{tmp}/sharded"],
        }
        base = None
        for (name, command), out, parallel in zip(runs.items(), ("one", "sharded"), (1, args.shards)):
            code, wall, _, tail = run_measured(command)
            if code != 0:
                raise SystemExit(f"{name} failed ({code}): {tail}")
            rows = ResultStore(Path(tmp) / out).read()
            model_s = float(rows["seconds"].sum())
            base = base or wall
            print(f"{name:<24} | {wall:>7.1f} | {len(rows):>4} | {len(rows) / wall:>6.2f} | {base / wall:>7.2f}x | {model_s:>7.1f} | {wall - model_s / parallel:>7.1f}")
    print(f"ideal: {args.shards:.0f}x the rows/s of one process; 'model s' is summed over shards; they overlap in time, "
          f"so 'other s' is the wall time less 'model s' / {args.shards} for submit")


if __name__ == "__main__":
    main()
