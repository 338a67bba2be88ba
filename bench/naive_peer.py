"""Our streaming engine against the naive peer a user would write: eager attention with a
materialised n x n bias over the whole sequence in one forward (what transformers' eager
attention does), on the same model and the same prompts.

For doubling lengths each side runs in a child process capped at --memory-gib of
address space; a side stops at its first failure (out of memory). Reported: seconds
and peak RSS per length, the speed ratio where both run, and the longest length each
reaches.

    python bench/naive_peer.py --max-length 128k --memory-gib 22
"""

from __future__ import annotations

import argparse
import sys

from _common import default_model, run_measured

from bamctl.lengths import parse_lengths

CHILD = """
import sys, time, torch
from bamctl.catalog import resolve_model
from bamctl.engine.stream import StreamingEngine
from bamctl.tasks import generate_samples
from bamctl.tokenizer import get_tokenizer
path, length, side = sys.argv[1], int(sys.argv[2]), sys.argv[3]
model = resolve_model(path).model.eval()
sample = next(iter(generate_samples("passkey", [length], 1, 0, get_tokenizer("gpt2"), [0.5])))
ids = sample.input_ids + sample.target_ids
# naive: one dense forward over the whole sequence (n x n logits per head)
engine = StreamingEngine(model, device="cpu", dtype="float32",
                         chunk_size=len(ids) if side == "naive" else 2048,
                         attention="dense" if side == "naive" else "auto")
start = time.perf_counter()
engine.score_continuation(sample.input_ids, sample.target_ids)
print(f"{time.perf_counter() - start:.3f}")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--min-length", default="1k")
    parser.add_argument("--max-length", default="128k")
    parser.add_argument("--memory-gib", type=float, default=22.0)
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    model = args.model or default_model()
    limit = int(args.memory_gib * 2**30)
    lengths = parse_lengths(f"{args.min_length}..{args.max_length}")
    print(f"model {model}; each run capped at {args.memory_gib:g} GiB of address space; CPU, float32")
    print(f"{'length':>8} | {'ours s':>8} | {'ours MiB':>8} | {'naive s':>8} | {'naive MiB':>9} | {'naive / ours time':>17}")
    alive = {"ours": True, "naive": True}
    longest = {"ours": 0, "naive": 0}
    for length in lengths:
        cells = {}
        for side in ("ours", "naive"):
            if not alive[side]:
                cells[side] = None
                continue
            code, wall, peak, tail = run_measured([sys.executable, "-c", CHILD, model, str(length), side], memory_limit_bytes=limit)
            if code != 0:
                alive[side] = False
                cells[side] = None
                continue
            longest[side] = length
            cells[side] = (float(tail), peak)
        ours, naive = cells["ours"], cells["naive"]
        fmt = lambda c, i, spec: format(c[i] if i == 0 else c[i] / 2**20, spec) if c else "OOM".rjust(8)
        ratio = f"{naive[0] / ours[0]:>17.2f}" if ours and naive else " " * 17
        print(f"{length:>8} | {fmt(ours, 0, '>8.2f')} | {fmt(ours, 1, '>8.0f')} | {fmt(naive, 0, '>8.2f')} | {fmt(naive, 1, '>9.0f')} | {ratio}", flush=True)
        if not any(alive.values()):
            break
    print(f"longest length reached: ours {longest['ours']:,}, naive {longest['naive']:,} (within {args.memory_gib:g} GiB)")


if __name__ == "__main__":
    main()
