"""``hf:`` against its peers on the same model and tokens, at equal batch size.

Two measurements on one random Llama (saved offline in a temporary folder, a word-level
tokenizer, random-word text), each side alternating in one process, best of ``--repeats``:

1. **Rolling perplexity**: ``bamctl`` ``--task ppl --protocol sliding`` (stride = window)
   against lm-evaluation-harness's ``HFLM.loglikelihood_rolling`` with ``max_length`` =
   window - 1, over the same documents (bamctl's seed-chosen documents, decoded and handed
   to lm-eval), with ``--batch-size`` / ``batch_size`` B on both sides. lm-eval scores one
   more token per document (its first, after a prefix token); the total NLLs are printed
   side by side, and tests/test_fidelity_ppl.py holds the exact equality on aligned input.
2. **Greedy generation**: ``HFBackend.generate_many`` against a plain ``transformers``
   loop (left-padded batches of B, ``model.generate(do_sample=False)``) on the same
   prompts, the same new-token budget; both sides' tokens are checked equal.

    OMP_NUM_THREADS=1 python bench/hf_peers.py --batch-sizes 1,8
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import torch


def build_model(folder: Path, words: int, hidden: int, layers: int, max_positions: int):
    import tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(words)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<unk>")
    wrapped.save_pretrained(folder)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=max_positions,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    return wrapped


def best_of(repeats: int, run) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - start)
    return best, result


def rolling_ppl(folder: Path, corpus: Path, window: int, documents: int, doc_tokens: int, batch: int, repeats: int) -> str:
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoTokenizer, LlamaForCausalLM

    from bamctl.backends import RunOptions, open_backend
    from bamctl.evaluation import Evaluation, TaskRequest
    from bamctl.results import ResultStore

    backend = open_backend(f"hf:{folder}", RunOptions(device="cpu", bos="never"))
    request = TaskRequest("ppl", [window], samples=documents, seeds=[0],
                          options={"corpus_path": str(corpus), "stride": window, "doc_tokens": doc_tokens})

    def ours():
        with tempfile.TemporaryDirectory() as out:
            return Evaluation(backend, request, ResultStore(Path(out)), model_name="m").run(batch_size=batch).rows

    ours_s, rows = best_of(repeats, ours)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    text = corpus.read_text().split()
    starts = sorted({r["document_start"] for r in rows})
    texts = [" ".join(text[s : s + doc_tokens]) for s in starts]
    model = LlamaForCausalLM.from_pretrained(str(folder), local_files_only=True).eval()
    lm = HFLM(pretrained=model, tokenizer=tokenizer, max_length=window - 1, batch_size=batch, device="cpu", add_bos_token=False)
    instances = [Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(texts)]
    theirs_s, loglikelihoods = best_of(repeats, lambda: lm.loglikelihood_rolling(instances, disable_tqdm=True))
    tokens = documents * doc_tokens
    return (f"| rolling perplexity, {documents} documents x {doc_tokens:,} tokens, window {window} | {batch} | "
            f"{ours_s:.2f} | {theirs_s:.2f} (lm-eval) | {ours_s / theirs_s:.2f} | {tokens / ours_s:,.0f} | "
            f"{sum(r['nll'] for r in rows):,.1f} / {-sum(loglikelihoods):,.1f} |")


def generation(folder: Path, prompts: list[list[int]], new_tokens: int, batch: int, repeats: int) -> str:
    from transformers import LlamaForCausalLM

    from bamctl.backends import RunOptions, open_backend

    backend = open_backend(f"hf:{folder}", RunOptions(device="cpu", bos="never"))

    def ours():
        out = []
        for lo in range(0, len(prompts), batch):
            out += backend.generate_many(prompts[lo : lo + batch], new_tokens)
        return out

    model = LlamaForCausalLM.from_pretrained(str(folder), local_files_only=True).eval()

    @torch.inference_mode()
    def theirs():
        out = []
        for lo in range(0, len(prompts), batch):
            group = prompts[lo : lo + batch]
            width = max(map(len, group))
            ids = torch.tensor([[0] * (width - len(p)) + p for p in group])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
            made = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                  eos_token_id=2, pad_token_id=0)
            for row in made[:, width:].tolist():
                out.append(row[: row.index(2) + 1] if 2 in row else row)
        return out

    ours_s, a = best_of(repeats, ours)
    theirs_s, b = best_of(repeats, theirs)
    same = sum(x == y for x, y in zip(a, b))
    tokens = sum(map(len, prompts))
    return (f"| greedy generation, {len(prompts)} prompts x {len(prompts[0]):,} tokens, {new_tokens} new | {batch} | "
            f"{ours_s:.2f} | {theirs_s:.2f} (transformers) | {ours_s / theirs_s:.2f} | {tokens / ours_s:,.0f} | "
            f"{same}/{len(prompts)} same tokens |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--documents", type=int, default=8)
    parser.add_argument("--doc-tokens", type=int, default=4096)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    words = 2000
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "llama"
        build_model(folder, words, args.hidden, args.layers, max_positions=8192)
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text(" ".join(f"w{rng.randrange(words)}" for _ in range(args.documents * args.doc_tokens * 2)))
        prompts = [[rng.randrange(3, words + 3) for _ in range(args.prompt_tokens)] for _ in range(args.prompts)]
        print(f"{torch.get_num_threads()} threads; random Llama, hidden {args.hidden}, {args.layers} layers; best of {args.repeats}")
        print("| measurement | batch | bamctl s | peer s | bamctl / peer | bamctl tokens/s | check |")
        print("|---|---|---|---|---|---|---|")
        for batch in map(int, args.batch_sizes.split(",")):
            print(rolling_ppl(folder, corpus, args.window, args.documents, args.doc_tokens, batch, args.repeats), flush=True)
            print(generation(folder, prompts, args.new_tokens, batch, args.repeats), flush=True)


if __name__ == "__main__":
    main()
