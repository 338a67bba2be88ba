"""Certified block skipping, side by side: seconds with and without it, and the blocks it left out.

For each case (model, task, length) one prompt is run in this process on the same engine path
with ``--block-skip auto`` and with ``off``, ``--repeats`` times in alternating order (each mode's
best pass counts; one untimed warm-up pass per model first), and the table prints:

- the key blocks left out (``skipped_blocks`` of ``key_blocks``, as a result row records them);
- the seconds in the attention kernel alone and for the whole request, each mode, and the ratios;
- whether the answers agree: the same argmax (passkey) and the relative difference of the NLL
  summed over the document (perplexity).

The cases are the issue's list: ``lm-bam`` perplexity at 16k and 64k, ``alibi`` and ``bam-ssmax``
passkey at 64k, ``bam-ssmax`` passkey at 512k (one prompt), and ``rope`` and ``nope`` passkey at
64k, which have no bias and never try a skip (their ratio is the cost of the option itself).

    python bench/block_skip.py                         # every case (hours on 2 cores; 512k alone ~25 min x 2)
    python bench/block_skip.py --scale 16              # each length / 16: a quick look
    python bench/block_skip.py --cases alibi,lm-bam --attention blockwise
    python bench/block_skip.py --counts-only --scale 4 --max-length 16k   # blocks left out, no timing

The machine's load average is printed before and after: the timings mean something only on an
idle machine. ``--threads N`` sets torch's threads (default: torch's own).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

CASES = [  # (model, task, length)
    ("lm-bam", "ppl", 16384),
    ("lm-bam", "ppl", 65536),
    ("alibi", "passkey", 65536),
    ("bam-ssmax", "passkey", 65536),
    ("bam-ssmax", "passkey", 524288),
    ("rope", "passkey", 65536),
    ("nope", "passkey", 65536),
]


class TimedKernel:
    """The engine's kernel, with the seconds spent in it summed; everything else read through."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.seconds = 0.0

    def __call__(self, q, k, v, inputs):
        start = time.perf_counter()
        out = self.kernel(q, k, v, inputs)
        self.seconds += time.perf_counter() - start
        return out

    def __getattr__(self, name):
        return getattr(self.kernel, name)


def _sample(backend, task: str, length: int):
    from bamctl.tasks import generate_samples

    depths = [0.5] if task == "passkey" else None
    return next(iter(generate_samples(task, [length], 1, 0, backend.tokenizer, depths,
                                      scored_tokens=backend.scored_tokens, bos_for=backend.bos_for)))


def _ask(backend, task: str, sample):
    """(answer, request seconds): the argmax ids (passkey) or the summed NLL (perplexity)."""
    start = time.perf_counter()
    if task == "passkey":
        answer = backend.score_continuation(sample.input_ids, sample.answer_ids).predicted_ids
    else:
        first = min(span.start for span in sample.scored)
        nll = backend.token_nll(sample.input_ids, first)
        answer = float(nll[torch.isfinite(nll)].double().sum())
    return answer, time.perf_counter() - start


def run_case(model: str, task: str, length: int, attention: str | None, repeats: int) -> dict:
    """Both modes on one prompt, ``repeats`` times in alternating order (auto, off, off, auto, ...);
    each mode's best time counts."""
    from bamctl.backends import open_backend
    from bamctl.backends.base import RunOptions

    backends = {mode: open_backend(model, RunOptions(attention=attention, block_skip=mode, dtype="float32"))
                for mode in ("auto", "off")}
    timers = {}
    for mode, backend in backends.items():
        timers[mode] = backend.engine.kernel = TimedKernel(backend.engine.kernel)
    sample = _sample(backends["auto"], task, length)
    found = {mode: dict(seconds=float("inf"), attention_s=float("inf")) for mode in backends}
    for repeat in range(repeats):
        for mode in (("auto", "off") if repeat % 2 == 0 else ("off", "auto")):
            timers[mode].seconds = 0.0
            answer, seconds = _ask(backends[mode], task, sample)
            best = found[mode]
            best.update(answer=answer, counts=backends[mode].engine.last_block_counts[0], path=backends[mode].attention)
            best["seconds"] = min(best["seconds"], seconds)
            best["attention_s"] = min(best["attention_s"], timers[mode].seconds)
    auto, off = found["auto"], found["off"]
    if task == "passkey":
        agree = "same argmax" if auto["answer"] == off["answer"] else "ARGMAX DIFFERS"
    else:
        agree = f"nll rel {abs(auto['answer'] - off['answer']) / abs(off['answer']):.1e}"
    return dict(model=model, task=task, length=length, path=auto["path"], counts=auto["counts"],
                off_counts=off["counts"], auto_s=auto["seconds"], off_s=off["seconds"],
                auto_attn=auto["attention_s"], off_attn=off["attention_s"], agree=agree, n_tokens=sample.n_tokens)


