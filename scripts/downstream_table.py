"""The downstream table: lm-eval tasks on bamctl models, one row per model, through --model bamctl.

    python scripts/downstream_table.py --tasks arc_mini --include-path examples/lm_eval   # offline
    python scripts/downstream_table.py --tasks arc_easy,arc_challenge,mmlu                # the paper's (datasets needed)
    python scripts/downstream_table.py --models lm-bam-ssmax,bam:/ckpt/bam_ssmax --tasks arc_easy

Each model is evaluated by lm-eval's own ``simple_evaluate`` with bamctl's plugin
(``bamctl.harness.BamctlLM``), zero-shot unless ``--num-fewshot``; the table prints acc and
acc_norm (± lm-eval's standard error) per task, and ``--json`` writes lm-eval's results per model.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

LM_REFERENCES = ["lm-nope", "lm-sinusoidal", "lm-rope", "lm-alibi", "lm-kerple", "lm-t5", "lm-xpos", "lm-fire",
                 "lm-bam", "lm-bam-ssmax"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(LM_REFERENCES), help="comma-separated bamctl model references")
    parser.add_argument("--tasks", required=True, help="comma-separated lm-eval tasks")
    parser.add_argument("--include-path", help="a folder of extra lm-eval task YAMLs")
    parser.add_argument("--num-fewshot", type=int, default=None)
    parser.add_argument("--limit", type=int, default=None, help="items per task (lm-eval's --limit)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--json", type=Path, help="write lm-eval's results of every model here")
    args = parser.parse_args()

    import lm_eval
    from lm_eval.tasks import TaskManager

    from bamctl.harness import BamctlLM

    tasks = args.tasks.split(",")
    manager = TaskManager(include_path=args.include_path)
    table, everything = [], {}
    for model in args.models.split(","):
        started = time.perf_counter()
        lm = BamctlLM(model=model, dtype=args.dtype, batch_size="auto")
        out = lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=manager, num_fewshot=args.num_fewshot,
                                      limit=args.limit, log_samples=False)
        lm.close()
        everything[model] = out["results"]
        table.append((model, out["results"], time.perf_counter() - started))
    metrics = ("acc", "acc_norm")
    header = ["model", *[f"{task} {metric}" for task in tasks for metric in metrics], "seconds"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for model, results, seconds in table:
        cells = []
        for task in tasks:
            for metric in metrics:
                value, error = results[task].get(f"{metric},none"), results[task].get(f"{metric}_stderr,none")
                cells.append("n/a" if value is None else f"{value:.3f} ± {error:.3f}" if isinstance(error, float) else f"{value:.3f}")
        print(f"| {model} | " + " | ".join(cells) + f" | {seconds:.0f} |")
    if args.json:
        args.json.write_text(json.dumps(everything, indent=1, default=str))


if __name__ == "__main__":
    main()
