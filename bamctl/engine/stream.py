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

from bamctl.attention_math import dense_attention, depends_on_content, gives_bias, pairs_content, scans_content
from bamctl.engine.attention import BlockwiseKernel
from bamctl.engine.block_skip import check_mode
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
    "blockwise": BlockwiseKernel,  # online softmax over key blocks, plain torch ops
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
# Paths that take a content-dependent prior given as a scan over key blocks (CoPE's), or pair by
# pair (a score_mod), fastest first (flex on CUDA; on CPUs auto keeps to blockwise, which needs no compiler).
CONTENT_SCAN_PATHS = ("blockwise", "dense")
PAIR_BIAS_PATHS = ("flex", "blockwise", "dense")
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
    by_content = [layer.attention.prior for layer in model.layers if depends_on_content(layer.attention.prior)]
    if by_content:
        paths = _content_paths(by_content)
        if attention not in paths:
            if not chosen_by_auto:
                memory = ("" if len(paths) > 1 else " (memory: one chunk of queries against every key, so --chunk-size "
                          "bounds it; a content_scan or pair_bias hook would serve blockwise)")
                raise BamctlError(f"--attention {attention} cannot compute {model.config.label}'s prior, which depends on "
                                  f"the content: use --attention {_either(paths)}{memory}")
            attention = "blockwise" if "blockwise" in paths else "dense"  # auto: flex is kept where auto chose it
        return attention
    by_query = [layer.attention.prior for layer in model.layers if getattr(layer.attention.prior, "query_dependent", False)]
    if by_query:
        # native takes such a prior in its piecewise-linear form (FIRE's kernel_form); a plugin may not give one
        piecewise = all(callable(getattr(prior, "kernel_form", None)) for prior in by_query)
        paths = QUERY_DEPENDENT_PATHS if piecewise else tuple(p for p in QUERY_DEPENDENT_PATHS if p != "native")
        if attention not in paths:
            if not chosen_by_auto:
                why = "takes a prior by distance only" if attention != "native" else \
                    "takes a query-dependent prior only in its piecewise-linear form (kernel_form), which it lacks"
                raise BamctlError(
                    f"--attention {attention} {why}; {model.config.label}'s depends on the query position too: use "
                    f"--attention {_either(paths)}"
                )
            attention = "blockwise"  # auto on CUDA, on a CPU without the native kernel, or a prior native cannot take
    if attention not in FOLDING_PATHS:
        return attention
    found = _negative_factor_on_a_prior(model)
    if found is None:
        return attention
    layer, head, value = found
    what = f"this model has a negative SSMax scale that multiplies its prior (layer {layer}, head {head}: {value})"
    if chosen_by_auto:
        _notice(f"{what}; using the blockwise attention path, which stays exact for it")
        return "blockwise"
    raise BamctlError(
        f"--attention {attention} is exact only for SSMax scales >= 0 where SSMax scales the prior too, "
        f"and {what}; use --attention native or blockwise"
    )


def _either(paths: Sequence[str]) -> str:
    """"a, b or c": the paths a refusal names."""
    return paths[0] if len(paths) == 1 else f"{', '.join(paths[:-1])} or {paths[-1]}"


def _content_paths(priors: list) -> tuple[str, ...]:
    """The paths that compute these content-dependent priors: pair by pair (a ``score_mod``) every
    tile-walking path; a scan over key blocks blockwise and dense; a bias over whole rows dense only."""
    if all(pairs_content(prior) for prior in priors):
        return PAIR_BIAS_PATHS if flex_available()[0] else PAIR_BIAS_PATHS[1:]
    if all(scans_content(prior) or pairs_content(prior) for prior in priors):
        return CONTENT_SCAN_PATHS
    return ("dense",)


def _negative_factor_on_a_prior(model: Transformer) -> tuple[int, int, str] | None:
    """(layer, head, "s = ..." or "b = ...") of the first SSMax scale s < 0 or bias b < 0 whose factor
    multiplies a prior (either makes the factor s log(i + 1) + b negative at some position), or None."""
    for layer, block in enumerate(model.layers):
        attention = block.attention
        if attention.ssmax_scale is None or not gives_bias(attention.prior) or attention.ssmax_scope != "logits":
            continue
        for name, part in (("s", attention.ssmax_scale), ("b", attention.ssmax_bias)):
            for head, value in enumerate([] if part is None else part.detach().float().tolist()):
                if value < 0:
                    return layer, head, f"{name} = {value:.3g}"
    return None


@functools.cache
def _notice(message: str) -> None:
    """One line on stderr, once per process."""
    print(f"note: {message}", file=sys.stderr)


