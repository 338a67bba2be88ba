"""The decoder we benchmark: one file, read top to bottom.

Architecture of the BAM authors' code (Llama-style): RMSNorm before attention and MLP,
SwiGLU MLP, no linear biases, an untied output head (``tie_embeddings`` ties it). Parameter names follow theirs
(``tok_embeddings``, ``layers.N.attention.wq``, ``feed_forward.w1``…) so their
checkpoints load by a name mapping alone. The positional encoding is a registry entry
(``bamctl.positional``); the attention kernel is chosen by the caller
(``bamctl.engine``): dense for training and as the reference; native, fused,
blockwise or flex for long contexts.

Shapes: B batch, T tokens in this chunk, H heads, Dh head dim, C model dim.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

import torch
import torch.nn.functional as F
from torch import nn

from bamctl.attention_math import AttentionInputs, dense_attention, depends_on_content
from bamctl.errors import BamctlError, did_you_mean
from bamctl.pe_plugins import parse_pe_name, pe_spec
from bamctl.positional import PE_REGISTRY, SINUSOIDAL_LAYOUTS, RopeScaling, pe_label
from bamctl.positional import check_distance_table


@dataclass
class ModelConfig:
    vocab_size: int = 50257  # GPT-2 BPE; the authors use Mistral's 32,768
    dim: int = 128  # C
    n_layers: int = 2
    n_heads: int = 4
    ffn_dim_multiplier: float = 2.0  # SwiGLU hidden = multiplier * dim, as in the authors' presets
    norm_eps: float = 1e-5
    pe: str = "bam"  # a key of bamctl.positional.PE_REGISTRY, or a plugin's reference (FILE.py:CLASS, module:CLASS, an entry point)
    ssmax: bool = False  # Scalable-Softmax on top of the PE
    ssmax_scope: str = "logits"  # "logits": (content + prior) * s log n; "content": the authors' code
    ssmax_init: float = 1.0  # SSMax's s_h before training (the SSMax paper's 1); the trained weights hold s
    # SSMax's factor with a learned bias per head, s_h log n + b_h (the SSMax paper's variant; b_h from 0):
    # a head that needs one sharpness at every length can hold it in b_h with s_h near 0.
    ssmax_bias: bool = False
    rope_base: float = 10000.0
    sinusoidal_base: float = 10000.0
    # "vaswani": cos channel 2k+1 at the frequency of sin channel 2k; "bam": at its own
    # frequency base^(-(2k+1)/dim), as the authors' code does (their checkpoints need it).
    sinusoidal_layout: str = "vaswani"
    # "flat" (theta = 0, the authors' latest), "alibi" (beta = 1, ALiBi slopes) or
    # "alibi-linear" (ALiBi slopes, beta spread 0..1 across heads: the authors' shape_init "linear")
    bam_init: str = "flat"
    # Token embeddings are multiplied by this before anything is added to them. Vaswani et
    # al. (2017, section 3.4) use sqrt(dim), so that absolute sinusoids do not swamp them.
    embedding_scale: float = 1.0
    # The output head is the token embedding matrix (Press & Wolf, 2017). In a tiny model with a
    # large vocabulary the head is most of the weights: tying halves a 4,000-id LM reference.
    tie_embeddings: bool = False
    bam_train_mu: bool = False  # the prior's location stays at 0 unless asked
    # "released": -(|d - mu| + eps)^beta e^alpha (the authors' training and released code);
    # "scaled_distance": -(|(d - mu) e^alpha| + eps)^beta (their evaluation code of mid-2025)
    bam_prior_form: str = "released"
    train_length: int = 512  # context the model was trained on: the unit of "extrapolation x"
    tokenizer: str = "gpt2"
    # Tokenizer ids this model has rows for (bamctl.vocab.VocabSubset), plus one UNK row;
    # None: one row per tokenizer id. Lets tiny reference models stay tiny.
    token_subset: list[int] | None = None
    # A plugin PE's record (bamctl.pe_plugins.pe_spec): where it was found, its file's digest and text;
    # None for the zoo's. A checkpoint whose plugin file no longer holds that text does not load.
    pe_source: dict | None = None

    def __post_init__(self):
        if self.pe not in PE_REGISTRY:
            if self.pe_source is None and parse_pe_name(self.pe) != (self.pe, False):  # raises with close matches
                raise BamctlError(f"pe {self.pe!r}: SSMax is the ssmax field, not a suffix of pe")
            spec = pe_spec(self.pe, self.pe_source)  # a plugin: found where recorded, and checked against its digest
            if self.pe_source is None:
                self.pe_source = spec.source
        if self.dim % self.n_heads or (self.dim // self.n_heads) % 2:
            raise BamctlError(f"dim {self.dim} must split into {self.n_heads} heads of even size")
        if self.sinusoidal_layout not in SINUSOIDAL_LAYOUTS:
            raise BamctlError(f"sinusoidal_layout must be one of {', '.join(SINUSOIDAL_LAYOUTS)}, not {self.sinusoidal_layout!r}")
        if not self.embedding_scale > 0:
            raise BamctlError(f"embedding_scale must be positive, not {self.embedding_scale!r}")
        if not self.ssmax_init > 0:
            raise BamctlError(f"ssmax_init must be positive, not {self.ssmax_init!r}")
        if self.ssmax_bias and not self.ssmax:
            raise BamctlError("ssmax_bias is a part of SSMax's factor: it needs ssmax = true")
        if self.ssmax_scope not in ("logits", "content"):
            raise BamctlError(f"ssmax_scope must be 'logits' or 'content', not {self.ssmax_scope!r}")
        if self.token_subset is not None and self.vocab_size != len(self.token_subset) + 1:
            raise BamctlError(f"vocab_size {self.vocab_size} must be len(token_subset) + 1 = {len(self.token_subset) + 1}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def label(self) -> str:
        return pe_label(self.pe, self.ssmax)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise BamctlError(f"unknown model config fields: {', '.join(sorted(unknown))}")
        return cls(**data)

    @classmethod
    def from_preset(cls, preset: str, pe: str, **overrides) -> "ModelConfig":
        base, ssmax = parse_pe_name(pe)
        if preset not in PRESETS:
            raise BamctlError(f"unknown preset {preset!r}{did_you_mean(preset, PRESETS)}")
        # A new sinusoidal model scales its token embeddings by sqrt(dim), as the PE's paper
        # defines it; the dataclass default stays 1.0 for checkpoints saved before the field.
        config = {**PRESETS[preset], "pe": base, "ssmax": ssmax, **overrides}
        if pe_spec(base).scales_token_embeddings and "embedding_scale" not in overrides:
            config["embedding_scale"] = math.sqrt(config["dim"])
        return cls(**config)


# Named sizes. "tiny"/"small" train on a CPU in minutes; l6…l24 are the authors' sizes
# (their train.py: 16 heads, SwiGLU hidden = 2 x dim).
PRESETS: dict[str, dict] = {
    "micro": dict(dim=64, n_layers=2, n_heads=4),
    "tiny": dict(dim=128, n_layers=2, n_heads=4),
    "small": dict(dim=256, n_layers=4, n_heads=8),
    "l6": dict(dim=512, n_layers=6, n_heads=16),
    "l8": dict(dim=768, n_layers=8, n_heads=16),
    "l12": dict(dim=768, n_layers=12, n_heads=16),
    "l16": dict(dim=1024, n_layers=16, n_heads=16),
    "l24": dict(dim=2048, n_layers=24, n_heads=16),
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hidden = int(cfg.ffn_dim_multiplier * cfg.dim)
        self.w1 = nn.Linear(cfg.dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


@dataclass
class ForwardState:
    """What persists across the chunks of one long input: the kernel, the KV cache, bias tables.

    Positions are not part of it: every call of ``Transformer.hidden`` says where its
    chunk starts. Bias tables are built once per layer and grown only when a chunk
    reaches a distance they do not cover, so a long prefill pays for them once.
    """

    kernel: object = dense_attention  # a kernel of bamctl.attention_math's signature (bamctl.engine: faster ones)
    cache: object | None = None  # bamctl.engine.cache.KVCache, or None: keys = this chunk's
    max_distance: int = 0  # tables cover at least distances 0..max_distance (size them once)
    _tables: dict = field(default_factory=dict)

    def bias_table(self, layer_id: int, prior: nn.Module, needed: int, n_heads: int) -> torch.Tensor:
        """(H, >= needed + 1) prior values b_h(d) for d = 0, 1, ..."""
        table = self._tables.get(layer_id)
        if table is None or table.shape[1] <= needed:
            self.max_distance = max(self.max_distance, needed)
            table = prior.distance_table(self.max_distance)
            # checked in full when the model was built, at a short distance; here its shape, which a
            # table of a bounded length gets wrong at a long one (the kernel's internal error, else),
            # without reading its values (a training step would wait for the GPU on every layer)
            check_distance_table(table, n_heads, self.max_distance, f"positional encoding {type(prior).__qualname__}",
                                 values=False)
            self._tables[layer_id] = table
        return table


@dataclass(frozen=True)
class ChunkPositions:
    """Where one call's chunk sits: its first token's index, and the positions the model is told
    its tokens are at (the token indices, unless the PE's ``position_ids`` hook says otherwise)."""

    start: int
    positions: torch.Tensor  # (T,)
    position_ids: object | None = None  # the PE's hook, token indices (N,) -> positions (N,)

    def up_to(self, end: int) -> torch.Tensor:
        """The positions of tokens 0 .. end - 1: every key a chunk's queries see through the cache."""
        indices = torch.arange(end, device=self.positions.device)
        return indices if self.position_ids is None else self.position_ids(indices)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)
        # The layer's PE module (bamctl.positional): named for the zoo's distance priors, whose
        # parameter names (layers.N.attention.prior.theta_alpha ...) checkpoints keep.
        self.prior = pe_spec(cfg.pe, cfg.pe_source).build(cfg)
        self.transforms_qk = callable(getattr(self.prior, "transform_qk", None))
        self.transforms_after_cache = callable(getattr(self.prior, "transform_qk_after_cache", None))
        self.observes = callable(getattr(self.prior, "observe", None))  # reads the layer's input (a forget gate)
        # SSMax's s_h, one per head and layer, initialised at ssmax_init (1, as in the SSMax paper).
        self.ssmax_scale = nn.Parameter(torch.full((cfg.n_heads,), float(cfg.ssmax_init))) if cfg.ssmax else None
        self.ssmax_bias = nn.Parameter(torch.zeros(cfg.n_heads)) if cfg.ssmax and cfg.ssmax_bias else None  # b_h
        self.ssmax_scope = cfg.ssmax_scope

    def forward(self, x: torch.Tensor, where: ChunkPositions, state: ForwardState, keep_from: int = 0) -> torch.Tensor:
        """Outputs for rows ``keep_from:`` of the chunk; keys and values for all of its rows."""
        B, T, C = x.shape
        Q = T - keep_from  # queries asked for: a suffix of the chunk
        if self.observes:  # the layer's normalised input, every row of every chunk, before any of it is attended
            self.prior.observe(x, where.positions)
        k = self.wk(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)
        v = self.wv(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)
        q = self.wq(x[:, keep_from:]).view(B, Q, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, Q, Dh)
        if self.transforms_qk:  # rotations or scalings by position (RoPE), before the keys are cached
            q, k = self.prior.transform_qk(q, k, where.positions[keep_from:], where.positions)
        if state.cache is not None:
            k, v = state.cache.store(self.layer_id, where.start, k, v)  # (B, H, start+T, Dh)
        elif where.start:
            raise ValueError("a chunk after position 0 needs a KV cache")
        if Q == 0:
            return x[:, T:]  # (B, 0, C): only this chunk's keys and values were wanted
        if self.transforms_after_cache:  # relative to this chunk's queries (xPos's decay), never cached
            q, k = self.prior.transform_qk_after_cache(q, k, where.positions[keep_from:], where.up_to(k.shape[2]))
        last = where.start + T - 1  # the largest distance any query of this chunk sees
        by_query = getattr(self.prior, "query_dependent", False)
        by_content = depends_on_content(self.prior)
        by_distance = callable(getattr(self.prior, "distance_table", None)) and not by_query and not by_content
        inputs = AttentionInputs(
            q_start=where.start + keep_from,
            bias_table=state.bias_table(self.layer_id, self.prior, last, self.n_heads) if by_distance else None,
            ssmax_scale=self.ssmax_scale,
            ssmax_bias=self.ssmax_bias,
            ssmax_scope=self.ssmax_scope,
            query_prior=self.prior if by_query else None,
            content_prior=self.prior if by_content else None,
        )
        y = state.kernel(q, k, v, inputs)  # (B, H, Q, Dh)
        return self.wo(y.transpose(1, 2).reshape(B, Q, C))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg, layer_id)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor, where: ChunkPositions, state: ForwardState, keep_from: int = 0) -> torch.Tensor:
        h = x[:, keep_from:] + self.attention(self.attention_norm(x), where, state, keep_from)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(TransformerBlock(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        first = self.layers[0].attention.prior  # the PE hooks asked once per model, not per layer
        self.embeds = first if callable(getattr(first, "embed", None)) else None
        self.position_ids = first.position_ids if callable(getattr(first, "position_ids", None)) else None
        self._rope_scaling: RopeScaling | None = None
        self.apply(self._init_weights)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight  # one parameter, (V, C) in both roles

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @property
    def rope_scaling(self) -> RopeScaling | None:
        """RoPE scaled at inference (set by the engine for ``--rope-scaling``), given to every layer's PE."""
        return self._rope_scaling

    @rope_scaling.setter
    def rope_scaling(self, scaling: RopeScaling | None) -> None:
        self._rope_scaling = scaling
        for layer in self.layers:
            if hasattr(layer.attention.prior, "rope_scaling"):
                layer.attention.prior.rope_scaling = scaling

    def positions(self, start: int, n_tokens: int) -> ChunkPositions:
        """The positions of a chunk of ``n_tokens`` whose first token is token ``start``."""
        indices = torch.arange(start, start + n_tokens, device=self.output.weight.device)
        positions = indices if self.position_ids is None else self.position_ids(indices)
        return ChunkPositions(start, positions, self.position_ids)

    def hidden(self, tokens: torch.Tensor, start: int, state: ForwardState, keep_from: int = 0) -> torch.Tensor:
        """Final-normed hidden states of a chunk's rows ``keep_from:``. tokens: (B, T) at absolute
        positions ``start .. start + T - 1`` -> (B, T - keep_from, C).

        Earlier layers need every row (later rows attend to them); the last layer only
        the rows asked for, plus every row's keys and values for the cache. Scoring a
        5-token answer after a long prompt thus skips most of the last layer.
        """
        where = self.positions(start, tokens.shape[1])
        h = self.tok_embeddings(tokens) * self.config.embedding_scale  # (B, T, C)
        if self.embeds is not None:  # input embeddings by position (sinusoidal)
            h = self.embeds.embed(h, where.positions)
        for layer in self.layers[:-1]:
            h = layer(h, where, state)
        return self.norm(self.layers[-1](h, where, state, keep_from))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Dense full-sequence logits (B, T, V): the training path and the test reference."""
        return self.output(self.hidden(tokens, 0, ForwardState())).float()

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def cast_keeping_positional(self, dtype: torch.dtype) -> "Transformer":
        """Every floating-point tensor in ``dtype`` but the priors (parameters and buffers) and the
        SSMax scales, which are never cast: as under autocast, which never casts parameters, they
        keep their float32 values (a round trip through bfloat16 would round them)."""
        kept = {id(t) for name, t in [*self.named_parameters(), *self.named_buffers()] if _is_positional(name)}
        for module in self.modules():
            for name, param in module.named_parameters(recurse=False):
                if id(param) not in kept and param.is_floating_point():
                    param.data = param.data.to(dtype)
            for name, buffer in module.named_buffers(recurse=False):
                if id(buffer) not in kept and buffer.is_floating_point():
                    setattr(module, name, buffer.to(dtype))
        return self

    def positional_parameters(self) -> list[nn.Parameter]:
        """theta_alpha, theta_beta, theta_mu and SSMax s: trained without weight decay."""
        return [p for n, p in self.named_parameters() if _is_positional(n)]


def _is_positional(name: str) -> bool:
    """A prior's parameter or buffer, or an SSMax scale or bias, by its name in the state dict."""
    return ".prior." in name or name.endswith(("ssmax_scale", "ssmax_bias"))
