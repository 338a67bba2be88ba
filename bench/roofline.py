"""How far bamctl's attention is from what this machine can do: a roofline, from one run.

Four tables, every figure from this process, on torch's threads:

1. **The machine**: torch's own float32 matrix product (``torch.mm`` of two 4096 x 4096
   matrices: the rate the BLAS reaches), the bandwidth of a large copy (1 GiB read and
   written), and torch's own float32 exponential and addition per element (``torch.exp``,
   ``torch.add`` over 1M floats, in cache): what one exponential costs on its own, beside
   table 2's cost of a pair. The matrix product is the roof every attention figure below is a
   fraction of.
2. **What a pair costs beyond its products**: the native kernel, dense, at one length with
   heads of 16, 32, 64 and 128 dimensions. Its time per causal pair fits ``fixed + Dh x
   per_dim``: ``per_dim`` is the two products (4 Dh operations a pair), ``fixed`` everything
   the kernel does once per pair whatever the head size (the prior, SSMax's factor, the
   running max, the exponential, the sum, the tile's stores). At head size 32 the share
   ``fixed`` takes is the share no faster product can win back.
3. **Each attention path** (native, flex, blockwise), dense (``--block-skip off``) and with
   certified skipping (``auto``), on the shapes of the shipped ``bam-ssmax`` (4 heads of 32,
   its three layers' own priors and SSMax scales, random queries, keys and values, seed 0):
   streamed in chunks of 2,048 queries against the keys so far, as the engine runs a prompt,
   up to ``--whole-max`` (16k); longer lengths are timed on their last chunk alone (2,048
   queries against the whole context), where a long prompt spends its time. Operations are
   counted from the causal pairs actually computed (pairs of skipped blocks left out; the
   masked half of a diagonal tile, computed but useless, not counted): 4 x Dh per pair (q . k
   and the weighted sum of v, a multiply and an add each).
4. **The whole request**: one passkey prompt (depth 0.5, seed 0) on the shipped ``bam-ssmax``
   through its back-end, skipping on and off, split into attention (the kernel), the MLPs,
   embeddings and the output head, and everything else (projections, norms, the KV cache, the
   prior's tables, the rest of the engine). ``predicted`` is what skipping should take if it
   cost nothing of its own: the time without it x the share of pairs it computed, plus the
   time outside attention; ``x predicted`` the request's time against it.

    python bench/roofline.py                                   # tables 1-4 at 4k, 16k, 64k and 512k (last chunk)
    python bench/roofline.py --lengths 4k,16k --paths native   # a quick look
    python bench/roofline.py --requests 4k,16k,64k,512k        # the 512k prompt too (about 30 minutes)

The load average is printed before and after: the figures mean something only on an idle machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

import torch

CHUNK = 2048  # queries per call, as the engine streams a prompt
HEADS, HEAD_DIM = 4, 32  # bam-ssmax's attention shape
MODEL = "bam-ssmax"
# (query rows, key columns) of one unit a path counts as left out; a skipped unit is always whole:
# its keys lie wholly in its queries' past. native: query blocks of 256 rows (chunks >= 768 queries)
# against key blocks of 512; blockwise: QUERY_BLOCK x block_size; flex: FlexAttention's tiles.
NATIVE_KEY_BLOCK = 512


def _length(text: str) -> int:
    from bamctl.lengths import parse_lengths

    return parse_lengths(text)[0]


def _label(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def best_seconds(fn, repeats: int) -> float:
    """The best of ``repeats`` timed calls after one untimed call (first-call costs: builds, compiles)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


# --- 1. the machine ---------------------------------------------------------------------------

