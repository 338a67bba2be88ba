"""End-to-end passkey sweep: tokens per second, and where the time goes.

Splits each sample's time into prompt building (the task generator) and the model
(one streamed teacher-forced pass: prefill plus scoring the 5 answer positions).

    python bench/passkey_sweep.py --lengths 128..8k --samples 4
"""

from __future__ import annotations

import argparse
import time

import torch
from _common import default_model

from bamctl.catalog import resolve_model
from bamctl.engine.stream import StreamingEngine
from bamctl.lengths import parse_lengths
from bamctl.tasks import generate_samples
from bamctl.tokenizer import get_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="128..8k")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--model", default=None)
    parser.add_argument("--attention", default="auto")
    args = parser.parse_args()
    path = args.model or default_model()
    engine = StreamingEngine(resolve_model(path).model, device="cpu", attention=args.attention)
    tokenizer = get_tokenizer("gpt2")
    print(f"model {path}, {torch.get_num_threads()} threads, attention {args.attention}, 5 depths x {args.samples} samples per length")
    print(f"{'length':>7} | {'samples':>7} | {'build s':>8} | {'model s':>8} | {'build %':>7} | {'tokens/s':>9}")
    total_tokens = total_build = total_model = 0.0
    for length in parse_lengths(args.lengths):
        build = model = 0.0
        count = 0
        start = time.perf_counter()
        for sample in generate_samples("passkey", [length], args.samples, 0, tokenizer):
            build += time.perf_counter() - start
            start = time.perf_counter()
            engine.score_continuation(sample.input_ids, sample.target_ids)
            model += time.perf_counter() - start
            count += 1
            start = time.perf_counter()
        tokens = count * length
        total_tokens, total_build, total_model = total_tokens + tokens, total_build + build, total_model + model
        print(f"{length:>7} | {count:>7} | {build:>8.2f} | {model:>8.2f} | {100 * build / (build + model):>6.1f}% | {tokens / (build + model):>9,.0f}")
    print(f"{'all':>7} | {'':>7} | {total_build:>8.2f} | {total_model:>8.2f} | {100 * total_build / (total_build + total_model):>6.1f}% | {total_tokens / (total_build + total_model):>9,.0f}")


if __name__ == "__main__":
    main()
