"""A user's own module through bamctl against the plain loop the user would write, in one process.

The module is x-transformers' ``TransformerWrapper`` (ALiBi, dim 128, 2 layers, 4 heads, GPT-2's
vocabulary), random weights. The prompts are bamctl's own (``generate_samples``), the same for
both. Each figure is the median of ``--repeats`` runs, bamctl and the plain loop alternating:

- passkey (teacher-forced, protocol exact) at 1k and 4k: the plain loop is one forward per
  prompt and the argmax where the key's digits are predicted; bamctl is ``bamctl.evaluate`` with
  ``force=True`` (every row computed and written), at ``--batch-size 1`` and ``auto``;
- greedy generation at 1k (RULER's niah_single_1, its 128-token budget): the plain loop is one
  whole forward per new token; bamctl the same module plainly, and with x-transformers' own KV
  cache as the step (``step=``), where the prompt is prefilled once and each token decoded from it.

    OMP_NUM_THREADS=1 python bench/own_model.py --samples 8 --greedy-samples 2 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import bamctl  # noqa: E402
from bamctl.backends.user_tokenizer import as_tokenizer  # noqa: E402
from bamctl.tasks.registry import generate_samples  # noqa: E402
from own_models import gpt2_encoding, x_transformers_step  # noqa: E402


def module():
    from x_transformers import Decoder, TransformerWrapper

    torch.manual_seed(0)
    return TransformerWrapper(num_tokens=50257, max_seq_len=1024, use_abs_pos_emb=False,
                               attn_layers=Decoder(dim=128, depth=2, heads=4, alibi_pos_bias=True)).eval()


def plain_passkey(model, samples) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        for s in samples:
            logits = model(torch.tensor([s.input_ids + s.answer_ids[:-1]]))
            logits[0, len(s.input_ids) - 1:].argmax(-1).tolist()
    return time.perf_counter() - start


def plain_greedy(model, samples, budget: int, eos: int) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        for s in samples:
            ids = list(s.input_ids)
            for _ in range(budget):
                token = int(model(torch.tensor([ids]))[0, -1].argmax())
                ids.append(token)
                if token == eos:
                    break
    return time.perf_counter() - start


ENCODING = gpt2_encoding()  # built once, as a user holds it


def through_bamctl(model, task: str, length: int, samples: int, batch, step=None) -> float:
    given = {"model": model, "tokenizer": ENCODING, **({"step": step} if step else {})}
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        bamctl.evaluate(given, task=task, lengths=[length], samples=samples, depths=[0.5] if task == "passkey" else None,
                        batch_size=batch, chunk_size=512, dir=folder, force=True, quiet=True)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8, help="passkey prompts a cell")
    parser.add_argument("--greedy-samples", type=int, default=2, help="niah_single_1 prompts")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model, tokenizer = module(), as_tokenizer(gpt2_encoding(), "x")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); {args.samples} passkey and "
          f"{args.greedy_samples} niah_single_1 prompts a cell, median of {args.repeats}\n")
    print("| request | length | plain loop (s) | bamctl, batch 1 (s) | ratio | bamctl, auto (s) | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for length in (1024, 4096):
        samples = list(generate_samples("passkey", [length], args.samples, 0, tokenizer, depths=[0.5], protocol="exact"))
        through_bamctl(model, "passkey", length, 1, 1)  # warm-up: first allocations, imports
        runs = {"plain": [], 1: [], "auto": []}
        for _ in range(args.repeats):
            runs["plain"].append(plain_passkey(model, samples))
            for batch in (1, "auto"):
                runs[batch].append(through_bamctl(model, "passkey", length, args.samples, batch))
        _row("passkey, teacher-forced", length, runs)
    samples = list(generate_samples("niah_single_1", [1024], args.greedy_samples, 0, tokenizer))
    runs = {"plain": [], 1: [], "auto": [], "cached": []}
    for _ in range(args.repeats):
        runs["plain"].append(plain_greedy(model, samples, 128, tokenizer.eos_id))
        for batch in (1, "auto"):
            runs[batch].append(through_bamctl(model, "niah_single_1", 1024, args.greedy_samples, batch))
        runs["cached"].append(through_bamctl(model, "niah_single_1", 1024, args.greedy_samples, "auto", x_transformers_step))
    _row("greedy, 128 tokens (niah_single_1)", 1024, runs)
    plain, cached = statistics.median(runs["plain"]), statistics.median(runs["cached"])
    print(f"| greedy, with x-transformers' cache as step=, auto | 1024 | {plain:.2f} | | | {cached:.2f} | {cached / plain:.2f} |")


def _row(label: str, length: int, runs: dict) -> None:
    plain, one, auto = (statistics.median(runs[key]) for key in ("plain", 1, "auto"))
    print(f"| {label} | {length} | {plain:.2f} | {one:.2f} | {one / plain:.2f} | {auto:.2f} | {auto / plain:.2f} |")


if __name__ == "__main__":
    main()
