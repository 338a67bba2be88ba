"""The streaming engine: prefill a long prompt chunk by chunk into a KV cache.

Memory = weights + KV cache + one chunk's workspace. Full logits (T x vocab) are never
built either: callers ask for the hidden rows they need (the positions to score, the
last one to generate from) and the output head runs on those alone.

Three request kinds cover every task:
- ``score_continuation``: teacher forcing, argmax and log-probs of given target tokens;
- ``generate``: greedy decoding after the prompt;
- ``token_nll``: per-token negative log-likelihood, for perplexity.
"""

from __future__ import annotations

import functools
import sys
from contextlib import nullcontext

from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from bamctl.attention_math import dense_attention
from bamctl.engine.attention import blockwise_attention
from bamctl.engine.flex import FlexKernel, flex_available, require_flex
from bamctl.engine.fused import FusedKernel, fused_available
from bamctl.engine.native import NativeKernel, native_available
from bamctl.engine.cache import KVCache
from bamctl.devices import resolve_device, resolve_precision
from bamctl.errors import BamctlError
from bamctl.model import ForwardState, Transformer
from bamctl.vocab import VocabSubset

# Attention paths by name, each a factory of one engine's kernel (the stateful ones keep
# their buffers and counters per engine); every one computes the same logits
# (bamctl.attention_math).
ATTENTION_PATHS: dict[str, Callable[[], Callable]] = {
    "dense": lambda: dense_attention,  # the reference: (Tq, Tk) logits
    "blockwise": lambda: blockwise_attention,  # online softmax over key blocks, plain torch ops
    "native": NativeKernel,  # our C++ CPU kernel: prior and SSMax inside the online softmax
    "fused": FusedKernel,  # torch's fused CPU kernel, prior as a strided mask
    "flex": FlexKernel,  # compiled FlexAttention: CUDA, or x86 CPUs
}
ATTENTION_CHOICES = ("auto", *ATTENTION_PATHS)
CACHE_ROUND = 128  # KV cache capacity is a multiple of FlexAttention's block
LOGIT_ROWS = 256  # rows of the output head computed at once: 256 x 50k floats = 51 MB


def resolve_attention(name: str, device: torch.device) -> str:
    """auto: compiled FlexAttention on CUDA; on CPUs our C++ kernel, else torch's fused kernel, else blockwise."""
    if name == "auto":
        if device.type == "cuda":
            return "flex" if flex_available()[0] else "blockwise"
        ok, why = native_available()
        if ok:
            return "native"
        fallback = "fused" if fused_available()[0] else "blockwise"
        _notice(f"{why}; using the {fallback} attention path")
        return fallback
    if name == "flex":
        require_flex()
    if name == "native" and not native_available()[0]:
        raise BamctlError(f"--attention native is not available: {native_available()[1]}; use --attention fused")
    if name not in ATTENTION_PATHS:
        raise BamctlError(f"unknown attention path {name!r}; use one of {', '.join(ATTENTION_CHOICES)}")
    return name


# Paths that fold SSMax's factor into the queries and into the mask that holds the prior:
# torch's fused kernel takes one scalar scale and adds its mask after it, so a per-query
# factor can enter nowhere else. Where the factor multiplies a prior (SSMax over the logits)
# that is exact to 1e-4 for factors >= 0 only. The native kernel forms (score + prior) * factor
# in the reference's order, exact for either sign.
FOLDING_PATHS = ("fused",)
# Paths that take a prior as a function of (query, key) positions, not only of the distance (FIRE).
QUERY_DEPENDENT_PATHS = ("native", "blockwise", "dense")


