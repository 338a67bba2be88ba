"""Passkey from 1k to 512k tokens on an l12-sized random BAM+SSMax model, against the FLOP floor.

For a GPU machine (prepared by scripts/gpu_bench.sh). Per length: seconds for one
teacher-forced passkey sample (prefill of the whole prompt through the streaming
engine) and the floor set by arithmetic alone,

    FLOPs = layers * 2 * n^2 * d        (QK^T and PV, causal halves 4 n^2 d)
          + 2 * n * P_nonembedding      (the weights' matmuls)

divided by the card's dense bf16 peak (--peak-tflops, H200/H100 SXM: ~790-990).

    python bench/gpu_passkey.py --max-length 512k --peak-tflops 790
"""

from __future__ import annotations

import argparse
import time

import torch

from bamctl.checkpoint import new_random_model
from bamctl.engine.stream import StreamingEngine
from bamctl.lengths import parse_lengths
from bamctl.model import ModelConfig
from bamctl.tasks import generate_samples
from bamctl.tokenizer import get_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="1k..512k")
    parser.add_argument("--preset", default="l12")
    parser.add_argument("--chunk-size", type=int, default=8192)
    parser.add_argument("--attention", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--peak-tflops", type=float, default=790.0)
    args = parser.parse_args()

    config = ModelConfig.from_preset(args.preset, "bam-ssmax", train_length=512)
    model = new_random_model(config, seed=0)
    engine = StreamingEngine(model, chunk_size=args.chunk_size, attention=args.attention, dtype=args.dtype)
    tokenizer = get_tokenizer("gpt2")
    embed = 2 * config.vocab_size * config.dim
    dense_params = model.n_params() - embed
    print(f"{args.preset}: {model.n_params():,} parameters, device {engine.device}, {engine.dtype}, attention {engine.attention}, chunk {args.chunk_size}")
    print(f"{'length':>8} | {'seconds':>8} | {'floor s':>8} | {'x floor':>7} | {'tok/s':>10} | {'peak GiB':>8}")
    for length in parse_lengths(args.lengths):
        sample = next(iter(generate_samples("passkey", [length], 1, 0, tokenizer, [0.5])))
        engine.check_fits(length + 16)
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        engine.score_continuation(sample.input_ids[:2048], sample.target_ids)  # warm-up / compile small shapes
        start = time.perf_counter()
        engine.score_continuation(sample.input_ids, sample.target_ids)
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        n = length
        flops = config.n_layers * 2 * n * n * config.dim + 2 * n * dense_params
        floor = flops / (args.peak_tflops * 1e12)
        peak = torch.cuda.max_memory_allocated() / 2**30 if engine.device.type == "cuda" else float("nan")
        print(f"{n:>8} | {seconds:>8.2f} | {floor:>8.3f} | {seconds / floor:>7.1f} | {n / seconds:>10,.0f} | {peak:>8.1f}", flush=True)


if __name__ == "__main__":
    main()
