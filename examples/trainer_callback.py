"""Perplexity at growing lengths every N steps of a ``transformers`` Trainer run: a
``TrainerCallback`` that hands the model being trained, still in memory, to ``bamctl.evaluate``.

    python examples/trainer_callback.py --model PATH/TO/HF/MODEL --steps 200 --every 50 \\
        --lengths 512..4k --text my_training_text.txt

``--model`` is a local Hugging Face causal LM folder (``save_pretrained`` output, with its
tokenizer) or a Hub id already in the Hugging Face cache; it is fine-tuned on windows of
``--text`` (default: bamctl's shipped training text). Each evaluated step's weights are a
model of their own in the results directory (identity: the hash of its state dict and
config), so a rerun reads finished steps back instead of computing them again. The model
leaves each evaluation in train mode, on its device, in its dtype, as it came.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainerCallback, TrainingArguments

import bamctl


class ExtrapolationCallback(TrainerCallback):
    """Every ``every`` steps: sliding-window perplexity at ``lengths`` of the model as it is now."""

    def __init__(self, tokenizer, every: int, lengths: str, results_dir: str, corpus: str | None = None):
        self.tokenizer, self.every, self.lengths, self.dir, self.corpus = tokenizer, every, lengths, results_dir, corpus
        self.curve: dict[int, dict[int, float]] = {}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every:
            return
        rows = bamctl.evaluate((model, self.tokenizer), "ppl", lengths=self.lengths, corpus=self.corpus,
                               names=f"step-{state.global_step}", dir=self.dir, quiet=True)
        per_length = rows.groupby("length")[["nll", "n_scored"]].sum()  # a cell's perplexity: exp(sum nll / sum n)
        self.curve[state.global_step] = dict(np.exp(per_length["nll"] / per_length["n_scored"]))
        print(f"step {state.global_step}: perplexity "
              + ", ".join(f"{length}: {ppl:,.1f}" for length, ppl in self.curve[state.global_step].items()), flush=True)


class Windows(torch.utils.data.Dataset):
    """Consecutive windows of ``length`` tokens of one text, each its own next-token target."""

    def __init__(self, ids: list[int], length: int):
        self.ids, self.length = ids, length

    def __len__(self) -> int:
        return max(len(self.ids) // self.length, 1)

    def __getitem__(self, i: int) -> dict:
        window = torch.tensor(self.ids[i * self.length : (i + 1) * self.length])
        return {"input_ids": window, "labels": window.clone()}


def training_text(path: str | None) -> str:
    if path is not None:
        return Path(path).read_text(encoding="utf-8")
    from bamctl.tasks.texts import shipped_corpus

    return shipped_corpus("train").text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="local Hugging Face model folder, or a cached Hub id")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=50, help="evaluate every N steps")
    parser.add_argument("--train-length", type=int, default=256, help="tokens per training window")
    parser.add_argument("--lengths", default="512..4k", help="evaluation lengths")
    parser.add_argument("--text", help="training text (UTF-8); default: bamctl's shipped training text")
    parser.add_argument("--corpus", help="evaluation text (UTF-8); default: bamctl's shipped perplexity corpus")
    parser.add_argument("--dir", default="results-trainer", help="results directory")
    args = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(args.model, local_files_only=True)
    ids = tokenizer(training_text(args.text), add_special_tokens=False)["input_ids"]
    callback = ExtrapolationCallback(tokenizer, args.every, args.lengths, args.dir, args.corpus)
    trainer = Trainer(
        model=model,
        args=TrainingArguments(output_dir=str(Path(args.dir) / "trainer"), max_steps=args.steps, per_device_train_batch_size=4,
                               learning_rate=1e-3, logging_steps=max(args.every, 1), save_strategy="no", report_to=[],
                               use_cpu=not torch.cuda.is_available()),
        train_dataset=Windows(ids, args.train_length),
        callbacks=[callback],
    )
    trainer.train()


if __name__ == "__main__":
    main()
