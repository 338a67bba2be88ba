"""bfloat16 against float32 on this CPU: every figure beside its float32, from one run.

``--dtype bfloat16`` keeps the weights and the KV cache in bfloat16; attention computes in float32
on the cache's values (docs/engine.md, "bfloat16"). This script says what that buys here:

1. **The machine**: torch's ``mm`` of two 4096 x 4096 matrices in each dtype (what the CPU's
   bfloat16 units give a large product), and ``torch.exp`` per element.
2. **Attention alone**, on ``bam-ssmax``'s first layer's prior and SSMax (4 heads; head sizes 32,
   its own, and 64), random queries, keys and values (seed 0) in each dtype: at 16k the whole
   prompt streamed in chunks of 2,048 queries as the engine runs it, at 64k its last chunk (2,048
   queries against every key). Our paths dense (``--block-skip off``) and native with skipping;
   torch's SDPA (no prior: a peer's rate on the same shapes, causal; 64k's chunk with a mask).
   GFLOP/s count 4 Dh operations per causal pair (dense rows: every pair).
3. **What a pair costs beyond its products** in each dtype: the native kernel's ns per causal
   pair at head sizes 16-128 fitted to ``fixed + per_dim x Dh`` (as ``bench/roofline.py``'s
   table 2): ``fixed`` (prior, SSMax, running max, exponential, sum) is what no faster product
   can win back.
4. **Whole requests**: one passkey prompt on ``bam-ssmax`` (depth 0.5, seed 0) through its
   back-end in each dtype: seconds of the request and whether the predicted key is the same.
5. **Memory of one call**: the native kernel on the last chunk of a 512k prompt (4 heads of 32,
   one layer's bfloat16 cache), given the cache as stored or as a float32 copy of it (what the
   engine passed before the kernel read bfloat16): the peak resident memory the call adds, each
   in a fresh process.
6. **Training**: the ``bam-ssmax`` recipe's own steps (its model, batches, optimiser, seed) in
   float32 and under ``torch.autocast("cpu", torch.bfloat16)`` (float32 weights and optimiser;
   the products in bfloat16): tokens per second, best of the timed steps after one untimed, and
   the losses of the same steps side by side.

    python bench/bfloat16.py                           # every table: 16k and 64k, requests at 64k (~10 minutes)
    python bench/bfloat16.py --requests ''             # no whole requests
    python bench/bfloat16.py --lengths '' --pair-length '' --requests ''   # tables 1, 5 and 6 only
    python bench/bfloat16.py --requests 64k,512k       # the 512k prompt too (native with skipping; about 20 minutes more)

The load average is printed before and after: the figures mean something only on an idle machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from roofline import CHUNK, HEADS, MODEL, _label, _length, best_seconds, causal_pairs, fit_line, gflops, model_layers

DTYPES = (torch.float32, torch.bfloat16)
NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


def mm_rate(dtype: torch.dtype, n: int = 4096) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    out = torch.empty(n, n, dtype=dtype)
    return 2 * n ** 3 / best_seconds(lambda: torch.mm(a, b, out=out), 3) / 1e9


def exp_ns(dtype: torch.dtype, n: int = 1 << 20, calls: int = 200) -> float:
    x, out = (torch.randn(n) - 5).to(dtype), torch.empty(n, dtype=dtype)
    return best_seconds(lambda: [torch.exp(x, out=out) for _ in range(calls)], 5) / calls / n * 1e9


def _inputs(layer, q_start: int):
    from bamctl.attention_math import AttentionInputs

    return AttentionInputs(q_start=q_start, bias_table=layer.table, ssmax_scale=layer.ssmax_scale,
                           ssmax_bias=layer.ssmax_bias, ssmax_scope=layer.scope)


def attention_seconds(path: str, mode: str, dtype: torch.dtype, dim: int, length: int, whole: bool, layer, repeats: int) -> float:
    """Seconds of one path over the prompt's chunks (``whole``) or its last chunk."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, length, dim).to(dtype) for _ in range(3))
    starts = range(0, length, CHUNK) if whole else [length - CHUNK]
    if path == "sdpa":
        import torch.nn.functional as F

        if whole:
            run = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
        else:
            start = length - CHUNK
            mask = torch.arange(length)[None, :] <= torch.arange(start, length)[:, None]  # (chunk, keys)
            run = lambda: F.scaled_dot_product_attention(q[:, :, start:], k, v, attn_mask=mask)  # noqa: E731
    else:
        from bamctl.engine.stream import kernel_for

        kernel = kernel_for(path, mode)

        def run():
            for start in starts:
                stop = min(start + CHUNK, length)
                kernel(q[:, :, start:stop], k[:, :, :stop], v[:, :, :stop], _inputs(layer, start))

    with torch.inference_mode():
        return best_seconds(run, repeats)


