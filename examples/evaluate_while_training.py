"""An extrapolation curve every N steps of a plain PyTorch training loop, with ``bamctl.evaluate``.

A small BAM + SSMax model learns the shipped training text at 128 tokens; every ``--every``
steps the model, still in memory, is evaluated on sliding-window perplexity at 1x, 2x and 4x
its training length, and the curve is printed. Nothing is saved: each step's weights are a
model of their own in the results directory (its identity is the hash of its state dict),
so a step evaluated twice is read back, not computed again.

    python examples/evaluate_while_training.py --steps 300 --every 100

On a laptop CPU this takes a few minutes; ``--steps 4 --every 2`` is a smoke test.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F

import bamctl
from bamctl.checkpoint import new_random_model
from bamctl.model import ModelConfig
from bamctl.tokenizer import get_tokenizer
from bamctl.train.data import shipped_text_tokens

TRAIN_LENGTH = 128


def batches(batch_size: int, seed: int):
    """Random windows of the shipped training text (not the evaluation corpus), next-token targets."""
    tokens = shipped_text_tokens(get_tokenizer("gpt2"), "train")
    rng = np.random.default_rng(seed)
    while True:
        rows = np.stack([tokens.window(TRAIN_LENGTH + 1, u) for u in rng.random(batch_size)])
        rows = torch.from_numpy(rows)
        yield rows[:, :-1], rows[:, 1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=100, help="evaluate every N steps")
    parser.add_argument("--dir", default="results-while-training", help="results directory")
    parser.add_argument("--lengths", default="128..512", help="evaluation lengths")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = new_random_model(ModelConfig.from_preset("micro", "bam-ssmax", train_length=TRAIN_LENGTH), seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = batches(batch_size=8, seed=0)
    curve = {}
    for step in range(1, args.steps + 1):
        inputs, targets = next(data)
        logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % args.every == 0 or step == args.steps:
            rows = bamctl.evaluate(model, "ppl", lengths=args.lengths, names=f"step-{step}", dir=args.dir, quiet=True)
            per_length = rows.groupby("length")[["nll", "n_scored"]].sum()  # a cell's perplexity: exp(sum nll / sum n)
            curve[step] = np.exp(per_length["nll"] / per_length["n_scored"])
            print(f"step {step}: training loss {loss.item():.3f}; perplexity "
                  + ", ".join(f"{length}: {ppl:,.1f}" for length, ppl in curve[step].items()), flush=True)


if __name__ == "__main__":
    main()