def matmul_rate(n: int = 4096, repeats: int = 3) -> float:
    """GFLOP/s of torch's float32 ``mm`` on two n x n matrices (2 n^3 operations)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    return 2 * n ** 3 / best_seconds(lambda: torch.mm(a, b, out=out), repeats) / 1e9


def per_element_ns(op, n: int = 1 << 20, calls: int = 200) -> float:
    """ns per element of ``op(x, out)`` over n float32 values (logit-like: below 0), best of 5 runs of ``calls``."""
    x, y, out = torch.randn(n) - 5, torch.randn(n), torch.empty(n)
    return best_seconds(lambda: [op(x, y, out) for _ in range(calls)], 5) / calls / n * 1e9


def copy_bandwidth(gib: float = 1.0, repeats: int = 3) -> float:
    """GB/s of a large float32 copy: bytes read plus bytes written, per second."""
    n = int(gib * 2 ** 30) // 4
    src, dst = torch.ones(n), torch.empty(n)
    return 2 * 4 * n / best_seconds(lambda: dst.copy_(src), repeats) / 1e9


# --- pairs and operations -----------------------------------------------------------------------

def causal_pairs(q_start: int, queries: int) -> int:
    """Pairs (i, j <= i) of queries q_start .. q_start + queries - 1, per head."""
    return queries * q_start + queries * (queries + 1) // 2


def unit_shape(path: str, queries: int) -> tuple[int, int]:
    """(rows, columns) of one unit ``path`` counts, for a call of ``queries`` queries."""
    if path == "native":
        rows = 256 if queries >= 768 else (64 if queries >= 192 else 32)  # restated: csrc's query_block()
        return rows, NATIVE_KEY_BLOCK
    if path == "blockwise":
        from bamctl.engine.attention import QUERY_BLOCK, BlockwiseKernel

        keys = BlockwiseKernel().block_size
        return min(QUERY_BLOCK, keys), keys
    if path == "flex":
        from bamctl.engine.flex import BLOCK

        return BLOCK, BLOCK
    raise ValueError(path)


def skipped_pairs(path: str, queries: int, units: int) -> float:
    """Pairs left out by ``units`` skipped units of one call. Exact when the call's queries fill whole
    query blocks (every chunk of 2,048) or one block; otherwise each unit is given the mean rows."""
    rows, cols = unit_shape(path, queries)
    blocks = -(-queries // rows)
    mean_rows = queries / blocks
    return units * cols * (rows if queries % rows == 0 else mean_rows)


class CountedKernel:
    """A kernel of the engine, timed, with the causal pairs it was given and those it left out summed."""

    def __init__(self, kernel, path: str):
        self.kernel, self.path = kernel, path
        self.seconds = 0.0
        self.pairs = 0
        self.left_out = 0.0

    def reset(self) -> None:
        self.seconds, self.pairs, self.left_out = 0.0, 0, 0.0

    def __call__(self, q, k, v, inputs):
        counts = getattr(self.kernel, "counts", None)
        before = sum(counts.skipped) if counts is not None else 0
        start = time.perf_counter()
        out = self.kernel(q, k, v, inputs)
        self.seconds += time.perf_counter() - start
        batch, heads, queries, _ = q.shape
        self.pairs += batch * heads * causal_pairs(inputs.q_start, queries)
        if counts is not None:
            self.left_out += skipped_pairs(self.path, queries, sum(counts.skipped) - before)
        return out

    def __getattr__(self, name):
        return getattr(self.kernel, name)


def gflops(pairs: float, dim: int, seconds: float) -> float:
    return 4 * dim * pairs / seconds / 1e9


# --- 2. the cost of a pair beyond its products --------------------------------------------------

def pair_cost(length: int, dims: list[int], repeats: int) -> list[tuple[int, float]]:
    """(head size, ns per causal pair) of the native kernel, dense, a GGD prior and SSMax over the logits."""
    from bamctl.attention_math import AttentionInputs
    from bamctl.engine.stream import kernel_for
    from bamctl.positional import GGDPrior

    prior = GGDPrior(HEADS, init="alibi")
    with torch.no_grad():
        prior.theta_beta.copy_(torch.linspace(-0.5, 1.0, HEADS))
        table = prior.distance_table(length)
    found = []
    for dim in dims:
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, HEADS, length, dim) for _ in range(3))
        kernel = kernel_for("native", "off")

        def run():
            for start in range(0, length, CHUNK):
                stop = min(start + CHUNK, length)
                inputs = AttentionInputs(q_start=start, bias_table=table, ssmax_scale=torch.ones(HEADS), ssmax_scope="logits")
                kernel(q[:, :, start:stop], k[:, :, :stop], v[:, :, :stop], inputs)

        seconds = best_seconds(run, repeats)
        found.append((dim, seconds / (HEADS * causal_pairs(0, length)) * 1e9))
    return found


def fit_line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ``y = a + b x``: (a, b)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - b * mx, b


# --- 3. each path on bam-ssmax's shapes ---------------------------------------------------------

@dataclass
class Layer:
    table: torch.Tensor
    ssmax_scale: torch.Tensor | None
    ssmax_bias: torch.Tensor | None
    scope: str


def model_layers(reference: str, length: int) -> list[Layer]:
    """Each layer's prior table (distances 0 .. length - 1) and SSMax parameters."""
    from bamctl.catalog import resolve_model

    model = resolve_model(reference).model
    layers = []
    with torch.no_grad():
        for block in model.layers:
            attention = block.attention
            layers.append(Layer(attention.prior.distance_table(length - 1).float(), attention.ssmax_scale,
                                attention.ssmax_bias, attention.ssmax_scope))
    return layers


