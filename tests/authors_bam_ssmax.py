"""The BAM authors' ``bam_ssmax`` model as their repository lays it out, restated for tests.

Their code cannot be vendored, so this module restates, in our own words, ``models/bam_ssmax.py``
of their repository at commit 6002881fe789589fea3f9b1f0edea795b11ec2f3 (2025-05-30, the last one
with the ``ssmax_prior`` switch): the ``SSMaxBATModelArgs`` fields and defaults, the module tree
and parameter names (so ``state_dict()`` has their keys and shapes: ``prior.shape/scale/loc``
and ``seq_scale`` as ``(1, H, 1, 1)``, a global ``prior.*`` or one per layer), and the forward
pass, which at that commit is already a dense matmul and softmax (no FlexAttention to replace).

``scaled_distance=True`` gives the prior of their code before 2025-05-08,
``-(|(d - mu) e^scale| + eps)^shape``; with ``ssmax_prior=False`` and without the
``ssmax_prior`` field in args.json, that is their ``bam_ssmax`` of April 2025 (e.g. commit
1a667fa), which scaled the content score only.

``save_like_train_py`` writes ``model.pt`` + ``args.json`` as their ``train.py`` and
``utils.StateMonitor`` do at that commit.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class SSMaxBATModelArgs:
    """Their dataclass's fields and defaults (``vars()`` of it is args.json's ``model_args``)."""

    dim: int = 1024
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int | None = None
    vocab_size: int = 32768
    multiple_of: int = 1
    ffn_dim_multiplier: float | None = None
    norm_eps: float = 1e-5
    max_batch_size: int = 32
    max_seq_len: int = 1024
    shape_init: float | str = 1
    scale_init: float | str = "slope"
    loc_init: float = 0
    train_shape: bool = True
    train_scale: bool = True
    train_loc: bool = False
    global_positional_encoding: bool = True
    seq_scale: bool = True
    ssmax_prior: bool = True


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def alibi_slopes(n: int) -> list[float]:
    """Their scale init 'slope' (ALiBi's geometric slopes; heads a power of two here)."""
    first = 2 ** (-(2 ** -(math.log2(n) - 3)))
    return [first ** (i + 1) for i in range(n)]


class AttentionPrior(nn.Module):
    """``prior.shape`` (beta), ``prior.scale`` (log alpha), ``prior.loc`` (theta_mu): each (1, H, 1, 1)."""

    def __init__(self, args: SSMaxBATModelArgs, scaled_distance: bool = False):
        super().__init__()
        self.eps = 1e-5
        self.scaled_distance = scaled_distance
        heads = (1, args.n_heads, 1, 1)
        scale = torch.tensor(alibi_slopes(args.n_heads)).reshape(heads) if args.scale_init == "slope" else 1 / torch.full(heads, float(args.scale_init))
        self.shape = nn.Parameter(torch.full(heads, float(args.shape_init)) if args.train_shape else torch.ones(heads), requires_grad=args.train_shape)
        self.scale = nn.Parameter(scale.log(), requires_grad=args.train_scale)
        self.loc = nn.Parameter(torch.full(heads, float(args.loc_init)), requires_grad=args.train_loc)

    def forward(self, n: int) -> torch.Tensor:
        """(1, H, n, n): entry [query i, key j] is the prior of key offset j - i."""
        positions = torch.arange(n, device=self.scale.device).float()
        offset = (positions[None, :] - positions[:, None]).reshape(1, 1, n, n) - (self.loc.exp() - (-self.loc).exp())
        if self.scaled_distance:
            return -(((offset * self.scale.exp()).abs() + self.eps) ** self.shape)
        return -((offset.abs() + self.eps) ** self.shape) * self.scale.exp()


class BayesianAttention(nn.Module):
    def __init__(self, args: SSMaxBATModelArgs, scaled_distance: bool):
        super().__init__()
        self.n_heads = args.n_heads
        self.n_kv_heads = args.n_kv_heads or args.n_heads
        self.head_dim = args.dim // args.n_heads
        self.ssmax_prior = args.ssmax_prior
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)
        self.local_prior = not args.global_positional_encoding
        if self.local_prior:
            self.prior = AttentionPrior(args, scaled_distance)
        self.seq_scale = nn.Parameter(torch.ones(1, args.n_heads, 1, 1), requires_grad=args.seq_scale)

    def forward(self, x, mask, shared_prior, log_keys):
        b, t, _ = x.shape
        repeat = self.n_heads // self.n_kv_heads
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.n_kv_heads, self.head_dim).repeat_interleave(repeat, dim=2).transpose(1, 2)
        v = self.wv(x).view(b, t, self.n_kv_heads, self.head_dim).repeat_interleave(repeat, dim=2).transpose(1, 2)
        scores = q @ k.transpose(2, 3) / math.sqrt(self.head_dim)
        if not self.ssmax_prior:  # SSMax on the content score, the prior added after
            scores = scores * (log_keys * self.seq_scale)
        scores = scores + (self.prior(t) if self.local_prior else shared_prior)
        if self.ssmax_prior:  # SSMax on content score and prior together
            scores = scores * (log_keys * self.seq_scale)
        weights = F.softmax((scores + mask).float(), dim=-1).type_as(q)
        return self.wo((weights @ v).transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, args: SSMaxBATModelArgs):
        super().__init__()
        hidden = int(args.ffn_dim_multiplier * args.dim) if args.ffn_dim_multiplier is not None else args.dim
        hidden = args.multiple_of * ((hidden + args.multiple_of - 1) // args.multiple_of)
        self.w1 = nn.Linear(args.dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, args.dim, bias=False)
        self.w3 = nn.Linear(args.dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: SSMaxBATModelArgs, scaled_distance: bool):
        super().__init__()
        self.attention = BayesianAttention(args, scaled_distance)
        self.feed_forward = FeedForward(args)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)

    def forward(self, x, mask, shared_prior, log_keys):
        h = x + self.attention(self.attention_norm(x), mask, shared_prior, log_keys)
        return h + self.feed_forward(self.ffn_norm(h))