def _exact_for(model: Transformer, attention: str, chosen_by_auto: bool) -> str:
    """The path, unless it cannot compute this model exactly.

    A prior that depends on the query's position (FIRE) fits no 1-D line: native takes it in its
    piecewise-linear form, blockwise and dense ask it for each tile; fused and flex cannot. With a
    negative SSMax scale over the logits, the factor multiplies a prior that grows with distance
    into large positive logits; folding it into the queries and the prior's mask (fused) then
    rounds differently from the reference by up to ~4e-3. A negative scale over the content only,
    or in a model without a prior, multiplies no prior, and fused stays exact. ``auto`` takes the
    blockwise path instead (it picks fused only on a CPU where native cannot be built); asked
    for, such a path is refused with one line.
    """
    if any(getattr(layer.attention.prior, "query_dependent", False) for layer in model.layers):
        if attention not in QUERY_DEPENDENT_PATHS:
            if not chosen_by_auto:
                raise BamctlError(
                    f"--attention {attention} takes a prior by distance only; {model.config.label}'s depends on the "
                    "query position too: use --attention native, blockwise or dense"
                )
            attention = "blockwise"  # auto on CUDA, or on a CPU without the native kernel
    if attention not in FOLDING_PATHS:
        return attention
    found = _negative_scale_on_a_prior(model)
    if found is None:
        return attention
    layer, head, value = found
    what = f"this model has a negative SSMax scale that multiplies its prior (layer {layer}, head {head}: s = {value:.3g})"
    if chosen_by_auto:
        _notice(f"{what}; using the blockwise attention path, which stays exact for it")
        return "blockwise"
    raise BamctlError(
        f"--attention {attention} is exact only for SSMax scales >= 0 where SSMax scales the prior too, "
        f"and {what}; use --attention native or blockwise"
    )


def _negative_scale_on_a_prior(model: Transformer) -> tuple[int, int, float] | None:
    """(layer, head, s) of the first SSMax scale s < 0 whose factor multiplies a prior, or None."""
    for layer, block in enumerate(model.layers):
        attention = block.attention
        if attention.ssmax_scale is None or attention.prior is None or attention.ssmax_scope != "logits":
            continue
        for head, value in enumerate(attention.ssmax_scale.detach().float().tolist()):
            if value < 0:
                return layer, head, value
    return None


@functools.cache
def _notice(message: str) -> None:
    """One line on stderr, once per process."""
    print(f"note: {message}", file=sys.stderr)


def kernel_for(name: str):
    """A new kernel of the path ``name``, with state of its own."""
    return ATTENTION_PATHS[name]()


def outside_autocast(kernel: Callable, device_type: str) -> Callable:
    """``kernel`` with autocast off inside it.

    Under an autocast precision the model's projections run in the lower dtype and hand the
    kernel lower-dtype q, k, v; each kernel then computes exactly what it computes for such
    inputs anywhere (float32 products and softmax on CPUs; FlexAttention on CUDA in the inputs'
    dtype, with float32 scores, as the authors' FlexAttention does). Left on, autocast would
    recast the dense and blockwise kernels' float32 products to bfloat16 and not the others'.
    """

    def attend(q, k, v, inputs):
        with torch.autocast(device_type=device_type, enabled=False):
            return kernel(q, k, v, inputs)

    return attend


