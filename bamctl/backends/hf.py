"""``hf:PATH``: a local Hugging Face causal LM with its own tokenizer, in base-model mode.

Answers the three request kinds with the model's own forward:

- long inputs are prefilled in chunks of ``--chunk-size`` tokens into the model's KV cache
  (``DynamicCache``), and the output head runs only on the rows a request needs
  (``logits_to_keep``), so memory is the cache plus one chunk's activations;
- lengths are the model's tokenizer's. Past the configured
  ``max_position_embeddings`` the model runs anyway (extrapolation is the point) after
  one warning line on stderr, or the request is refused with ``--beyond-max refuse``;
- at exactly that maximum, what a request adds to its prompt may not fit: teacher forcing
  then leaves out the prompt's first tokens (as many as the BOS and the answer tokens fed
  before the last take past the maximum), and a generation or a perplexity document the
  BOS. Nothing else is ever cut. The row records both (``dropped_tokens``, ``bos``), and a
  run that drops any token says so in one line per model (``Backend.fitting``);
- base mode by default: prompts go in as the task tokenised them. One BOS is put in
  front of each request when the tokenizer's own plain call adds one (Llama, Mistral),
  since that is what the model saw in training; it is never added per piece, never
  counted in a task's length, and no EOS is ever added. ``--chat-template`` wraps the
  prompt as one user turn of the model's template instead (generation and continuation
  scoring only; perplexity always reads raw text).

``PATH`` is a folder with ``config.json`` (``save_pretrained`` output), or a ``.gguf``
file (or a folder holding exactly one), which transformers dequantises on load.
Nothing is downloaded: loading is ``local_files_only``.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from bamctl.backends.base import ContinuationScore, HFOptions, ModelInfo
from bamctl.backends.hf_common import (
    LengthPolicy,
    RequestShaper,
    ShapedBackend,
    estimate_bytes,
    import_transformers,
    locate,
    max_positions,
    model_fingerprint,
    positional_encoding,
    trained_length,
)
from bamctl.devices import resolve_device, resolve_dtype
from bamctl.errors import BamctlError
from bamctl.fingerprints import scaled_hash


def scaled_config(reference: str, kind: str, factor: float):
    """The model's config with RoPE scaled at inference (transformers' ``rope_type`` linear or yarn),
    from the length it was trained at."""
    from bamctl.backends.hf_common import read_config

    config, _, _ = read_config(reference)
    if positional_encoding(config) != "rope":
        raise BamctlError(f"--rope-scaling applies to RoPE models; {reference} is not one")
    original = trained_length(config, max_positions(config))
    scaling = {"rope_type": kind, "factor": float(factor), "original_max_position_embeddings": original}
    text = getattr(config, "get_text_config", lambda: config)()
    if hasattr(text, "rope_parameters"):  # transformers >= 5
        text.rope_parameters = {**(text.rope_parameters or {}), **scaling}
    else:
        text.rope_scaling = scaling
    return config


class HFBackend(ShapedBackend):
    kind = "hf"
    compute_libraries = ("torch", "transformers", "tokenizers")

    def __init__(self, reference: str, options: HFOptions):
        from bamctl.backends.hf_tokenizer import model_tokenizer

        import_transformers()
        from transformers import AutoModelForCausalLM

        folder, gguf_file = locate(Path(reference).expanduser())
        device = resolve_device(options.device)
        dtype = resolve_dtype(options.dtype, device)
        kwargs = {"local_files_only": True, **({"gguf_file": gguf_file} if gguf_file else {})}
        if options.rope_scaling is not None:  # into the config, as transformers reads it
            kwargs["config"] = scaled_config(reference, options.rope_scaling, options.rope_factor)
        try:
            try:
                model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, **kwargs)
            except TypeError:  # transformers < 4.56 names it torch_dtype
                model = AutoModelForCausalLM.from_pretrained(str(folder), torch_dtype=dtype, **kwargs)
        except (OSError, ValueError, ImportError) as err:
            raise BamctlError(f"hf: cannot load {reference}: {str(err).splitlines()[0]}") from None
        self.model = model.to(device=device, dtype=dtype).eval()
        self.tokenizer = model_tokenizer(folder, gguf_file, options.tokenizer, reference)
        name = gguf_file.removesuffix(".gguf") if gguf_file else folder.resolve().name
        config = self.model.config
        rope_label = None if options.rope_scaling is None else f"{options.rope_scaling}:{options.rope_factor:g}"
        limit = max_positions(config)
        self.lengths = LengthPolicy(name, limit, options.beyond_max)
        self.shaper = RequestShaper(self.tokenizer, options.chat_template, options.bos)
        self.chunk_size = options.chunk_size
        self.stop_ids = self._stop_ids()
        parameters = inspect.signature(self.model.forward).parameters
        # transformers 5 renamed past_key_values to cache; either takes a DynamicCache.
        self.cache_arg = next((n for n in ("cache", "past_key_values") if n in parameters), None)
        self.chunked = self.cache_arg is not None
        self.keep_arg = next((n for n in ("logits_to_keep", "num_logits_to_keep") if n in parameters), None)
        self.info = ModelInfo(
            name=name,
            model_hash=scaled_hash(model_fingerprint(folder, gguf_file)[:16], rope_label),
            pe=positional_encoding(config),
            ssmax=False,
            train_length=trained_length(config, limit),
            rope_scaling=rope_label,
        )
        self.device = str(device)
        self.dtype = str(dtype).removeprefix("torch.")
        self.attention = str(getattr(config, "_attn_implementation", None) or "eager")

    def _stop_ids(self) -> set[int]:
        stops = set() if self.tokenizer.eos_id is None else {self.tokenizer.eos_id}
        generation = getattr(self.model, "generation_config", None)
        eos = getattr(generation, "eos_token_id", None)
        stops.update([eos] if isinstance(eos, int) else list(eos or []))
        return stops

    # -- the one loop: chunks through the KV cache, logits only where asked --------------
    def _forward(self, ids: torch.Tensor, cache, rows: list[int] | None):
        """Logits (len(rows), V) for local ``rows`` of this chunk, and the cache after it."""
        kwargs = {"input_ids": ids[None], "use_cache": self.chunked}
        if self.chunked:
            kwargs[self.cache_arg] = cache  # a DynamicCache, filled in place
        if self.keep_arg == "logits_to_keep":
            kwargs["logits_to_keep"] = torch.tensor(rows, device=ids.device) if rows else 1
        out = self.model(**kwargs)
        logits = out.logits[0]
        if rows is None:
            return None, cache
        if self.keep_arg != "logits_to_keep":
            logits = logits[rows]
        return logits.float(), cache

    def _stream(self, ids: list[int], rows_for: Callable[[int, int], list[int]], on_logits) -> object:
        """Run ``ids`` in chunks; ``on_logits(start, rows, logits)`` where ``rows_for`` asks."""
        tokens = torch.tensor(ids, dtype=torch.long, device=self.model.device)
        cache = self._new_cache()
        step = self.chunk_size if self.chunked else len(ids)
        for start in range(0, len(ids), step):
            stop = min(start + step, len(ids))
            rows = rows_for(start, stop)
            logits, cache = self._forward(tokens[start:stop], cache, rows or None)
            if rows:
                on_logits(start, rows, logits)
        return cache

    def _new_cache(self):
        if not self.chunked:
            return None
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self.model.config)
        except TypeError:  # older transformers take no config
            return DynamicCache()

    def _logits_at(self, ids: list[int], positions: list[int]) -> torch.Tensor:
        found: dict[int, torch.Tensor] = {}

        def rows_for(start, stop):
            return [p - start for p in positions if start <= p < stop]

        def keep(start, rows, logits):
            for r, row in zip(rows, logits):
                found[start + r] = row

        self._stream(ids, rows_for, keep)
        return torch.stack([found[p] for p in positions])

    # -- request kinds --------------------------------------------------------------------
    @torch.inference_mode()
    def score_continuation(self, prompt_ids: Sequence[int], target_ids: Sequence[int]):
        targets = list(target_ids)
        prefix, prompt = self.shaper.prefix, list(prompt_ids)
        fed = self.lengths.fit(prefix, prompt, targets)
        first = len(fed) - len(targets)  # the row predicting the first target
        logprobs = torch.log_softmax(self._logits_at(fed, list(range(first, len(fed)))), dim=-1)
        target = torch.tensor(targets, dtype=torch.long, device=logprobs.device)
        return ContinuationScore(
            predicted_ids=logprobs.argmax(-1).tolist(),
            logprobs=logprobs.gather(1, target[:, None])[:, 0].tolist(),
        )

    def check_fits(self, n_prompt: int, n_answer: int) -> None:
        """Before any sample: the ``--beyond-max`` policy on the longest prompt, then memory."""
        from bamctl import devices

        self.lengths.check(n_prompt)
        need = estimate_bytes(self.model, n_prompt + n_answer, self.chunk_size)
        budget = int(devices.available_bytes(self.model.device) * devices.MEMORY_SAFETY)
        if need > budget:
            raise BamctlError(
                f"{n_prompt + n_answer:,} tokens need about {need / 2**30:.1f} GiB for {self.info.name} on "
                f"{self.device} (chunk {self.chunk_size}), but only {budget / 2**30:.1f} GiB are available; "
                "use shorter --lengths or a smaller --chunk-size"
            )

    @torch.inference_mode()
    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
        """Greedy decoding; stops after the model's EOS (included, as the native engine does)."""
        ids = self.lengths.fit_prefix(self.shaper.prefix, list(prompt_ids), max_new_tokens)
        if max_new_tokens < 1:
            return []
        last: list[torch.Tensor] = []
        cache = self._stream(ids, lambda start, stop: [stop - 1 - start] if stop == len(ids) else [], lambda s, r, l: last.append(l[-1]))
        out: list[int] = []
        next_id = int(last[-1].argmax())
        while True:
            out.append(next_id)
            if next_id in self.stop_ids or len(out) == max_new_tokens:
                return out
            if self.chunked:
                step = torch.tensor([next_id], dtype=torch.long, device=self.model.device)
                logits, cache = self._forward(step, cache, [0])
            else:  # no cache: the whole sequence again
                logits = self._logits_at(ids + out, [len(ids) + len(out) - 1])
            next_id = int(logits[-1].argmax())

    @torch.inference_mode()
    def token_nll(self, ids: Sequence[int], score_from: int = 1) -> torch.Tensor:
        """NLL (float32, CPU) of ids[t] for t in [score_from, len(ids)); a BOS, if the model
        takes one, goes in front but is neither scored nor counted. With nothing in front,
        token 0 is not predicted: NaN."""
        if not 0 <= score_from <= len(ids):
            raise ValueError(f"score_from must be in [0, {len(ids)}], got {score_from}")
        full = self.lengths.fit_prefix(self.shaper.prefix, list(ids))
        prefix = full[: len(full) - len(ids)]
        if score_from == 0 and not prefix:
            return F.pad(self.token_nll(ids, 1), (1, 0), value=float("nan")) if ids else torch.zeros(0)
        first = len(prefix) + score_from  # first scored index in `full`
        targets = torch.tensor(full, dtype=torch.long)
        pieces: list[torch.Tensor] = []

        def rows_for(start, stop):  # row r predicts full[start + r + 1]
            return list(range(max(first - 1 - start, 0), min(stop, len(full) - 1) - start))

        def score(start, rows, logits):
            wanted = targets[start + rows[0] + 1 : start + rows[-1] + 2].to(logits.device)
            pieces.append(F.cross_entropy(logits, wanted, reduction="none").cpu())

        self._stream(full, rows_for, score)
        return torch.cat(pieces) if pieces else torch.zeros(0)
