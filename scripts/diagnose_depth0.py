"""Why a needle at depth 0 is missed at long context: where bam-ssmax attends while it copies the key.

    python scripts/diagnose_depth0.py --length 64k --depths 0.0,0.02,0.5 --samples 4           # where the answer starts
    python scripts/diagnose_depth0.py --length 64k --depths 0.0,0.02 --draws 100/0 --per-digit  # each digit's copy

Development seeds only (100 and 101; the held-out ones stay unseen). One JSON line per prompt
(or per answer digit with ``--per-digit``), protocol ``exact`` as the claims table runs it:

- default: the teacher-forced prediction and, per layer and head, the attention weight that the
  last prompt token (it predicts the key's first digit) puts on the key's tokens (both copies)
  and on the 30 tokens of the instruction;
- ``--per-digit``: for each answer digit k = 1..4, fed teacher-forced, the weight that the query
  predicting digit k + 1 puts on each digit token of both copies of the key, per layer and head.
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
    args = parser.parse_args()

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


if __name__ == "__main__":
    main()
