"""What a PE plugin costs beside the zoo's own PEs, in one process, on the same prompts.

Random-weight models of the passkey family's shape (tiny preset, 3 layers, GPT-2's vocabulary),
one per PE, seed 0. Each figure is the seconds of one streamed teacher-forced passkey prompt
(prefill and the scored answer, ``score_continuation``), the best of ``--repeats``, the models
taking turns so the machine's load falls on all alike; one untimed warm-up pass each.

- distance-only, on the native kernel, against the zoo's ``alibi``: ALiBi restated as a plugin
  (``examples/positional/alibi.py``: the same bias, so any gap is the plugin's own cost) and
  Sandwich (``examples/positional/sandwich.py``: another bias, which the kernel may skip
  differently; the share of key blocks skipped is shown), with the zoo's ``kerple`` (a bias
  that falls slowly, as Sandwich's does) for scale;
- content-dependent, against ``alibi`` on the same path and on native: CoPE
  (``examples/positional/cope.py``, a scan) on dense and blockwise, Cable
  (``examples/positional/cable.py``, pair by pair) on dense, blockwise and compiled flex.

    OMP_NUM_THREADS=1 python bench/pe_plugins.py --lengths 16k,64k --repeats 2
    OMP_NUM_THREADS=1 python bench/pe_plugins.py --content --lengths 4k,16k --repeats 2
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from bamctl.checkpoint import new_random_model
from bamctl.engine.stream import StreamingEngine
from bamctl.lengths import parse_lengths
from bamctl.model import ModelConfig
from bamctl.tasks.registry import generate_samples
from bamctl.tokenizer import get_tokenizer

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "positional"
DISTANCE = [("alibi", "alibi", "native"), ("kerple", "kerple", "native"), ("alibi as a plugin", f"{EXAMPLES / 'alibi.py'}:ALiBi", "native"),
            ("sandwich (plugin)", f"{EXAMPLES / 'sandwich.py'}:Sandwich", "native")]
COPE, CABLE = f"{EXAMPLES / 'cope.py'}:CoPE", f"{EXAMPLES / 'cable.py'}:Cable"
CONTENT = [("alibi", "alibi", "native"), ("alibi", "alibi", "dense"), ("alibi", "alibi", "blockwise"), ("alibi", "alibi", "flex"),
           ("cope (plugin)", COPE, "dense"), ("cope (plugin)", COPE, "blockwise"),
           ("cable (plugin)", CABLE, "dense"), ("cable (plugin)", CABLE, "blockwise"), ("cable (plugin)", CABLE, "flex")]


def engine(pe: str, attention: str, chunk_size: int) -> StreamingEngine:
    config = ModelConfig.from_preset("tiny", pe, n_layers=3, train_length=128)
    return StreamingEngine(new_random_model(config, 0).eval(), device="cpu", attention=attention, chunk_size=chunk_size)


def one_pass(runner: StreamingEngine, sample) -> float:
    start = time.perf_counter()
    runner.score_continuation(sample.input_ids, sample.answer_ids)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="16k,64k")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--content", action="store_true", help="the content-dependent rows (CoPE, Cable) instead of the distance-only ones")
    parser.add_argument("--chunk-size", type=int, default=2048)
    args = parser.parse_args()
    rows = CONTENT if args.content else DISTANCE
    tokenizer = get_tokenizer("gpt2")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU, tiny x 3 layers, random weights; "
          f"best of {args.repeats}; load average {open('/proc/loadavg').read().split()[0]} at the start")
    print("| length | PE | path | seconds | time / alibi on the same path | key blocks skipped |")
    print("|---|---|---|---|---|---|")
    for length in parse_lengths(args.lengths):
        sample = next(generate_samples("passkey", [length], 1, 0, tokenizer))
        runners = [(label, path, engine(pe, path, args.chunk_size)) for label, pe, path in rows]
        for _, _, runner in runners:
            one_pass(runner, sample)  # warm-up: the kernel's build, the tables' first size
        best = [float("inf")] * len(runners)
        for _ in range(args.repeats):
            for i, (_, _, runner) in enumerate(runners):
                best[i] = min(best[i], one_pass(runner, sample))
        reference = {path: best[i] for i, (label, path, _) in enumerate(runners) if label == "alibi"}
        for (label, path, runner), seconds in zip(runners, best):
            counted = runner.last_block_counts[0]  # the last pass's: (left out, considered), None on dense
            share = f"{counted[0] / counted[1]:.0%}" if counted and counted[1] else "-"
            print(f"| {length:,} | {label} | {path} | {seconds:.2f} | {seconds / reference[path]:.2f} | {share} |", flush=True)


if __name__ == "__main__":
    main()