class SSMaxBATransformer(nn.Module):
    def __init__(self, args: SSMaxBATModelArgs, scaled_distance: bool = False):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args, scaled_distance) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.global_positional_encoding:
            self.prior = AttentionPrior(args, scaled_distance)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) -> logits (B, T, V), float32: one dense causal pass (no document codes)."""
        t = tokens.shape[1]
        h = self.tok_embeddings(tokens)
        mask = torch.triu(torch.full((t, t), float("-inf"), device=tokens.device), diagonal=1)
        log_keys = torch.arange(1, t + 1, device=tokens.device).float().log().reshape(1, 1, t, 1)  # keys query i sees
        shared = self.prior(t) if self.args.global_positional_encoding else None
        for layer in self.layers:
            h = layer(h, mask, shared, log_keys)
        return self.output(self.norm(h)).float()


def randomise(model: nn.Module, seed: int) -> None:
    """Weights that make every part matter: priors spread across heads (inverted ones too), SSMax
    scales away from 1, norms away from 1; projections small enough (std 0.2) that logits stay a
    few units, where float32 rounds below 1e-5."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("prior.shape"):
                p.copy_(torch.rand(p.shape, generator=g) * 2.2 - 0.7)
            elif name.endswith("prior.scale"):
                p.copy_(torch.rand(p.shape, generator=g) * 3 - 2)
            elif name.endswith("prior.loc"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif name.endswith("seq_scale"):
                p.copy_(1 + torch.randn(p.shape, generator=g) * 0.3)
            elif name.endswith("norm.weight"):
                p.copy_(1 + torch.randn(p.shape, generator=g) * 0.1)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 if "tok_embeddings" in name else 0.2))


def train_py_args(sequence_length: int, **overrides) -> dict:
    """``vars(args)`` of their train.py at that commit (its command-line arguments and defaults)."""
    args = {
        "dataset": "10B", "log_dir": "logs", "position_encoding": "bam_ssmax", "model_size": "l12", "global_prior": True,
        "shape_init": 1, "scale_init": "slope", "loc_init": 0, "shape_trainable": True, "scale_trainable": True,
        "loc_trainable": True, "shape_lr": 1e-3, "scale_lr": 1e-3, "loc_lr": 1e-3, "no_seq_scale": None,
        "laplace_uniform_heads": 1, "batch_size": 4, "sequence_length": sequence_length, "min_tokens_per_step": None,
        "tokens_per_step": 589824, "max_tokens_per_step": None, "num_iterations": 1000, "inference_only": False,
        "learning_rate": 1e-3, "warmup_iters": 0, "learning_rate_decay_frac": 0.1, "weight_decay": 0.1, "grad_clip": 1.0,
        "min_val_tokens": None, "val_tokens": 4096, "max_val_tokens": None, "val_tokens_padding": 1_000_000,
        "val_loss_every": 32, "sample_every": 0, "overfit_single_batch": False, "tensorcores": True, "device": "",
        "compile": True, "dtype": "bfloat16",
    }
    return {**args, **overrides}


def save_like_train_py(model: SSMaxBATransformer, folder: Path, args: dict, prefix: str = "", drop: tuple[str, ...] = ()) -> None:
    """``model.pt`` (the state dict, on the CPU, keys behind DDP's ``module.`` and/or compile's
    ``_orig_mod.`` when ``prefix`` says so) and ``args.json`` (args, dataset_args, model_args);
    ``drop``: model_args fields the dataclass of an earlier commit did not have yet."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({prefix + k: v.cpu() for k, v in model.state_dict().items()}, folder / "model.pt")
    model_args = {k: v for k, v in vars(model.args).items() if k not in drop}
    dataset_args = {"tokens_per_batch": args["tokens_per_step"], "val_tokens": args["val_tokens"]}
    with open(folder / "args.json", "w") as handle:
        json.dump({"args": args, "dataset_args": dataset_args, "model_args": model_args}, handle, indent=4)
