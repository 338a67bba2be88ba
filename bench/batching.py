"""Batches against one request at a time: passkey teacher-forced tokens per second.

For each model and length, the same passkey prompts (protocol ``exact``, 5 depths x
``--samples``, seed 0) go through the back-end twice, alternating, in the same process:
once one request per call (``--batch-size 1``), once in the batches ``--batch-size auto``
gives (``Backend.batch_limit``). Each side's figure is its best of ``--repeats`` passes over
all the prompts; both sides' answers are checked to be the same.

    OMP_NUM_THREADS=1 python bench/batching.py --models bam-ssmax,rope-ssmax --lengths 128,512,2k,8k
"""

from __future__ import annotations

import argparse
import time

import torch

from bamctl.backends import RunOptions, open_backend
from bamctl.lengths import parse_lengths
from bamctl.tasks import generate_samples


def passes(backend, requests, batch: int) -> tuple[float, list]:
    """Seconds to answer every request in batches of ``batch``, and the answers."""
    answers = []
    start = time.perf_counter()
    for lo in range(0, len(requests), batch):
        answers += backend.score_continuations(requests[lo : lo + batch])
    return time.perf_counter() - start, answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="bam-ssmax,rope-ssmax")
    parser.add_argument("--lengths", default="128,512,2k,8k")
    parser.add_argument("--samples", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--attention", default="native")
    parser.add_argument("--chunk-size", type=int, default=2048)
    args = parser.parse_args()
    print(f"{torch.get_num_threads()} threads, attention {args.attention}, chunk {args.chunk_size}, "
          f"5 depths x {args.samples} samples per length, best of {args.repeats}")
    print("| model | length | prompts | auto batch | B=1 tokens/s | auto tokens/s | auto / B=1 |")
    print("|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        backend = open_backend(name, RunOptions(device="cpu", attention=args.attention, chunk_size=args.chunk_size))
        for length in parse_lengths(args.lengths):
            samples = list(generate_samples("passkey", [length], args.samples, 0, backend.tokenizer, None, protocol="exact"))
            requests = [(s.input_ids, s.answer_ids) for s in samples]
            tokens = sum(len(p) + len(a) for p, a in requests)
            auto = backend.batch_limit(length, len(requests[0][1]))
            passes(backend, requests[:2], 1)  # warm-up: first calls fill caches and tables
            best = {1: float("inf"), auto: float("inf")}
            answers = {}
            for _ in range(args.repeats):
                for batch in (1, auto):
                    seconds, answers[batch] = passes(backend, requests, batch)
                    best[batch] = min(best[batch], seconds)
            same = all(a.predicted_ids == b.predicted_ids for a, b in zip(answers[1], answers[auto]))
            assert same, "batched answers differ from one at a time"
            one, many = tokens / best[1], tokens / best[auto]
            print(f"| {name} | {length} | {len(requests)} | {auto} | {one:,.0f} | {many:,.0f} | {many / one:.2f} |", flush=True)


if __name__ == "__main__":
    main()
