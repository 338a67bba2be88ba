"""How much the shipped LMs' unknown-token row moves lm-eval's numbers through the plugin.

The shipped LM references have rows for a subset of GPT-2's ids; any other id is scored by one
unknown-token row (the probability of "some unknown token"). lm-eval's numbers hold those tokens;
bamctl's own perplexity leaves them out. For each model: the share of the continuation tokens of
``examples/lm_eval/arc_mini`` outside the vocabulary, the accuracy with their log-probs summed in
(what lm-eval reports) and without, and how many questions' picks change; then the same share and
the perplexity both ways on 400 words of a shipped essay, read in one pass after the prefix token.

    python bench/unknown_tokens.py --models lm-bam,lm-rope
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from bamctl.backends import peek_backend
from bamctl.harness import BamctlLM

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = ROOT / "examples" / "lm_eval" / "arc_mini.jsonl"
ESSAYS = ROOT / "bamctl" / "data" / "tasks" / "texts" / "essays"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="lm-bam,lm-rope")
    parser.add_argument("--words", type=int, default=400)
    args = parser.parse_args()
    questions = [json.loads(line) for line in QUESTIONS.read_text().splitlines()]
    essay = " ".join(sorted(ESSAYS.glob("*.txt"))[0].read_text(encoding="utf-8").split())
    text = " ".join(essay.split()[1000 : 1000 + args.words])
    for name in args.models.split(","):
        lm = BamctlLM(model=name, device="cpu", dtype="float32")
        vocabulary = peek_backend(name).token_subset

        def scored(context_ids, continuation_ids):
            (score,) = lm.served.score_continuations([(context_ids, continuation_ids)])
            return list(zip(continuation_ids, score.logprobs))

        unknown = total = hits_all = hits_known = changed = 0
        for q in questions:
            rows = [scored(*lm._encode_pair(f"Question: {q['question']}\nAnswer:", f" {c}")) for c in q["choices"]]
            unknown += sum(t not in vocabulary for row in rows for t, _ in row)
            total += sum(len(row) for row in rows)
            every = [sum(lp for _, lp in row) for row in rows]
            known = [sum(lp for t, lp in row if t in vocabulary) for row in rows]
            pick_all, pick_known = every.index(max(every)), known.index(max(known))
            hits_all += pick_all == q["answer"]
            hits_known += pick_known == q["answer"]
            changed += pick_all != pick_known
        n = len(questions)
        print(f"{name} arc_mini: {unknown}/{total} continuation tokens outside the vocabulary; acc {hits_all / n:.3f} "
              f"with them, {hits_known / n:.3f} without; {changed}/{n} picks change")
        row = scored([lm.prefix_token_id], lm.tok_encode(text))
        outside = [lp for t, lp in row if t not in vocabulary]
        inside = [lp for t, lp in row if t in vocabulary]
        print(f"{name} essay ({args.words} words): {len(outside)}/{len(row)} tokens outside ({len(outside) / len(row):.1%}); "
              f"perplexity {math.exp(-sum(lp for _, lp in row) / len(row)):.1f} with them, "
              f"{math.exp(-sum(inside) / len(inside)):.1f} without")


if __name__ == "__main__":
    main()
