"""Time and peak memory of each attention path against torch SDPA, per context length.

Each (path, length) runs in a fresh subprocess so its peak resident memory is its own:
we report the peak RSS growth over the process's RSS just before the call. The peer,
torch's ``scaled_dot_product_attention`` (causal, no bias), runs on the same shapes in
the same sweep. Our paths compute the BAM prior and SSMax; SDPA computes neither.

    python bench/attention_paths.py                     # 1k..32k, 4 heads x 64 dims
    python bench/attention_paths.py --max-length 64k --heads 8
    python bench/attention_paths.py --lengths 4k,16k,64k --paths sdpa,fused --ssmax-scope content
    python bench/attention_paths.py --lengths 16k --paths sdpa,native,fire   # FIRE (auto's path) against BAM
    python bench/attention_paths.py --model rope-ssmax --lengths 2k,8k --paths auto,blockwise

``fire`` is a FIRE prior (query-dependent; random MLP weights, L = 512) on the path ``auto``
picks for it on this machine (the native kernel where it builds, else blockwise); the other
paths run the BAM prior.

``--model NAME`` times a whole model instead (a catalog name or checkpoint directory): the
seconds per passkey prompt of one streamed teacher-forced pass (prefill plus the scored answer
rows, ``score_continuation``) on each path, each path's time against the first path's. The
prompts (5 depths, seed 0) go through every path in turn, so the machine's load falls on all
alike; each prompt counts its best of ``--repeats`` passes, and one warm-up pass per path and
length is not timed. ``auto`` is shown with the path it picks for the model.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch

CHUNK = 2048  # queries per call, as the engine streams them


def _rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _run_one(path: str, length: int, heads: int, head_dim: int, repeats: int, scope: str) -> dict:
    from bamctl.attention_math import AttentionInputs
    from bamctl.engine.stream import kernel_for
    from bamctl.positional import GGDPrior

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, heads, length, head_dim) for _ in range(3))
    prior = GGDPrior(heads, init="alibi")
    with torch.no_grad():
        prior.theta_beta.copy_(torch.linspace(-0.5, 1.0, heads))
        table = prior.distance_table(length)
    scale = torch.ones(heads)

    fire, kernel_path = None, path
    if path == "fire":
        from bamctl.positional import FIREPrior

        fire = FIREPrior(heads, train_length=512)
        with torch.no_grad():
            for parameter in fire.mlp.parameters():
                parameter.normal_()
        table = None
        kernel_path = _auto_path_for_fire()

    def ours():
        kernel = kernel_for(kernel_path)
        out = torch.empty_like(q)
        for start in range(0, length, CHUNK):
            stop = min(start + CHUNK, length)
            inputs = AttentionInputs(q_start=start, bias_table=table, ssmax_scale=scale, ssmax_scope=scope, query_prior=fire)
            out[:, :, start:stop] = kernel(q[:, :, start:stop], k[:, :, :stop], v[:, :, :stop], inputs)
        return out

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    fn = sdpa if path == "sdpa" else ours
    before = _rss_bytes()
    with torch.inference_mode():
        fn()  # warm-up, and the peak memory of one call
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return {"path": path, "length": length, "seconds": min(times), "peak_bytes": max(peak, 0), "kernel": kernel_path}


def _auto_path_for_fire() -> str:
    """The path the engine's ``auto`` takes for a FIRE model on this machine's CPU."""
    from bamctl.checkpoint import new_random_model
    from bamctl.engine.stream import StreamingEngine
    from bamctl.model import ModelConfig

    model = new_random_model(ModelConfig.from_preset("micro", "fire-ssmax", vocab_size=101), 0)
    return StreamingEngine(model, device="cpu", attention="auto").attention


def _model_paths(reference: str, lengths: list[int], paths: list[str], prompts: int, chunk_size: int, repeats: int) -> None:
    """Seconds per passkey prompt (best of ``repeats``) of ``reference`` on each path, and each against the first path's."""
    from bamctl.backends import open_backend
    from bamctl.backends.base import RunOptions
    from bamctl.tasks import generate_samples

    backends = {path: open_backend(reference, RunOptions(device="cpu", attention=path, chunk_size=chunk_size)) for path in paths}
    tokenizer = backends[paths[0]].tokenizer
    print(f"model {reference}, torch {torch.__version__}, {torch.get_num_threads()} threads, {backends[paths[0]].dtype}, CPU; "
          f"chunks of {chunk_size} tokens, {prompts} passkey prompts per length (5 depths, seed 0), best of {repeats} each")
    header = f"{'length':>7} | {'path':>18} | {'s / prompt':>10} | {f'x {paths[0]}':>12}"
    print(header)
    print("-" * len(header))
    for length in lengths:
        samples = list(generate_samples("passkey", [length], -(-prompts // 5), 0, tokenizer))[:prompts]
        seconds = {path: 0.0 for path in paths}
        with torch.inference_mode():
            for backend in backends.values():  # warm-up: first-call costs (buffers, tables) are not timed
                backend.score_continuation(samples[0].input_ids, samples[0].answer_ids)
            for sample in samples:
                for path, backend in backends.items():
                    best = float("inf")
                    for _ in range(repeats):  # the best of a few: a shared machine's load spikes fall out
                        start = time.perf_counter()
                        backend.score_continuation(sample.input_ids, sample.answer_ids)
                        best = min(best, time.perf_counter() - start)
                    seconds[path] += best
        first = seconds[paths[0]]
        for path, backend in backends.items():
            name = f"{path} ({backend.attention})" if path == "auto" else path
            print(f"{length:>7} | {name:>18} | {seconds[path] / len(samples):>10.3f} | {seconds[path] / first:>12.2f}")


def _parse_length(text: str) -> int:
    return int(text[:-1]) * 1024 if text.lower().endswith("k") else int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--min-length", default="1k")
    parser.add_argument("--max-length", default="32k")
    parser.add_argument("--lengths", help="comma list of lengths instead of doubling from --min-length")
    parser.add_argument("--paths", help="comma list; sdpa is the peer (default sdpa,fused,flex,blockwise,dense; "
                        "with --model: auto,blockwise, the first path the peer)")
    parser.add_argument("--ssmax-scope", default="logits", choices=["logits", "content"],
                        help="SSMax over content and prior (the authors' BAM) or content only (their ALiBi)")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dense-max", default="8k", help="longest length for the dense path (n x n logits)")
    parser.add_argument("--model", help="time this model (catalog name or checkpoint) on passkey prompts instead")
    parser.add_argument("--prompts", type=int, default=5, help="with --model: prompts per length")
    parser.add_argument("--chunk-size", type=int, default=2048, help="with --model: tokens per prefill chunk")
    parser.add_argument("--one", nargs=2, metavar=("PATH", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        result = _run_one(args.one[0], int(args.one[1]), args.heads, args.head_dim, args.repeats, args.ssmax_scope)
        print(json.dumps(result))
        return

    lengths, n = [], _parse_length(args.min_length)
    while n <= _parse_length(args.max_length):
        lengths.append(n)
        n *= 2
    if args.lengths:
        lengths = [_parse_length(x) for x in args.lengths.split(",")]
    if args.model:
        paths = (args.paths or "auto,blockwise").split(",")
        _model_paths(args.model, lengths, paths, args.prompts, args.chunk_size, args.repeats)
        return
    args.paths = args.paths or "sdpa,fused,flex,blockwise,dense"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, 1 x {args.heads} heads x {args.head_dim} dims, "
          f"float32, CPU; SSMax scope: {args.ssmax_scope}")
    header = f"{'length':>7} | {'path':>16} | {'seconds':>8} | {'peak MiB':>8} | {'time / sdpa':>11} | {'mem / sdpa':>10}"
    print(header)
    print("-" * len(header))
    for length in lengths:
        results = {}
        for path in args.paths.split(","):
            if path == "dense" and length > _parse_length(args.dense_max):
                continue
            cmd = [sys.executable, __file__, "--one", path, str(length), "--heads", str(args.heads),
                   "--head-dim", str(args.head_dim), "--repeats", str(args.repeats), "--ssmax-scope", args.ssmax_scope]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{length:>7} | {path:>16} | failed: {done.stderr.strip().splitlines()[-1:]}")
                continue
            results[path] = json.loads(done.stdout)
        peer = results.get("sdpa")
        for path, r in results.items():
            ratio_t = r["seconds"] / peer["seconds"] if peer else float("nan")
            ratio_m = r["peak_bytes"] / peer["peak_bytes"] if peer and peer["peak_bytes"] else float("nan")
            name = f"{path} ({r['kernel']})" if path == "fire" else path
            print(f"{length:>7} | {name:>16} | {r['seconds']:>8.3f} | {r['peak_bytes'] / 2**20:>8.1f} | {ratio_t:>11.2f} | {ratio_m:>10.2f}")


if __name__ == "__main__":
    main()