def time_path(path: str, mode: str, length: int, whole_max: int, layers: list[Layer], repeats: int) -> dict:
    """Seconds and pairs of ``path`` over every layer at ``length``: each chunk of the prompt, or its last."""
    from bamctl.attention_math import AttentionInputs
    from bamctl.engine.stream import kernel_for

    torch.manual_seed(0)
    qkv = [tuple(torch.randn(1, HEADS, length, HEAD_DIM) for _ in range(3)) for _ in layers]
    kernels = [CountedKernel(kernel_for(path, mode), path) for _ in layers]
    starts = range(0, length, CHUNK) if length <= whole_max else [length - CHUNK]

    def run():
        for kernel in kernels:
            kernel.reset()
        for start in starts:
            stop = min(start + CHUNK, length)
            for layer, (q, k, v), kernel in zip(layers, qkv, kernels):
                inputs = AttentionInputs(q_start=start, bias_table=layer.table, ssmax_scale=layer.ssmax_scale,
                                         ssmax_bias=layer.ssmax_bias, ssmax_scope=layer.scope)
                kernel(q[:, :, start:stop], k[:, :, :stop], v[:, :, :stop], inputs)

    with torch.inference_mode():
        seconds = best_seconds(run, repeats)
    pairs = sum(kernel.pairs for kernel in kernels)
    left_out = sum(kernel.left_out for kernel in kernels)
    return dict(path=path, mode=mode, length=length, whole=length <= whole_max, seconds=seconds,
                pairs=pairs, computed=pairs - left_out)


# --- 4. the whole request -----------------------------------------------------------------------

class SectionTimer:
    """Seconds spent inside modules (forward pre-hook to forward hook), summed."""

    def __init__(self, modules):
        self.seconds = 0.0
        self._start = 0.0
        for module in modules:
            module.register_forward_pre_hook(self._enter)
            module.register_forward_hook(self._leave)

    def _enter(self, *_):
        self._start = time.perf_counter()

    def _leave(self, *_):
        self.seconds += time.perf_counter() - self._start


def request_split(reference: str, length: int, repeats: int) -> dict:
    """Both skipping modes on one passkey prompt: seconds of the request and of each part, and pairs."""
    from bamctl.backends import open_backend
    from bamctl.backends.base import RunOptions
    from bamctl.tasks import generate_samples

    found = {}
    sample = None
    for mode in ("off", "auto"):
        backend = open_backend(reference, RunOptions(attention="native", block_skip=mode, dtype="float32"))
        engine = backend.engine
        model = engine.model
        kernel = engine.kernel = CountedKernel(engine.kernel, "native")
        mlp = SectionTimer([block.feed_forward for block in model.layers])
        ends = SectionTimer([model.tok_embeddings, model.output])
        if sample is None:
            sample = next(iter(generate_samples("passkey", [length], 1, 0, backend.tokenizer, [0.5],
                                                scored_tokens=backend.scored_tokens, bos_for=backend.bos_for)))
            backend.score_continuation(sample.input_ids[:2048], sample.answer_ids)  # first-call costs, untimed
        best = None
        for _ in range(repeats):
            kernel.reset()
            mlp.seconds = ends.seconds = 0.0
            start = time.perf_counter()
            answer = backend.score_continuation(sample.input_ids, sample.answer_ids).predicted_ids
            total = time.perf_counter() - start
            if best is None or total < best["total"]:
                best = dict(total=total, attention=kernel.seconds, mlp=mlp.seconds, ends=ends.seconds,
                            pairs=kernel.pairs, computed=kernel.pairs - kernel.left_out, answer=answer)
        found[mode] = best
    return found


