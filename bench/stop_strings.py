"""lm-eval's generate_until through the plugin, each generation ended at its stop strings or not.

The same requests (questions from ``examples/lm_eval/arc_mini.jsonl`` as open answers, stop
string "\\n", lm-eval's default budget of 256 tokens) answered by ``BamctlLM`` twice on one
back-end: once as now (each row ends at its first stop string) and once generating the whole
budget and cutting the text afterwards, alternating, ``--repeats`` times each. The texts must be
equal; the table gives the tokens generated and the seconds.

    OMP_NUM_THREADS=1 python bench/stop_strings.py --model lm-bam --requests 12 --repeats 3
    python bench/stop_strings.py --model hf:/tmp/smollm2 --requests 12
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from lm_eval.api.instance import Instance

from bamctl.harness import BamctlLM

QUESTIONS = Path(__file__).resolve().parents[1] / "examples" / "lm_eval" / "arc_mini.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="lm-bam")
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--budget", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    questions = [json.loads(line)["question"] for line in QUESTIONS.read_text().splitlines()][: args.requests]
    asked = [Instance("generate_until", {}, (f"Question: {q}\nAnswer:", {"until": ["\n"], "max_gen_toks": args.budget}), i)
             for i, q in enumerate(questions)]
    lm = BamctlLM(model=args.model, device="cpu", batch_size="auto")
    served = lm.served
    generate_many = served.generate_many
    counted: list[int] = []

    def counting(prompts, budget, stop_strings=None, *, stops: bool):
        outputs = generate_many(prompts, budget, stop_strings=stop_strings if stops else None)
        counted.append(sum(len(o) for o in outputs))
        return outputs

    results: dict[str, list] = {"stop strings": [], "whole budget, then cut": []}
    texts = {}
    lm.generate_until(asked[:1], disable_tqdm=True)  # warm-up (kernel load, first allocations)
    for _ in range(args.repeats):
        for label, stops in (("stop strings", True), ("whole budget, then cut", False)):
            served.generate_many = lambda p, b, stop_strings=None, s=stops: counting(p, b, stop_strings, stops=s)
            counted.clear()
            start = time.perf_counter()
            texts[label] = lm.generate_until(asked, disable_tqdm=True)
            results[label].append((time.perf_counter() - start, sum(counted)))
    assert texts["stop strings"] == texts["whole budget, then cut"], "the texts differ"
    print(f"{args.model}, {len(asked)} requests, max_gen_toks {args.budget}, until ['\\n']; texts equal\n")
    print("| generation | tokens generated | seconds (median of %d) | ratio |" % args.repeats)
    print("|---|---:|---:|---:|")
    whole = statistics.median(s for s, _ in results["whole budget, then cut"])
    for label, runs in results.items():
        seconds = statistics.median(s for s, _ in runs)
        print(f"| {label} | {runs[0][1]:,} | {seconds:.2f} | {seconds / whole:.2f} |")


if __name__ == "__main__":
    main()
