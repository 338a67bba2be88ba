"""Why a needle at depth 0 is missed at long context: where bam-ssmax attends while it copies the key.

    python scripts/diagnose_depth0.py --length 64k --depths 0.0,0.02,0.5 --samples 4           # where the answer starts
    python scripts/diagnose_depth0.py --length 64k --depths 0.0,0.02 --draws 100/0 --per-digit  # each digit's copy
    python scripts/diagnose_depth0.py --training-rows bamctl/data/baselines/bam-ssmax.toml      # where training puts the needle

Development seeds only (100 and 101; the held-out ones stay unseen). One JSON line per prompt
(or per answer digit with ``--per-digit``), protocol ``exact`` as the claims table runs it:

- default: the teacher-forced prediction and, per layer and head, the attention weight that the
  last prompt token (it predicts the key's first digit) puts on the key's tokens (both copies)
  and on the 30 tokens of the instruction;
- ``--per-digit``: for each answer digit k = 1..4, fed teacher-forced, the weight that the query
  predicting digit k + 1 puts on each digit token of both copies of the key, per layer and head;
- ``--training-rows RECIPE``: no model; one JSON line counting, over every passkey row of the
  recipe's training (all steps), the rows whose needle directly follows the instruction (as at
  depth 0) or directly precedes the question (as at depth 1), overall and among prompts of at
  least ``--long`` tokens (the filler after or before the needle is then long, as at 64k), and
  the rows that open with the needle (``passkey_needle_first``, step 24: the key at the row's
  first positions).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from bamctl.catalog import resolve_model
from bamctl.engine.stream import StreamingEngine
from bamctl.lengths import parse_lengths
from bamctl.tasks import plan_samples
from bamctl.tasks.metrics import score
from bamctl.tokenizer import get_tokenizer

DEVELOPMENT_SEEDS = [100, 101]
KEY_DIGITS = 5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="bam-ssmax")
    parser.add_argument("--length", default="64k")
    parser.add_argument("--depths", default="0.0,0.02,0.5")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--draws", help="only these draws (seed/index, e.g. 100/0,100/3)")
    parser.add_argument("--per-digit", action="store_true")
    parser.add_argument("--training-rows", metavar="RECIPE", help="count where the recipe's training rows put the needle")
    parser.add_argument("--long", type=int, default=120, help="with --training-rows: the shortest prompt counted as long")
    args = parser.parse_args()
    if args.training_rows:
        training_rows(args.training_rows, args.long)
        return

    torch.set_num_threads(1)
    checkpoint = resolve_model(args.model)
    tokenizer = get_tokenizer(checkpoint.model.config.tokenizer)
    engine = StreamingEngine(checkpoint.model, device="cpu", dtype="float32")
    (length,) = parse_lengths(args.length)
    depths = [float(x) for x in args.depths.split(",")]
    draws = set(args.draws.split(",")) if args.draws else None
    plan = plan_samples("passkey", [length], args.samples, DEVELOPMENT_SEEDS, tokenizer, depths, protocol="exact")
    for sample in plan.samples():
        if draws is not None and sample.draw not in draws:
            continue
        keys = sample.meta["key_positions"]  # where each copy of the key starts
        common = {"length": length, "depth": sample.needle_depth, "draw": sample.draw, "key": sample.answers[0],
                  "key_positions": keys}
        if args.per_digit:
            for k in range(1, KEY_DIGITS):
                weights = engine.last_query_attention(list(sample.input_ids) + list(sample.answer_ids[:k]))
                per_head = [[[round(float(w[h, p + d]), 4) for p in keys for d in range(KEY_DIGITS)]
                             for h in range(w.shape[0])] for w in weights]
                print(json.dumps({**common, "k": k, "weights": per_head}), flush=True)
            continue
        start = time.perf_counter()
        predicted, _ = engine.score_continuation(sample.input_ids, sample.answer_ids)  # argmax, log-probs
        weights = engine.last_query_attention(sample.input_ids)
        key_tokens = [p + d for p in keys for d in range(KEY_DIGITS)]
        print(json.dumps({
            **common, "score": score(sample.metric, list(predicted), sample),
            "predicted": tokenizer.decode(list(predicted)),
            "on_key": [[round(float(w[h, key_tokens].sum()), 5) for h in range(w.shape[0])] for w in weights],
            "on_instruction": [[round(float(w[h, :30].sum()), 5) for h in range(w.shape[0])] for w in weights],
            "seconds": round(time.perf_counter() - start, 1),
        }), flush=True)


def training_rows(recipe_file: str, long: int) -> None:
    from bamctl.tasks.passkey import passkey_pieces
    from bamctl.train import load_recipe, prepare

    setup = prepare(load_recipe(recipe_file))
    recipe, batches = setup.recipe, setup.batches
    pieces = passkey_pieces(batches.tokenizer, "12345", " ")
    first_key = len(pieces.task) + pieces.key_at[0]  # the first key digit when nothing precedes the needle
    after_needle = len(pieces.needle) - pieces.key_at[1] + len(pieces.question)  # second key's start to the answer
    counts = {"rows": 0, "long": 0, "start": 0, "start_long": 0, "end": 0, "end_long": 0, "open": 0, "open_long": 0}
    for step in range(recipe.train.steps):
        for row in range(recipe.train.batch_size):
            _, kind, scored = batches.row(step, 0, row)
            if kind != "passkey":
                continue
            prompt = scored[-1] + 1 - KEY_DIGITS
            is_long = prompt >= long
            start, end = scored[0] == first_key, prompt - scored[KEY_DIGITS] == after_needle
            opens = scored[0] == pieces.key_at[0]  # the row opens with the needle
            counts["rows"] += 1
            counts["long"] += is_long
            counts["start"] += start
            counts["start_long"] += start and is_long
            counts["end"] += end
            counts["end_long"] += end and is_long
            counts["open"] += opens
            counts["open_long"] += opens and is_long
    shares = {f"{key}_share": round(value / counts["rows"], 4) for key, value in counts.items() if key != "rows"}
    print(json.dumps({"recipe": recipe_file, "long_from": long, **counts, **shares}), flush=True)


if __name__ == "__main__":
    main()
