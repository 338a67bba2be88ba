"""Models as users write them, for the tests of ``bamctl.backends.module``: a nanoGPT-style module
(written here, in nanoGPT's shape), x-transformers' own ``TransformerWrapper``, and the plain loops a
user would write around a module's forward (the references the tests hold bamctl to; they use
nothing of bamctl's engine)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    block_size: int = 256
    vocab_size: int = 50304  # GPT-2's 50,257 padded to a multiple of 64, as nanoGPT does
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.n_head, self.n_embd = config.n_head, config.n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(config.n_embd), CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = nn.Sequential(nn.Linear(config.n_embd, 4 * config.n_embd), nn.GELU(), nn.Linear(4 * config.n_embd, config.n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's model, cut to inference: learned positions up to block_size, every position's logits."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte, self.wpe = nn.Embedding(config.vocab_size, config.n_embd), nn.Embedding(config.block_size, config.n_embd)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # a trained model's logits are spread far apart; a random one's are all near 0
        nn.init.normal_(self.lm_head.weight, std=2.0)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def gpt2_encoding():
    """A tiktoken ``Encoding`` of GPT-2, built as a user would from the ranks bamctl ships."""
    import tiktoken

    from bamctl.tokenizer import GPT2_PATTERN, GPT2_RANKS, GPT2_SHA256, read_bpe_ranks

    ranks = read_bpe_ranks(GPT2_RANKS, GPT2_SHA256)
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": len(ranks)}, explicit_n_vocab=len(ranks) + 1)


def nanogpt(seed: int = 0, **config) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(**config)).eval()


def x_transformer(pe: str, seed: int = 0, vocab: int = 50257):
    """x-transformers' own decoder, small, with ALiBi or RoPE (no absolute positions)."""
    from x_transformers import Decoder, TransformerWrapper

    torch.manual_seed(seed)
    positions = {"alibi": dict(alibi_pos_bias=True, alibi_num_heads=2), "rope": dict(rotary_pos_emb=True)}[pe]
    model = TransformerWrapper(num_tokens=vocab, max_seq_len=128, use_abs_pos_emb=False,
                               attn_layers=Decoder(dim=32, depth=2, heads=2, **positions))
    nn.init.normal_(model.to_logits.weight, std=2.0)
    return model.eval()


def x_transformers_step(model, ids, cache):
    """x-transformers' own KV cache as the cached protocol's step: only the new tokens go in."""
    return model(ids, cache=cache, return_intermediates=True, input_not_include_cache=True, cache_age=ids.shape[1])


# -- the plain loops a user writes around a forward ------------------------------------------------


def logits_of(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        out = model(torch.tensor([ids]))
    return (out if isinstance(out, torch.Tensor) else out[0])[0].float()  # (T, V)


def plain_continuation(model, prompt: list[int], target: list[int]) -> tuple[list[int], list[float]]:
    """Argmax and log-probs of each target token after the prompt, one forward."""
    logprobs = torch.log_softmax(logits_of(model, prompt + target[:-1])[len(prompt) - 1:], dim=-1)
    return logprobs.argmax(-1).tolist(), logprobs.gather(1, torch.tensor(target)[:, None])[:, 0].tolist()


def plain_greedy(model, prompt: list[int], budget: int, stop_id: int | None) -> list[int]:
    out: list[int] = []
    while len(out) < budget:
        token = int(logits_of(model, prompt + out)[-1].argmax())
        out.append(token)
        if token == stop_id:
            break
    return out


def plain_nll(model, ids: list[int]) -> torch.Tensor:
    """NLL of ids[1:], each given the ids before it."""
    return F.cross_entropy(logits_of(model, ids)[:-1], torch.tensor(ids[1:]), reduction="none")
