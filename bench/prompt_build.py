"""Benchmark: build one 512k-token passkey prompt vs one tiktoken encode of its text.

Not a test. Goal (issue 3): building takes < 1 s and < 3x the encode, measured in
the same run on the same machine. "build" is the whole sample: key draw, piece
tokenisation, token-level filler trim and the decode that produces the prompt
text. The first build also fills per-tokenizer caches (the filler's tokens), so
it is reported separately; the encode is tiktoken's ``encode_ordinary``, which is
what a text-first generator would have to run at least once.

Usage: python bench/prompt_build.py [--length 524288] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from bamctl.tasks import generate_samples
from bamctl.tokenizer import get_tokenizer


def build(tokenizer, length: int):
    (sample,) = generate_samples("passkey", [length], 1, 0, tokenizer, [0.5])
    return sample


def timed(function) -> tuple[float, object]:
    start = time.perf_counter()
    result = function()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=524_288)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    tokenizer = get_tokenizer("gpt2")
    first, sample = timed(lambda: build(tokenizer, args.length))
    builds, encodes = [], []
    for _ in range(args.repeats):
        seconds, sample = timed(lambda: build(tokenizer, args.length))
        builds.append(seconds)
        seconds, ids = timed(lambda: tokenizer.encode(sample.prompt))
        encodes.append(seconds)
    assert sample.n_tokens == args.length
    build_s, encode_s = statistics.median(builds), statistics.median(encodes)
    print(f"passkey prompt, {args.length:,} tokens (GPT-2), median of {args.repeats}")
    print(f"{'step':<42} {'seconds':>9} {'x encode':>9}")
    print(f"{'build sample (first, fills caches)':<42} {first:>9.3f} {first / encode_s:>9.2f}")
    print(f"{'build sample (warm)':<42} {build_s:>9.3f} {build_s / encode_s:>9.2f}")
    print(f"{'tiktoken encode of the final text':<42} {encode_s:>9.3f} {1:>9.2f}")
    print(f"encode of the text gives {len(ids):,} tokens (pieces tokenised separately give {sample.n_tokens:,})")
    verdict = "met" if first < 1.0 and first / encode_s < 3 else "NOT met"
    print(f"goal < 1 s and < 3x encode (first build): {verdict}")


if __name__ == "__main__":
    main()
