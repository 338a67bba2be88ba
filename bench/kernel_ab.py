"""Two builds of the native kernel side by side: seconds, GFLOP/s and whether they agree bit for bit.

For work on ``bamctl/engine/csrc/bam_attention.cpp`` or its compiler flags. Every configuration is
built into a folder of its own under the build root (``$TORCH_EXTENSIONS_DIR`` or torch's
``~/.cache/torch_extensions``), named ``bamctl_attention_<digest>``; a build of the checkout as it
is comes from loading the kernel once:

    python -c "from bamctl.engine.native import native_available; native_available()"

Change the source or the flags, load it again, and compare the two folders:

    python bench/kernel_ab.py bamctl_attention_<shipped digest> bamctl_attention_<changed digest>
    python bench/kernel_ab.py A B --length 64k --head-dims 32 --repeats 2
    python bench/kernel_ab.py A B --kv-dtype bfloat16     # a bfloat16 KV cache (builds that take one)

Both builds get the same inputs (random queries, keys and values, seed 0; a GGD prior with heads from
beta = -0.5 to 1; SSMax over scores and prior, c_h(i) = 0.3 log(i + 1)), streamed in chunks of
2,048 queries as the engine runs a prompt, dense and with certified skipping. The builds alternate,
best of ``--repeats`` each, so the machine's load falls on both alike.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import time
from pathlib import Path

import torch

CHUNK = 2048
HEADS = 4


def load_build(name: str):
    """The compiled module in build folder ``name`` (a folder name under the build root, or a path)."""
    from torch.utils.cpp_extension import LIB_EXT

    from bamctl.engine.native import build_root

    folder = Path(name) if os.sep in name else build_root() / name
    library = folder / f"{folder.name}{LIB_EXT}"
    if not library.is_file():
        raise SystemExit(f"no built kernel at {library}")
    spec = importlib.util.spec_from_file_location(folder.name, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stream(module, q, k, v, table, skip: bool) -> torch.Tensor:
    """The kernel's output over every chunk of the sequence, as the engine calls it."""
    from bamctl.engine.attention import prior_line

    heads, length, dim = q.shape[1], q.shape[2], q.shape[3]
    outs = []
    for start in range(0, length, CHUNK):
        stop = min(start + CHUNK, length)
        line = prior_line(table, stop - 1, stop).float().contiguous()
        factor = (0.3 * torch.log(torch.arange(start + 1, stop + 1, dtype=torch.float32)))[None].expand(heads, -1)
        out, _lse, _counts = module.bam_attention(q[:, :, start:stop] / math.sqrt(dim), k[:, :, :stop], v[:, :, :stop],
                                                  line, factor.contiguous(), start, skip)
        outs.append(out)
    return torch.cat(outs, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", help="the first build's folder (the peer)")
    parser.add_argument("b", help="the second build's folder")
    parser.add_argument("--length", default="16k")
    parser.add_argument("--head-dims", default="32,64")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kv-dtype", choices=("float32", "bfloat16"), default="float32",
                        help="the keys' and values' dtype as the kernel is given them (queries stay float32)")
    args = parser.parse_args()

    from bamctl.lengths import parse_lengths
    from bamctl.positional import GGDPrior

    builds = {"a": load_build(args.a), "b": load_build(args.b)}
    length = parse_lengths(args.length)[0]
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; a = {args.a}, b = {args.b}; {length} tokens, {HEADS} heads, "
          f"keys and values {args.kv_dtype}")
    print("\n| head size | block skip | a s | b s | a GFLOP/s | b GFLOP/s | b / a time | outputs |\n|---:|---|---:|---:|---:|---:|---:|---|")
    prior = GGDPrior(HEADS, init="alibi")
    with torch.no_grad():
        prior.theta_beta.copy_(torch.linspace(-0.5, 1.0, HEADS))
        table = prior.distance_table(length)
    pairs = HEADS * length * (length + 1) / 2  # causal pairs; dense, both compute them all
    for dim in (int(x) for x in args.head_dims.split(",")):
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, HEADS, length, dim) for _ in range(3))
        k, v = k.to(getattr(torch, args.kv_dtype)), v.to(getattr(torch, args.kv_dtype))
        for skip in (False, True):
            best, outs = {}, {}
            for name, module in builds.items():  # untimed first calls
                outs[name] = stream(module, q, k, v, table, skip)
            for _ in range(args.repeats):
                for name, module in builds.items():
                    start = time.perf_counter()
                    stream(module, q, k, v, table, skip)
                    best[name] = min(best.get(name, float("inf")), time.perf_counter() - start)
            same = "identical" if torch.equal(outs["a"], outs["b"]) else \
                f"differ, max {float((outs['a'] - outs['b']).abs().max()):.1e}"
            rate = {name: 4 * dim * pairs / seconds / 1e9 for name, seconds in best.items()}
            print(f"| {dim} | {'auto' if skip else 'off'} | {best['a']:.3f} | {best['b']:.3f} | {rate['a']:.1f} | "
                  f"{rate['b']:.1f} | {best['b'] / best['a']:.2f} | {same} |", flush=True)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}  "
          "(with skipping, GFLOP/s counts every causal pair: compare the two builds, not the rates)")


if __name__ == "__main__":
    main()
