"""Passkey exact-match accuracy of checkpoints by length: a quick check while training baselines.

Teacher forcing (the authors' protocol): a sample is right when the argmax at all five
answer positions equals the key's digits. 5 depths x --samples per length and seed.

    python bench/passkey_check.py bamctl/data/baselines/bam bamctl/data/baselines/rope --lengths 128,512,2048,8192 --samples 4 --seeds 0
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="checkpoint directories")
    parser.add_argument("--lengths", default="128,512,2048,8192")
    parser.add_argument("--samples", type=int, default=4, help="samples per depth (5 depths)")
    parser.add_argument("--seeds", default="0", help="comma-separated evaluation seeds")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from bamctl.checkpoint import load_checkpoint
    from bamctl.engine.stream import StreamingEngine
    from bamctl.tasks import generate_samples
    from bamctl.tokenizer import get_tokenizer

    tokenizer = get_tokenizer("gpt2")
    lengths = [int(x) for x in args.lengths.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    print("model," + ",".join(str(n) for n in lengths) + ",n_per_cell,seconds")
    for path in args.models:
        engine = StreamingEngine(load_checkpoint(path).model, device="cpu", dtype="float32")
        began = time.perf_counter()
        cells = []
        for length in lengths:
            right = total = 0
            for seed in seeds:
                for sample in generate_samples("passkey", [length], args.samples, seed, tokenizer):
                    predicted, _ = engine.score_continuation(sample.input_ids, sample.target_ids)
                    right += predicted == sample.target_ids
                    total += 1
            cells.append(f"{right / total:.2f}")
        print(f"{path}," + ",".join(cells) + f",{total},{time.perf_counter() - began:.0f}", flush=True)


if __name__ == "__main__":
    main()
