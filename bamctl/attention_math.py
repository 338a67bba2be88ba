"""The attention logits every part of bamctl agrees on: the model, its priors and the engine's kernels.

Every kernel computes, for query ``i`` (absolute position) and key ``j <= i``:

    s_ij = q_i . k_j / sqrt(Dh)
    l_ij = (s_ij + b_h(i - j)) * c_h(i)     SSMax over the logits (``ssmax_scope="logits"``)
    l_ij =  s_ij * c_h(i) + b_h(i - j)      SSMax over the content only (the authors' code)
    l_ij =  s_ij + b_h(i - j)               without SSMax

with ``b_h`` read from a per-head table ``(H, max_distance + 1)`` (or, for a prior that
depends on the query's position too, FIRE's, ``b_h(i, j)`` asked of the prior) and
``c_h(i) = s_h * log(i + 1)`` (i + 1 keys are visible to query i). Keys always start at
absolute position 0 (a KV cache); queries start at ``q_start``.

The inputs a kernel takes (``AttentionInputs``, ``PiecewiseBias``) and the plain dense
reference (``dense_attention``), which the model runs by default and every faster path of
``bamctl.engine`` is tested against, live here, below the model, the priors
(``bamctl.positional``) and the engine, and import nothing of bamctl.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Protocol

import torch


@dataclass(frozen=True)
class PiecewiseBias:
    """A query-dependent bias in the form a kernel can compute pair by pair:

        b_h(i, j) = slopes[h, s] * x + offsets[h, s],   x = line[i - j] / query_norm[i - q_start],

    with ``s`` the number of ``breaks`` strictly below ``x`` (``torch.bucketize``). ``line`` is
    increasing in the distance, so along a query's keys ``x`` is monotone and each piece covers
    one run of keys. FIRE is such a bias (``FIREPrior.kernel_form``).
    """

    line: torch.Tensor  # (D+1,) float32, ψ(d) for d = 0..D, shared by the heads
    query_norm: torch.Tensor  # (Tq,) float32, > 0: each query's divisor
    breaks: torch.Tensor  # (m,) float32, sorted
    slopes: torch.Tensor  # (H, m+1) float32
    offsets: torch.Tensor  # (H, m+1) float32


@dataclass(frozen=True)
class AttentionInputs:
    """Everything position-dependent a kernel needs besides q, k, v."""

    q_start: int  # absolute position of the first query
    bias_table: torch.Tensor | None  # (H, D+1) float32, b_h(d) for d = 0..D
    ssmax_scale: torch.Tensor | None  # (H,) s_h, or None without SSMax
    ssmax_scope: str = "logits"  # "logits" (content + prior) or "content"
    ssmax_bias: torch.Tensor | None = None  # (H,) b_h in c_h(i) = s_h log(i + 1) + b_h; None: b_h = 0
    # A prior that depends on the query's position too (FIRE), instead of bias_table. Its
    # ``bias(q positions (Tq,), k positions (Tk,))`` -> (H, Tq, Tk) serves the dense and blockwise
    # kernels; its ``kernel_form(q positions, max distance)`` -> PiecewiseBias the native one.
    # fused and flex are refused it (bamctl.engine.stream).
    query_prior: QueryPrior | None = None
    # A prior that depends on the content, in one of three forms (see ``content_bias``): a bias over
    # whole rows, ``content_bias(q, scores, q positions, k positions)`` -> (B, H, Tq, Tk), ``scores``
    # the scaled dot products with future keys at -inf (dense); the same as a scan over key blocks
    # given nearest first, ``content_scan(q, scores, q positions, k positions, carry)`` -> (bias,
    # carry) (CoPE's count; dense, blockwise); or pair by pair (dense, blockwise, flex): either
    # ``score_mod(score, b, h, q position, k position)`` -> the new score, FlexAttention's own
    # signature and meaning, or ``pair_bias(q, k, q positions)`` -> a function of that signature
    # whose value is *added* to the score (``pair_bias_of`` serves both as the latter). The engine
    # refuses it the other paths.
    content_prior: ContentPrior | ContentScan | PairBias | None = None

    @property
    def bias_for(self):
        """(q positions, k positions) -> (H, Tq, Tk) bias, from the table or the prior; None without a prior."""
        if self.query_prior is not None:
            return self.query_prior.bias
        if self.bias_table is None:
            return None
        table = self.bias_table
        return lambda q, k: table[:, (q[:, None] - k[None, :]).clamp(0, table.shape[1] - 1)]


class QueryPrior(Protocol):
    def bias(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor: ...

    def kernel_form(self, q_positions: torch.Tensor, max_distance: int) -> PiecewiseBias: ...


class ContentPrior(Protocol):
    def content_bias(self, q: torch.Tensor, scores: torch.Tensor, q_positions: torch.Tensor,
                     k_positions: torch.Tensor) -> torch.Tensor: ...


class ContentScan(Protocol):
    def content_scan(self, q: torch.Tensor, scores: torch.Tensor, q_positions: torch.Tensor,
                     k_positions: torch.Tensor, carry) -> tuple[torch.Tensor, object]: ...


class PairBias(Protocol):
    def pair_bias(self, q: torch.Tensor, k: torch.Tensor, q_positions: torch.Tensor) -> Callable: ...


def scans_content(prior) -> bool:
    """A content-dependent prior given as a scan over key blocks, nearest first: blockwise can walk it."""
    return callable(getattr(prior, "content_scan", None))


def pairs_content(prior) -> bool:
    """A prior given pair by pair (a ``score_mod``, or a ``pair_bias``): every tile of keys can take it."""
    return callable(getattr(prior, "pair_bias", None)) or callable(getattr(prior, "score_mod", None))


def depends_on_content(prior) -> bool:
    """A prior the engine must ask for each tile of scores: it says it reads the content
    (``content_dependent``), or it is a FlexAttention ``score_mod``, which may read anything."""
    return bool(getattr(prior, "content_dependent", False)) or callable(getattr(prior, "score_mod", None))


def gives_bias(pe) -> bool:
    """A PE class or module that adds a bias to the attention logits (by distance, query position or
    content), or changes each score (a ``score_mod``)."""
    return bool(getattr(pe, "query_dependent", False)) or depends_on_content(pe) or callable(getattr(pe, "distance_table", None))


def pair_bias_of(prior, q: torch.Tensor, k: torch.Tensor, q_positions: torch.Tensor) -> Callable:
    """The bias ``(score, b, h, q position, k position)`` -> what is added to the score, of a prior
    given pair by pair: its ``pair_bias``, or its ``score_mod``'s new score less the score (added
    back, it is the new score, to float32 rounding)."""
    if callable(getattr(prior, "pair_bias", None)):
        return prior.pair_bias(q, k, q_positions)
    mod = prior.score_mod

    def added(score, b, h, q_idx, kv_idx):
        return mod(score, b, h, q_idx, kv_idx) - score

    return added


def pair_tile(bias_of: Callable, scores: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
    """``bias_of(score, b, h, q position, k position)`` over a tile ``scores`` (B, H, Tq, Tk), with
    index grids that broadcast, as FlexAttention's eager form evaluates a ``score_mod``."""
    batch, heads = scores.shape[:2]
    b = torch.arange(batch, device=scores.device)[:, None, None, None]
    h = torch.arange(heads, device=scores.device)[None, :, None, None]
    bias = bias_of(scores, b, h, q_positions[None, None, :, None], k_positions[None, None, None, :])
    return bias.expand_as(scores)