class StreamingEngine:
    def __init__(
        self,
        model: Transformer,
        *,
        device: str = "auto",
        dtype: str = "auto",
        chunk_size: int = 2048,
        attention: str = "auto",
        rope_scaling=None,
    ):
        """``rope_scaling``: a ``bamctl.positional.RopeScaling`` the engine runs a RoPE model with.

        ``dtype``: the weights' dtype (``float32``, ``bfloat16``, ``float16``; the priors and
        SSMax scales stay float32 in every one), or ``autocast-bfloat16``: float32 weights, the
        forward under ``torch.autocast`` on this device's type, the KV cache in bfloat16 (what
        the projections give), as the BAM authors' evaluation runs their models.
        """
        if chunk_size < 1:
            raise BamctlError(f"--chunk-size must be a positive number of tokens, not {chunk_size}")
        self.device = resolve_device(device)
        self.precision = resolve_precision(dtype, self.device)
        self.dtype = self.precision.weights
        self.attention = _exact_for(model, resolve_attention(attention, self.device), attention == "auto")
        self.kernel = kernel_for(self.attention)
        autocast = self.precision.autocast is not None
        self._attend = outside_autocast(self.kernel, self.device.type) if autocast else self.kernel
        self.chunk_size = chunk_size
        self.model = model.to(device=self.device).cast_keeping_positional(self.dtype).eval()
        self.model.rope_scaling = rope_scaling
        self.config = model.config
        self.subset = None
        if self.config.token_subset is not None:
            from bamctl.tokenizer import get_tokenizer

            self.subset = VocabSubset(self.config.token_subset, get_tokenizer(self.config.tokenizer).vocab_size)

    def check_fits(self, n_tokens: int) -> None:
        """Refuse, before any work, a context that the memory here cannot hold."""
        from bamctl.engine.memory import check_fits

        check_fits(self.config, n_tokens, self.chunk_size, self.dtype, self.attention, self.device, self.precision.activations)

    def _autocast(self):
        """The context every forward runs in: autocast under an autocast precision, else none."""
        if self.precision.autocast is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.precision.autocast)

    # Callers speak tokenizer ids; a model with a vocabulary subset has its own rows.
    def _model_ids(self, ids: Sequence[int]) -> torch.Tensor:
        tokens = torch.as_tensor(list(ids), dtype=torch.long, device=self.device)
        return tokens if self.subset is None else self.subset.to_model(tokens)

    def _tokenizer_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return ids if self.subset is None else self.subset.to_tokenizer(ids)

    # -- the one loop everything else is built on ---------------------------------------
    def _stream(
        self,
        ids: Sequence[int],
        capacity: int,
        on_hidden: Callable[[int, torch.Tensor], None],
        first_needed: int = 0,
    ) -> tuple[KVCache, ForwardState]:
        """Run ``ids`` through the model in chunks; ``on_hidden(position, hidden (R, C))`` per chunk.

        Only hidden rows of positions ``>= first_needed`` are computed through the last
        layer; ``position`` is the position of the chunk's first returned row.
        """
        cfg = self.config
        tokens = self._model_ids(ids)[None, :]  # (1, N)
        capacity = -(-capacity // CACHE_ROUND) * CACHE_ROUND  # whole blocks: fewer distinct kernel shapes
        cache = KVCache(cfg.n_layers, 1, cfg.n_heads, capacity, cfg.head_dim, self.precision.activations, self.device)
        state = ForwardState(kernel=self._attend, cache=cache, max_distance=capacity - 1)
        for start in range(0, tokens.shape[1], self.chunk_size):
            chunk = tokens[:, start : start + self.chunk_size]
            keep_from = min(max(first_needed - start, 0), chunk.shape[1])
            with self._autocast():
                hidden = self.model.hidden(chunk, start, state, keep_from)[0]
            on_hidden(start + keep_from, hidden)
        return cache, state

    def _logits(self, hidden_rows: torch.Tensor) -> torch.Tensor:
        with self._autocast():  # the head too: under autocast its logits are bfloat16 values, as theirs
            return self.model.output(hidden_rows).float()

    # -- request kinds --------------------------------------------------------------------
    @torch.inference_mode()
    def logits_at(self, ids: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """Logits (len(positions), V) predicting the token after each given position."""
        wanted = sorted(set(positions))
        rows: dict[int, torch.Tensor] = {}

        def keep(start: int, hidden: torch.Tensor) -> None:
            for p in wanted:
                if start <= p < start + hidden.shape[0]:
                    rows[p] = hidden[p - start]

        self._stream(ids, len(ids), keep, first_needed=wanted[0])
        return self._logits(torch.stack([rows[p] for p in positions]))

    @torch.inference_mode()
    def score_continuation(self, prompt_ids: Sequence[int], target_ids: Sequence[int]) -> tuple[list[int], list[float]]:
        """Teacher forcing: one pass over prompt + target, scored at the target positions.

        Returns the argmax token at each target position and the log-probability of each target.
        """
        ids = list(prompt_ids) + list(target_ids)
        positions = range(len(prompt_ids) - 1, len(ids) - 1)
        logprobs = torch.log_softmax(self.logits_at(ids, positions), dim=-1)
        target = self._model_ids(target_ids)
        return self._tokenizer_ids(logprobs.argmax(-1)).tolist(), logprobs.gather(1, target[:, None])[:, 0].tolist()

    @torch.inference_mode()
    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, stop_ids: Sequence[int] = ()) -> list[int]:
        """Greedy decoding: prefill the prompt, then one token per step from the cache."""
        last: list[torch.Tensor] = []
        capacity = len(prompt_ids) + max_new_tokens
        cache, state = self._stream(
            prompt_ids, capacity, lambda start, hidden: last.append(hidden[-1]) if len(hidden) else None,
            first_needed=len(prompt_ids) - 1,
        )
        next_id = self._logits(last[-1][None]).argmax(-1)  # (1,) model id
        out: list[int] = []
        position = len(prompt_ids)
        while len(out) < max_new_tokens:
            out.append(int(self._tokenizer_ids(next_id)))
            if out[-1] in stop_ids or len(out) == max_new_tokens:
                break
            with self._autocast():
                hidden = self.model.hidden(next_id[None], position, state)[0, -1:]
            next_id = self._logits(hidden).argmax(-1)
            position += 1
        return out

    @torch.inference_mode()
    def last_query_attention(self, ids: Sequence[int]) -> list[torch.Tensor]:
        """Where the last token attends: per layer, softmax weights (H, len(ids)) on the CPU."""
        from bamctl.attention_math import attention_weights

        weights: list[torch.Tensor] = []

        def recording(q, k, v, inputs):
            w = attention_weights(q, k, inputs)  # one query: (1, H, 1, N)
            weights.append(w[0, :, -1].cpu())
            return (w @ v.float()).to(q.dtype)

        _, state = self._stream(ids[:-1], len(ids), lambda start, hidden: None, first_needed=len(ids)) if len(ids) > 1 else (None, None)
        if state is None:
            cache = KVCache(self.config.n_layers, 1, self.config.n_heads, CACHE_ROUND, self.config.head_dim,
                            self.precision.activations, self.device)
            state = ForwardState(cache=cache, max_distance=0)
        state.kernel = outside_autocast(recording, self.device.type)
        with self._autocast():
            self.model.hidden(self._model_ids(ids[-1:])[None, :], len(ids) - 1, state)
        return weights

    @torch.inference_mode()
    def token_nll(self, ids: Sequence[int], score_from: int = 1) -> torch.Tensor:
        """NLL (float32, on CPU) of each token ids[t] for t in [score_from, len(ids)), given ids[:t].

        Token 0 has nothing before it to predict it from, and a model with a vocabulary subset
        has no row for tokens outside it (they share one UNK row it was never trained to
        predict): their NLL is NaN, so they are left out of the sum and of the count of scored
        tokens.
        """
        if not 0 <= score_from <= len(ids):
            raise ValueError(f"score_from must be in [0, {len(ids)}], got {score_from}")
        if score_from == 0:
            return F.pad(self.token_nll(ids, 1), (1, 0), value=float("nan")) if ids else torch.zeros(0)
        targets = self._model_ids(ids)
        pieces: list[torch.Tensor] = []

        def score(start: int, hidden: torch.Tensor) -> None:
            # hidden row r predicts token start + r + 1
            first = max(score_from - 1 - start, 0)
            last = min(hidden.shape[0], len(ids) - 1 - start)
            for lo in range(first, last, LOGIT_ROWS):
                hi = min(lo + LOGIT_ROWS, last)
                logits = self._logits(hidden[lo:hi])
                pieces.append(F.cross_entropy(logits, targets[start + lo + 1 : start + hi + 1], reduction="none").cpu())

        self._stream(ids, len(ids), score, first_needed=score_from - 1)
        nll = torch.cat(pieces) if pieces else torch.zeros(0)
        if self.subset is not None:
            unknown = (targets[score_from:] == self.subset.unk).cpu()
            nll = nll.masked_fill(unknown, float("nan"))
        return nll