def kernel_for(name: str, block_skip: str = "auto"):
    """A new kernel of the path ``name``, with state of its own; a kernel that skips key blocks
    (it has a ``block_skip``) is given ``--block-skip``."""
    kernel = ATTENTION_PATHS[name]()
    if hasattr(kernel, "block_skip"):
        kernel.block_skip = check_mode(block_skip)
    return kernel


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
        block_skip: str = "auto",
    ):
        """``rope_scaling``: a ``bamctl.positional.RopeScaling`` the engine runs a RoPE model with.

        ``block_skip``: ``auto`` lets the kernels leave out key blocks whose softmax mass the
        certified bound puts below 2^-40 of each row's (docs/engine.md); ``off`` reads them all.

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
        self.block_skip = check_mode(block_skip)
        self.kernel = kernel_for(self.attention, self.block_skip)  # replaceable (tests give kernels small blocks)
        # Per request of the latest call (score_continuations, generate_many, token_nlls): (key blocks
        # left out, key blocks considered), summed over layers, heads and query blocks; None where
        # the kernel keeps no count (dense, fused).
        self.last_block_counts: list[tuple[int, int] | None] = []
        self.chunk_size = chunk_size
        self.model = model.to(device=self.device).cast_keeping_positional(self.dtype).eval()
        self.model.rope_scaling = rope_scaling
        self.config = model.config
        self.subset = None
        if self.config.token_subset is not None:
            from bamctl.tokenizer import get_tokenizer

            self.subset = VocabSubset(self.config.token_subset, get_tokenizer(self.config.tokenizer).vocab_size)

    def _attend(self) -> Callable:
        """The kernel a forward pass calls: ``self.kernel``, outside autocast when the engine runs under it."""
        return outside_autocast(self.kernel, self.device.type) if self.precision.autocast is not None else self.kernel

    def check_fits(self, n_tokens: int, batch: int = 1) -> None:
        """Refuse, before any work, ``batch`` contexts of ``n_tokens`` that the memory here cannot hold."""
        from bamctl.engine.memory import check_fits

        check_fits(self.config, n_tokens, self.chunk_size, self.dtype, self.attention, self.device,
                   self.precision.activations, batch)

    def largest_batch(self, n_tokens: int) -> int:
        """How many sequences of ``n_tokens`` the memory here holds side by side (0: not one)."""
        from bamctl.engine.memory import budget_bytes, largest_batch

        return largest_batch(self.config, n_tokens, self.chunk_size, self.dtype, self.attention,
                             budget_bytes(self.device), self.precision.activations)

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

    # -- key blocks left out, per request ------------------------------------------------
    def _begin_counts(self, n: int) -> None:
        self.last_block_counts = [None] * n
        counts = getattr(self.kernel, "counts", None)
        if counts is not None:
            counts.take()  # whatever another call left

    def _end_counts(self, requests: Sequence[int]) -> None:
        """The kernel's counts since the last call, per sequence of the batch just run, to ``requests``."""
        counts = getattr(self.kernel, "counts", None)
        if counts is None:
            return
        for request, found in zip(requests, counts.take()):
            self.last_block_counts[request] = found

    # -- the one loop everything else is built on ---------------------------------------
    def _stream(
        self,
        batch: Sequence[Sequence[int]],
        capacity: int,
        on_hidden: Callable[[int, torch.Tensor], None],
        first_needed: int = 0,
    ) -> tuple[KVCache, ForwardState]:
        """Run the sequences of ``batch`` through the model side by side, in chunks;
        ``on_hidden(position, hidden (B, R, C))`` per chunk.

        Unequal sequences are right-padded (with model id 0) to the longest. Attention is
        causal, so a real token never sees the padding after it: each row's hidden states are
        those of its sequence run alone, and rows of padding are simply never read. Only
        hidden rows of positions ``>= first_needed`` are computed through the last layer;
        ``position`` is the position of the chunk's first returned row.
        """
        cfg = self.config
        longest = max(len(ids) for ids in batch)
        tokens = torch.zeros(len(batch), longest, dtype=torch.long, device=self.device)
        for row, ids in enumerate(batch):
            tokens[row, : len(ids)] = self._model_ids(ids)
        capacity = -(-capacity // CACHE_ROUND) * CACHE_ROUND  # whole blocks: fewer distinct kernel shapes
        cache = KVCache(cfg.n_layers, len(batch), cfg.n_heads, capacity, cfg.head_dim, self.precision.activations, self.device)
        state = ForwardState(kernel=self._attend(), cache=cache, max_distance=capacity - 1)
        for start in range(0, longest, self.chunk_size):
            chunk = tokens[:, start : start + self.chunk_size]
            keep_from = min(max(first_needed - start, 0), chunk.shape[1])
            with self._autocast():
                hidden = self.model.hidden(chunk, start, state, keep_from)
            on_hidden(start + keep_from, hidden)
        return cache, state

    def _logits(self, hidden_rows: torch.Tensor) -> torch.Tensor:
        with self._autocast():  # the head too: under autocast its logits are bfloat16 values, as theirs
            return self.model.output(hidden_rows).float()

    # -- request kinds, a batch of sequences at once ---------------------------------------
    # Each takes a list of requests and answers them in order; a batch of one is the single
    # request. The rows of a batch are those of its requests run alone (tests/test_batching.py).
    @torch.inference_mode()
    def logits_at_many(self, batch: Sequence[Sequence[int]], positions: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Per sequence, logits (len(positions[b]), V) predicting the token after each given position."""
        wanted = [sorted(set(p)) for p in positions]
        rows: list[dict[int, torch.Tensor]] = [{} for _ in batch]

        def keep(start: int, hidden: torch.Tensor) -> None:
            for b, points in enumerate(wanted):
                for p in points:
                    if start <= p < start + hidden.shape[1]:
                        rows[b][p] = hidden[b, p - start]

        self._begin_counts(len(batch))
        self._stream(batch, max(len(ids) for ids in batch), keep, first_needed=min(p[0] for p in wanted))
        self._end_counts(range(len(batch)))
        return [self._logits(torch.stack([found[p] for p in asked])) for found, asked in zip(rows, positions)]

    def logits_at(self, ids: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """Logits (len(positions), V) predicting the token after each given position."""
        return self.logits_at_many([ids], [positions])[0]

    @torch.inference_mode()
    def score_continuations(
        self, requests: Sequence[tuple[Sequence[int], Sequence[int]]], with_ranks: bool = False
    ) -> list[tuple]:
        """Teacher forcing of (prompt ids, target ids) pairs: one pass over each prompt + target,
        scored at the target positions. Per pair, the argmax token at each target position and the
        log-probability of each target; ``with_ranks``: also each target's rank among the model's
        tokens there (1 + those scored strictly above it; 1 = the argmax)."""
        batch = [list(prompt) + list(target) for prompt, target in requests]
        positions = [range(len(prompt) - 1, len(ids) - 1) for (prompt, _), ids in zip(requests, batch)]
        answers = []
        for logits, (_, target_ids) in zip(self.logits_at_many(batch, positions), requests):
            logprobs = torch.log_softmax(logits, dim=-1)
            target = self._model_ids(target_ids)
            chosen = logprobs.gather(1, target[:, None])
            answer = (self._tokenizer_ids(logprobs.argmax(-1)).tolist(), chosen[:, 0].tolist())
            answers.append((*answer, ((logprobs > chosen).sum(-1) + 1).tolist()) if with_ranks else answer)
        return answers

    def score_continuation(self, prompt_ids: Sequence[int], target_ids: Sequence[int]) -> tuple[list[int], list[float]]:
        """Teacher forcing of one prompt and its target: the argmax and log-probability at each target position."""
        return self.score_continuations([(prompt_ids, target_ids)])[0]

    @torch.inference_mode()
    def generate_many(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, stop_ids: Sequence[int] = (),
                      stopped: Sequence | None = None) -> list[list[int]]:
        """Greedy decoding of each prompt. Decoding steps one position for the whole batch, so
        prompts are grouped by length (no padding: every row of a group is at the same
        position), and each group is prefilled and decoded as one batch. ``stopped``: per
        prompt, None or a test of its tokens so far that ends it (a stop string reached)."""
        stopped = list(stopped) if stopped is not None else [None] * len(prompts)
        if max_new_tokens < 1:
            self.last_block_counts = [None] * len(prompts)
            return [[] for _ in prompts]
        groups: dict[int, list[int]] = {}
        for index, prompt in enumerate(prompts):
            groups.setdefault(len(prompt), []).append(index)
        out: list[list[int]] = [[] for _ in prompts]
        self._begin_counts(len(prompts))
        for indices in groups.values():
            for index, tokens in zip(indices, self._generate_equal([prompts[i] for i in indices], max_new_tokens, stop_ids,
                                                                   [stopped[i] for i in indices])):
                out[index] = tokens
            self._end_counts(indices)
        return out

    def _generate_equal(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, stop_ids: Sequence[int],
                        stopped: Sequence) -> list[list[int]]:
        """Greedy decoding of prompts of one length, side by side; a row stops after a stop id
        (included), its ``stopped`` test or ``max_new_tokens``, and the batch when every row has."""
        n = len(prompts[0])
        last: list[torch.Tensor] = []
        _, state = self._stream(
            prompts, n + max_new_tokens, lambda start, hidden: last.append(hidden[:, -1]) if hidden.shape[1] else None,
            first_needed=n - 1,
        )
        next_ids = self._logits(last[-1]).argmax(-1)  # (B,) model ids
        out: list[list[int]] = [[] for _ in prompts]
        done = [False] * len(prompts)
        position = n
        while True:
            for row, token in enumerate(self._tokenizer_ids(next_ids).tolist()):
                if not done[row]:
                    out[row].append(int(token))
                    done[row] = (token in stop_ids or len(out[row]) == max_new_tokens
                                 or (stopped[row] is not None and stopped[row](out[row])))
            if all(done):
                return out
            with self._autocast():
                hidden = self.model.hidden(next_ids[:, None], position, state)[:, -1]
            next_ids = self._logits(hidden).argmax(-1)
            position += 1

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, stop_ids: Sequence[int] = ()) -> list[int]:
        """Greedy decoding: prefill the prompt, then one token per step from the cache."""
        return self.generate_many([prompt_ids], max_new_tokens, stop_ids)[0]

    @torch.inference_mode()
    def last_query_attention(self, ids: Sequence[int]) -> list[torch.Tensor]:
        """Where the last token attends: per layer, softmax weights (H, len(ids)) on the CPU."""
        from bamctl.attention_math import attention_weights

        weights: list[torch.Tensor] = []

        def recording(q, k, v, inputs):
            w = attention_weights(q, k, inputs)  # one query: (1, H, 1, N)
            weights.append(w[0, :, -1].cpu())
            return (w @ v.float()).to(q.dtype)

        _, state = self._stream([ids[:-1]], len(ids), lambda start, hidden: None, first_needed=len(ids)) if len(ids) > 1 else (None, None)
        if state is None:
            cache = KVCache(self.config.n_layers, 1, self.config.n_heads, CACHE_ROUND, self.config.head_dim,
                            self.precision.activations, self.device)
            state = ForwardState(cache=cache, max_distance=0)
        state.kernel = outside_autocast(recording, self.device.type)
        with self._autocast():
            self.model.hidden(self._model_ids(ids[-1:])[None, :], len(ids) - 1, state)
        return weights

    @torch.inference_mode()
    def token_nlls(self, requests: Sequence[tuple[Sequence[int], int]]) -> list[torch.Tensor]:
        """Per (ids, score_from): NLL (float32, on CPU) of each token ids[t] for t in
        [score_from, len(ids)), given ids[:t].

        Token 0 has nothing before it to predict it from, and a model with a vocabulary subset
        has no row for tokens outside it (they share one UNK row it was never trained to
        predict): their NLL is NaN, so they are left out of the sum and of the count of scored
        tokens.
        """
        for ids, score_from in requests:
            if not 0 <= score_from <= len(ids):
                raise ValueError(f"score_from must be in [0, {len(ids)}], got {score_from}")
        # Token 0 is never predicted: scored from 1, with a NaN in front.
        froms = [max(score_from, 1) for _, score_from in requests]
        streamed = [b for b, (ids, _) in enumerate(requests) if len(ids) > 1]
        pieces: list[list[torch.Tensor]] = [[] for _ in requests]
        targets = {b: self._model_ids(requests[b][0]) for b in streamed}
        self._begin_counts(len(requests))
        if streamed:
            def score(start: int, hidden: torch.Tensor) -> None:
                for row, b in enumerate(streamed):
                    # hidden row r predicts token start + r + 1
                    n = len(requests[b][0])
                    first = max(froms[b] - 1 - start, 0)
                    last = min(hidden.shape[1], n - 1 - start)
                    for lo in range(first, last, LOGIT_ROWS):
                        hi = min(lo + LOGIT_ROWS, last)
                        logits = self._logits(hidden[row, lo:hi])
                        pieces[b].append(F.cross_entropy(logits, targets[b][start + lo + 1 : start + hi + 1], reduction="none").cpu())

            batch = [requests[b][0] for b in streamed]
            self._stream(batch, max(len(ids) for ids in batch), score, first_needed=min(froms[b] for b in streamed) - 1)
            self._end_counts(streamed)
        answers = []
        for b, (ids, score_from) in enumerate(requests):
            nll = torch.cat(pieces[b]) if pieces[b] else torch.zeros(0)
            if self.subset is not None and b in targets:
                unknown = (targets[b][froms[b]:] == self.subset.unk).cpu()
                nll = nll.masked_fill(unknown, float("nan"))
            if score_from == 0 and ids:
                nll = F.pad(nll, (1, 0), value=float("nan"))
            answers.append(nll)
        return answers

    def token_nll(self, ids: Sequence[int], score_from: int = 1) -> torch.Tensor:
        """NLL (float32, on CPU) of each token ids[t] for t in [score_from, len(ids)), given ids[:t] (``token_nlls``)."""
        return self.token_nlls([(ids, score_from)])[0]
