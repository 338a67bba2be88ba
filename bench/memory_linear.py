"""Peak resident memory of `bamctl passkey` against context length: is it linear?

Each length runs `bamctl passkey MODEL --lengths L --samples 1 --depths 0.5` as a child
process and reads the child's peak RSS from the kernel. The ratio column is against
the shortest length; linear growth with a fixed base (Python, torch, weights) keeps
it well under the length ratio, and quadratic growth far over it.

    python bench/memory_linear.py                       # 8k, 32k, 128k with the shipped bam-ssmax
    python bench/memory_linear.py --lengths 8k,32k --model bamctl/data/baselines/rope
"""

from __future__ import annotations

import argparse
import sys
import tempfile

from _common import default_model, run_measured

from bamctl.lengths import parse_lengths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="8k,32k,128k")
    parser.add_argument("--model", default=None)
    parser.add_argument("--attention", default="auto")
    args = parser.parse_args()
    model = args.model or default_model()
    print(f"model {model}, attention {args.attention}, 1 sample per length, CPU")
    print(f"{'length':>8} | {'seconds':>8} | {'peak RSS MiB':>12} | {'RSS / first':>11} | {'length / first':>14}")
    first = None
    for length in parse_lengths(args.lengths):
        with tempfile.TemporaryDirectory() as out:
            cmd = [sys.executable, "-m", "bamctl", "passkey", model, "--lengths", str(length), "--samples", "1",
                   "--depths", "0.5", "--dir", out, "--quiet", "--attention", args.attention]
            code, seconds, peak, tail = run_measured(cmd)
        if code != 0:
            print(f"{length:>8} | failed ({code}): {tail}")
            continue
        first = first or (length, peak)
        print(f"{length:>8} | {seconds:>8.1f} | {peak / 2**20:>12.0f} | {peak / first[1]:>11.2f} | {length / first[0]:>14.0f}", flush=True)


if __name__ == "__main__":
    main()