def count_case(model: str, task: str, length: int, attention: str | None) -> tuple[str, int, int]:
    """(path, key blocks left out, key blocks considered) of one pass with skipping on: no timing,
    so a machine's load does not matter."""
    from bamctl.backends import open_backend
    from bamctl.backends.base import RunOptions

    backend = open_backend(model, RunOptions(attention=attention, dtype="float32"))
    _ask(backend, task, _sample(backend, task, length))
    skipped, total = backend.engine.last_block_counts[0]
    return backend.attention, skipped, total


def _length(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def print_table(rows: list[dict]) -> None:
    head = ("model", "task", "length", "path", "blocks skipped", "attention s auto/off", "attn x",
            "request s auto/off", "request x", "answers")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        counts = r["counts"]
        skipped = "—" if counts is None else f"{counts[0]:,} / {counts[1]:,} ({counts[0] / max(counts[1], 1):.0%})"
        print(f"| {r['model']} | {r['task']} | {_length(r['length'])} | {r['path']} | {skipped} | "
              f"{r['auto_attn']:.1f} / {r['off_attn']:.1f} | {r['off_attn'] / max(r['auto_attn'], 1e-9):.2f} | "
              f"{r['auto_s']:.1f} / {r['off_s']:.1f} | {r['off_s'] / max(r['auto_s'], 1e-9):.2f} | {r['agree']} |",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="", help="models to keep, comma separated (default: every case)")
    parser.add_argument("--scale", type=int, default=1, help="divide every length by this (a quick look)")
    parser.add_argument("--attention", default=None, help="the engine's path (default: auto's choice)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--counts-only", action="store_true", help="only the blocks left out (one pass, skipping on)")
    parser.add_argument("--max-length", default=None, help="leave out cases longer than this (e.g. 64k)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="passes per mode, alternating, best counts (default: 2, and 1 from 256k on)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    keep = {name for name in args.cases.split(",") if name}
    cases = [(m, t, max(n // args.scale, 256)) for m, t, n in CASES if not keep or m in keep]
    if args.max_length:
        from bamctl.lengths import parse_lengths

        top = max(parse_lengths(args.max_length))
        cases = [case for case in cases if case[2] <= top]
    if args.counts_only:
        print("| model | task | length | path | blocks skipped |\n|---|---|---|---|---|")
        for model, task, length in cases:
            path, skipped, total = count_case(model, task, length, args.attention)
            print(f"| {model} | {task} | {_length(length)} | {path} | {skipped:,} / {total:,} ({skipped / max(total, 1):.1%}) |",
                  flush=True)
        return
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} CPUs, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads; command: {' '.join(sys.argv)}", flush=True)
    warmed = set()
    rows = []
    for model, task, length in cases:
        if model not in warmed:  # the kernel's build and first calls, untimed
            run_case(model, task, min(length, 2048), args.attention, 1)
            warmed.add(model)
        repeats = args.repeats or (1 if length >= 262144 else 2)
        rows.append(run_case(model, task, length, args.attention, repeats))
        print(f"done: {model} {task} {_length(length)}", file=sys.stderr, flush=True)
    print_table(rows)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
