"""A random LlamaForCausalLM and a word-level tokenizer that adds a BOS, saved offline
(the ``hf:`` tests and the API's model-in-memory tests share it)."""

from __future__ import annotations

from pathlib import Path

import torch

MAX_POSITIONS = 48
WORDS = 60


def save_tiny_llama(folder: Path, *, hidden: int = 32, max_positions: int = MAX_POSITIONS, seed: int = 0) -> Path:
    """Words ``w0`` … ``w59``; weights scaled up from the init, so argmaxes are not ties."""
    import tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(WORDS)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")
    tok.post_processor = tokenizers.processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    wrapped.save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=len(vocab), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
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