# --- the tables ---------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="4k,16k,64k,512k", help="table 3's lengths (default 4k,16k,64k,512k)")
    parser.add_argument("--whole-max", default="16k", help="longer lengths are timed on their last chunk alone")
    parser.add_argument("--paths", default="native,flex,blockwise", help="table 3's paths")
    parser.add_argument("--pair-length", default="16k", help="table 2's length")
    parser.add_argument("--requests", default="4k,16k,64k", help="table 4's prompt lengths ('' for none)")
    parser.add_argument("--repeats", type=int, default=2, help="timed calls per figure, best counts (1 from 64k on)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    lengths = [_length(x) for x in args.lengths.split(",") if x]
    whole_max = _length(args.whole_max)
    repeats_at = lambda n: args.repeats if n < 65536 else 1  # noqa: E731

    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} CPUs, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}; command: {' '.join(sys.argv)}", flush=True)

    peak = matmul_rate()
    bandwidth = copy_bandwidth()
    print("\n| the machine | figure |\n|---|---:|")
    print(f"| float32 `torch.mm`, 4096 x 4096 x 4096 | {peak:.1f} GFLOP/s |")
    print(f"| copy of 1 GiB (read + written) | {bandwidth:.1f} GB/s |")
    exp_ns = per_element_ns(lambda x, y, out: torch.exp(x, out=out))
    add_ns = per_element_ns(lambda x, y, out: torch.add(x, y, out=out))
    print(f"| `torch.exp`, 1M float32 | {exp_ns:.3f} ns / element |")
    print(f"| `torch.add`, 1M float32 | {add_ns:.3f} ns / element |", flush=True)

    pair_length = _length(args.pair_length)
    points = pair_cost(pair_length, [16, 32, 64, 128], args.repeats)
    fixed, per_dim = fit_line(points)
    print(f"\nnative, dense, {_label(pair_length)}, {HEADS} heads: ns per causal pair by head size; "
          f"fit: {fixed:.3f} ns + {per_dim:.4f} ns x Dh (the products at {4 / per_dim:.1f} GFLOP/s)")
    print("\n| head size | ns / pair | GFLOP/s | of `mm` | fixed cost's share |\n|---:|---:|---:|---:|---:|")
    for dim, ns in points:
        rate = 4 * dim / ns
        print(f"| {dim} | {ns:.3f} | {rate:.1f} | {rate / peak:.0%} | {fixed / ns:.0%} |", flush=True)

    layers = model_layers(MODEL, max(lengths))  # tables to the longest distance serve every length
    print(f"\n{MODEL}'s shapes ({len(layers)} layers x {HEADS} heads of {HEAD_DIM}), "
          f"chunks of {CHUNK}; lengths past {_label(whole_max)}: their last chunk alone")
    print("\n| length | path | block skip | seconds | pairs computed | GFLOP/s | of `mm` |\n|---|---|---|---:|---:|---:|---:|")
    for length in lengths:
        for path in args.paths.split(","):
            for mode in ("off", "auto"):
                r = time_path(path, mode, length, whole_max, layers, repeats_at(length))
                rate = gflops(r["computed"], HEAD_DIM, r["seconds"])
                where = _label(length) if r["whole"] else f"{_label(length)} (last chunk)"
                print(f"| {where} | {path} | {mode} | {r['seconds']:.3f} | {r['computed'] / r['pairs']:.0%} of "
                      f"{r['pairs']:.3g} | {rate:.1f} | {rate / peak:.0%} |", flush=True)

    requests = [_length(x) for x in args.requests.split(",") if x]
    if requests:
        print(f"\nthe whole request: one passkey prompt on {MODEL}, native path, seconds")
        print("\n| length | block skip | request | attention | MLPs | embeddings + head | other | "
              "attention GFLOP/s | pairs computed | predicted | x predicted | answer |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for length in requests:
        found = request_split(MODEL, length, repeats_at(length))
        off = found["off"]
        for mode, r in found.items():
            other = r["total"] - r["attention"] - r["mlp"] - r["ends"]
            share = r["computed"] / r["pairs"]
            predicted = off["attention"] * share + (r["total"] - r["attention"])
            same = "same argmax" if r["answer"] == off["answer"] else "ARGMAX DIFFERS"
            print(f"| {_label(length)} | {mode} | {r['total']:.2f} | {r['attention']:.2f} | {r['mlp']:.2f} | "
                  f"{r['ends']:.2f} | {other:.2f} | {gflops(r['computed'], HEAD_DIM, r['attention']):.1f} | "
                  f"{share:.0%} | {predicted:.2f} | {r['total'] / predicted:.2f} | {same} |", flush=True)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
