"""A random LlamaForCausalLM and a tokenizer that adds a BOS, saved offline (the ``hf:`` and
``vllm:`` tests and the API's model-in-memory tests share it).

Two vocabularies: ``words`` (``w0`` … ``w59``, one id each: requests written by hand) and
``bpe`` (a 1,024-id byte-level BPE trained here on bamctl's shipped essays, so the tasks'
own prompts, digits included, tokenise as a real model's would; training is deterministic)."""

from __future__ import annotations

from pathlib import Path

import torch

MAX_POSITIONS = 48
WORDS = 60
BPE_IDS = 1024
SPECIALS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2 in both vocabularies


def _words_tokenizer():
    import tokenizers

    vocab = {**{name: i for i, name in enumerate(SPECIALS)}, **{f"w{i}": i + 3 for i in range(WORDS)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")
    return tok


def _bpe_tokenizer():
    import tokenizers

    essays = Path(__file__).resolve().parents[1] / "bamctl" / "data" / "tasks" / "texts" / "essays"
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=BPE_IDS, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train(sorted(str(path) for path in essays.glob("*.txt")), trainer)
    return tok


def save_tiny_llama(folder: Path, *, hidden: int = 32, max_positions: int = MAX_POSITIONS, seed: int = 0,
                    vocab: str = "words") -> Path:
    """Weights scaled up from the init, so argmaxes are not ties. ``hidden`` over 4 heads is the
    head size (vLLM's CPU attention takes 64, not 8 or 16)."""
    import tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = {"words": _words_tokenizer, "bpe": _bpe_tokenizer}[vocab]()
    tok.post_processor = tokenizers.processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    wrapped.save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(8.0 if p.dim() > 1 else 1.0)
    model.save_pretrained(folder)
    return folder