def pair_ns(dtype: torch.dtype, length: int, dims: list[int], layer, repeats: int) -> list[tuple[int, float]]:
    """(head size, ns per causal pair) of the native kernel, dense, over the whole prompt."""
    return [(dim, attention_seconds("native", "off", dtype, dim, length, True, layer, repeats)
             / (HEADS * causal_pairs(0, length)) * 1e9) for dim in dims]


def request(length: int, dtype: str, attention: str, mode: str) -> tuple[float, list[int]]:
    """Seconds of one passkey request on MODEL and its predicted key's tokens (one untimed warm-up chunk first)."""
    from bamctl.backends import open_backend
    from bamctl.backends.base import RunOptions
    from bamctl.tasks import generate_samples

    backend = open_backend(MODEL, RunOptions(attention=attention, block_skip=mode, dtype=dtype))
    sample = next(iter(generate_samples("passkey", [length], 1, 0, backend.tokenizer, [0.5],
                                        scored_tokens=backend.scored_tokens, bos_for=backend.bos_for)))
    backend.score_continuation(sample.input_ids[:2048], sample.answer_ids)
    start = time.perf_counter()
    answer = backend.score_continuation(sample.input_ids, sample.answer_ids).predicted_ids
    return time.perf_counter() - start, answer


MEMORY_CHILD = """
import math, resource, sys, torch
from bamctl.engine.native import _extension
length, chunk, heads, dim = int(sys.argv[1]), 2048, 4, 32
k, v = (torch.randn(1, heads, length, dim, dtype=torch.bfloat16) for _ in range(2))
q, line = torch.randn(1, heads, chunk, dim) / math.sqrt(dim), torch.zeros(heads, length)
kernel = _extension()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
keys, values = (k.float(), v.float()) if sys.argv[2] == "copy" else (k, v)
kernel.bam_attention(q, keys, values, line, None, length - chunk, True)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


def call_memory(length: int, given: str) -> int:
    """Bytes of peak resident memory one native call adds (``given``: ``stored`` or ``copy``)."""
    import subprocess

    done = subprocess.run([sys.executable, "-c", MEMORY_CHILD, str(length), given], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1])


def train_steps(recipe_name: str, steps: int, autocast: bool) -> tuple[float, list[float]]:
    """Tokens per second (the best step after the first) and the losses of ``steps`` steps of the
    recipe, each the training loop's own step (its learning rate, micro-batches, clipping)."""
    from bamctl.train.loop import _cpu_threads, _step, make_optimizer, prepare
    from bamctl.train.recipe import load_recipe, recipe_path

    recipe = load_recipe(recipe_path(recipe_name))
    setup = prepare(recipe, device="cpu")
    optimizer = make_optimizer(setup.trainee, recipe)
    context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else None
    tokens = recipe.train.batch_size * (setup.batches.row_tokens() - 1) * recipe.train.grad_accum  # inputs per step
    best, losses = float("inf"), []
    with _cpu_threads(setup.device, recipe.train.cpu_threads):
        setup.model.train()
        for step in range(steps):
            start = time.perf_counter()
            losses.append(_step(setup, optimizer, step, context))
            if step > 0:
                best = min(best, time.perf_counter() - start)
    return tokens / best, losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="16k,64k", help="table 2's lengths (default 16k,64k)")
    parser.add_argument("--whole-max", default="16k", help="longer lengths are timed on their last chunk alone")
    parser.add_argument("--dims", default="32,64", help="table 2's head sizes")
    parser.add_argument("--pair-length", default="8k", help="table 3's length ('' for no table 3)")
    parser.add_argument("--requests", default="64k", help="table 4's prompt lengths ('' for none)")
    parser.add_argument("--memory-length", default="512k", help="table 5's context ('' for no table 5)")
    parser.add_argument("--train-steps", type=int, default=6, help="table 6's steps of the recipe (0: no table 6)")
    parser.add_argument("--repeats", type=int, default=2, help="timed calls per figure, the best counts")
    args = parser.parse_args()
    lengths = [_length(x) for x in args.lengths.split(",") if x]
    whole_max = _length(args.whole_max)

    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} CPUs, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}; command: {' '.join(sys.argv)}", flush=True)

    rates = {dtype: mm_rate(dtype) for dtype in DTYPES}
    print("\n| the machine | float32 | bfloat16 | bfloat16 / float32 |\n|---|---:|---:|---:|")
    print(f"| `torch.mm` 4096³, GFLOP/s | {rates[torch.float32]:.1f} | {rates[torch.bfloat16]:.1f} | "
          f"{rates[torch.bfloat16] / rates[torch.float32]:.2f}× |")
    exps = {dtype: exp_ns(dtype) for dtype in DTYPES}
    print(f"| `torch.exp`, 1M elements, ns / element | {exps[torch.float32]:.3f} | {exps[torch.bfloat16]:.3f} | "
          f"{exps[torch.float32] / exps[torch.bfloat16]:.2f}× faster |", flush=True)

    layer = model_layers(MODEL, max(lengths + [_length(args.pair_length or "1k")]))[0]
    if lengths:
        print(f"\nattention alone: {MODEL}'s first layer's prior and SSMax, {HEADS} heads, chunks of {CHUNK}; "
              f"lengths past {_label(whole_max)}: their last chunk alone; speed = float32 seconds / bfloat16 seconds")
        print("\n| length | head size | path | block skip | float32 s | bfloat16 s | speed | bfloat16 GFLOP/s | "
              "of SDPA's bfloat16 rate |\n|---|---:|---|---|---:|---:|---:|---:|---:|")
    paths = [("sdpa", "-"), ("native", "off"), ("native", "auto"), ("blockwise", "off"), ("flex", "off")]
    for length in lengths:
        whole = length <= whole_max
        pairs = HEADS * (causal_pairs(0, length) if whole else causal_pairs(length - CHUNK, CHUNK))
        for dim in [int(x) for x in args.dims.split(",")]:
            sdpa_rate = None
            for path, mode in paths:
                seconds = {dtype: attention_seconds(path, mode, dtype, dim, length, whole, layer, args.repeats)
                           for dtype in DTYPES}
                rate = gflops(pairs, dim, seconds[torch.bfloat16])
                sdpa_rate = sdpa_rate or rate
                dense = "" if mode == "auto" else f"{rate:.1f}"
                where = _label(length) if whole else f"{_label(length)} (last chunk)"
                print(f"| {where} | {dim} | {path} | {mode} | {seconds[torch.float32]:.3f} | {seconds[torch.bfloat16]:.3f} | "
                      f"{seconds[torch.float32] / seconds[torch.bfloat16]:.2f}× | {dense} | "
                      f"{'' if mode == 'auto' else f'{rate / sdpa_rate:.0%}'} |", flush=True)

    if args.pair_length:
        pair_length = _length(args.pair_length)
        print(f"\nnative, dense, {_label(pair_length)}: ns per causal pair by head size, fitted to fixed + per_dim x Dh")
        print("\n| dtype | Dh 16 | Dh 32 | Dh 64 | Dh 128 | fixed ns | per_dim ns | products GFLOP/s | fixed's share at 32 |"
              "\n|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for dtype in DTYPES:
            points = pair_ns(dtype, pair_length, [16, 32, 64, 128], layer, args.repeats)
            fixed, per_dim = fit_line(points)
            at32 = dict(points)[32]
            print(f"| {NAMES[dtype]} | {' | '.join(f'{ns:.3f}' for _, ns in points)} | {fixed:.3f} | {per_dim:.4f} | "
                  f"{4 / per_dim:.1f} | {fixed / at32:.0%} |", flush=True)

    requests = [_length(x) for x in args.requests.split(",") if x]
    if requests:
        print(f"\nwhole requests: one passkey prompt on {MODEL}, seconds; speed = float32 / bfloat16")
        print("\n| length | attention | block skip | float32 s | bfloat16 s | speed | predicted key |\n|---|---|---|---:|---:|---:|---|")
    for length in requests:
        cases = [("native", "off"), ("native", "auto"), ("blockwise", "off")] if length <= 65536 else [("native", "auto")]
        for attention, mode in cases:
            (f32, f32_key), (bf16, bf16_key) = (request(length, dtype, attention, mode) for dtype in ("float32", "bfloat16"))
            same = "same" if f32_key == bf16_key else "DIFFERS"
            print(f"| {_label(length)} | {attention} | {mode} | {f32:.2f} | {bf16:.2f} | {f32 / bf16:.2f}× | {same} |", flush=True)
    if args.memory_length:
        length = _length(args.memory_length)
        cache = 2 * HEADS * length * 32 * 2  # keys and values, bfloat16
        print(f"\nmemory of one native call, last chunk of {_label(length)}, one layer's bfloat16 cache ({cache / 2**20:.0f} MiB)")
        print("\n| the kernel is given | peak memory the call adds |\n|---|---:|")
        for given, label in (("stored", "the bfloat16 cache as stored"), ("copy", "a float32 copy (before)")):
            print(f"| {label} | {call_memory(length, given) / 2**20:.0f} MiB |", flush=True)
    if args.train_steps:
        print(f"\ntraining: the {MODEL} recipe's first {args.train_steps} steps, tokens per second (best step after the first)")
        print("\n| precision | tokens / s | losses |\n|---|---:|---|")
        for label, autocast in (("float32", False), ("autocast bfloat16", True)):
            rate, losses = train_steps(MODEL, args.train_steps, autocast)
            print(f"| {label} | {rate:,.0f} | {' '.join(f'{x:.4f}' for x in losses)} |", flush=True)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