def content_bias(prior: ContentPrior | ContentScan | PairBias, q: torch.Tensor, k: torch.Tensor, scores: torch.Tensor,
                 q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
    """(B, H, Tq, Tk) bias of a content-dependent prior over whole rows (``scores``: future keys at -inf).

    A scan sees the keys nearest first, each block's keys in decreasing position (what
    CoPE's count of open gates between a key and its query needs: a running sum from the query
    back); over whole rows that is one block, the keys reversed, and a carry of None.
    """
    if pairs_content(prior):
        return pair_tile(pair_bias_of(prior, q, k, q_positions), scores, q_positions, k_positions)
    if scans_content(prior):
        bias, _ = prior.content_scan(q, scores.flip(-1), q_positions, k_positions.flip(0), None)
        return bias.flip(-1)
    return prior.content_bias(q, scores, q_positions, k_positions)


def ssmax_factor(inputs: AttentionInputs, n_queries: int, device) -> torch.Tensor:
    """(H, Tq) SSMax's c_h(i) = s_h * log(i + 1) (+ b_h) for queries q_start .. q_start + Tq - 1."""
    positions = torch.arange(inputs.q_start, inputs.q_start + n_queries, device=device, dtype=torch.float32)
    factor = inputs.ssmax_scale.float()[:, None] * torch.log(positions + 1.0)[None, :]
    return factor if inputs.ssmax_bias is None else factor + inputs.ssmax_bias.float()[:, None]


def _logits(
    scores: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor, inputs: AttentionInputs,
    q: torch.Tensor | None = None, k: torch.Tensor | None = None,
) -> torch.Tensor:
    """Turn scaled dot products (B, H, Tq, Tk) into logits for queries and keys at these positions
    (``q``, ``k``: the queries and keys, for a prior that reads the content)."""
    bias = None
    if inputs.bias_for is not None:
        bias = inputs.bias_for(q_positions, k_positions)  # (H, Tq, Tk)
    if inputs.content_prior is not None:
        future = (q_positions[:, None] - k_positions[None, :]) < 0
        bias = content_bias(inputs.content_prior, q, k, scores.masked_fill(future, float("-inf")), q_positions, k_positions)
    if inputs.ssmax_scale is None:
        return scores if bias is None else scores + bias
    factor = ssmax_factor(inputs, scores.shape[2], scores.device)[:, :, None]  # (H, Tq, 1)
    if bias is None:
        return scores * factor
    if inputs.ssmax_scope == "logits":
        return (scores + bias) * factor
    return scores * factor + bias


def attention_weights(q: torch.Tensor, k: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
    """Softmax weights (B, H, Tq, Tk), float32: where each query attends."""
    tq, tk = q.shape[2], k.shape[2]
    q_positions = torch.arange(inputs.q_start, inputs.q_start + tq, device=q.device)
    k_positions = torch.arange(tk, device=q.device)
    signed = q_positions[:, None] - k_positions[None, :]  # (Tq, Tk)
    scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    logits = _logits(scores, q_positions, k_positions, inputs, q, k)
    logits = logits.masked_fill(signed < 0, float("-inf"))
    return torch.softmax(logits, dim=-1)


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
    """Reference: full (Tq, Tk) logits, causal mask, softmax. q: (B, H, Tq, Dh), k/v: (B, H, Tk, Dh)."""
    return (attention_weights(q, k, inputs) @ v.float()).to(q.dtype)
