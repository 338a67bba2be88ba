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
file (or a folder holding exactly one), which transformers dequantises on load; or a Hub
id, ``ORG/NAME[@REVISION]``, found in (or, online, downloaded into) the Hugging Face cache
by ``bamctl.backends.hub``. Loading itself is ``local_files_only``, from that folder.
"""

from __future__ import annotations

import inspect
from functools import partial

import torch

from bamctl.backends.base import HFOptions, ModelInfo, auto_batch_size, decode_known, stop_tests
from bamctl.backends.logits_loop import LogitsLoopBackend
from bamctl.backends.hf_common import (
    LengthPolicy,
    RequestShaper,
    check_remote_code,
    estimate_bytes,
    find_model,
    import_transformers,
    max_positions,
    no_questions,
    positional_encoding,
    trained_length,
)
from bamctl.devices import resolve_device, resolve_dtype
from bamctl.errors import BamctlError
from bamctl.fingerprints import scaled_hash


def scaled_config(reference: str, kind: str, factor: float, trust_remote_code: bool = False):
    """The model's config with RoPE scaled at inference (transformers' ``rope_type`` linear or yarn),
    from the length it was trained at."""
    from bamctl.backends.hf_common import read_config

    config, _, _ = read_config(reference, trust_remote_code)
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


class HFBackend(LogitsLoopBackend):
    kind = "hf"
    compute_libraries = LogitsLoopBackend.compute_libraries + ("transformers", "tokenizers")

    def __init__(self, reference: str, options: HFOptions):
        from bamctl.backends.hf_tokenizer import model_tokenizer

        import_transformers()
        from transformers import AutoModelForCausalLM

        files = find_model(reference)
        folder, gguf_file = files.folder, files.gguf_file
        device = resolve_device(options.device)
        dtype = resolve_dtype(options.dtype, device)
        check_remote_code(folder, files.name, options.trust_remote_code)
        kwargs = {"local_files_only": True, "trust_remote_code": options.trust_remote_code,
                  **({"gguf_file": gguf_file} if gguf_file else {})}
        if options.rope_scaling is not None:  # into the config, as transformers reads it
            kwargs["config"] = scaled_config(reference, options.rope_scaling, options.rope_factor,
                                             options.trust_remote_code)
        try:
            with no_questions():
                try:
                    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, **kwargs)
                except TypeError:  # transformers < 4.56 names it torch_dtype
                    model = AutoModelForCausalLM.from_pretrained(str(folder), torch_dtype=dtype, **kwargs)
        except (OSError, ValueError, ImportError) as err:
            raise BamctlError(f"hf: cannot load {reference}: {str(err).splitlines()[0]}") from None
        rope_label = None if options.rope_scaling is None else f"{options.rope_scaling}:{options.rope_factor:g}"
        self._adopt(model, model_tokenizer(folder, gguf_file, options.tokenizer, reference, options.trust_remote_code), files.name,
                    scaled_hash(files.model_hash(), rope_label), options, revision=files.revision, rope_label=rope_label)

    @classmethod
    def around(cls, model, tokenizer, name: str, model_hash: str, options: HFOptions) -> "HFBackend":
        """A module already built (``bamctl.backends.in_memory``) with a tokenizer in bamctl's form;
        moved to ``options``' device and dtype, which the caller chose."""
        if options.rope_scaling is not None:
            raise BamctlError("--rope-scaling of a model in memory: set rope_scaling in its config before building it")
        if options.tokenizer is not None:
            raise BamctlError("a model in memory comes with its tokenizer: give that one, not tokenizer=")
        backend = cls.__new__(cls)
        backend._adopt(model, tokenizer, name, model_hash, options)
        return backend

    def _adopt(self, model, tokenizer, name: str, model_hash: str, options: HFOptions, *, revision: str | None = None,
               rope_label: str | None = None) -> None:
        device = resolve_device(options.device)
        dtype = resolve_dtype(options.dtype, device)
        self.model = model.to(device=device, dtype=dtype).eval()
        self.run_device = self.model.device
        self.tokenizer = tokenizer
        config = self.model.config
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
            model_hash=model_hash,
            pe=positional_encoding(config),
            ssmax=False,
            train_length=trained_length(config, limit),
            rope_scaling=rope_label,
            model_revision=revision,
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
    def _forward(self, ids: torch.Tensor, cache, rows: list[int] | None, **inputs):
        """Logits (B, len(rows), V) for local ``rows`` of this chunk of ``ids`` (B, T), and the cache after it."""
        kwargs = {"input_ids": ids, "use_cache": self.chunked, **inputs}
        if self.chunked:
            kwargs[self.cache_arg] = cache  # a DynamicCache, filled in place
        if self.keep_arg == "logits_to_keep":
            kwargs["logits_to_keep"] = torch.tensor(rows, device=ids.device) if rows else 1
        out = self.model(**kwargs)
        if rows is None:
            return None, cache
        logits = out.logits
        if self.keep_arg != "logits_to_keep":
            logits = logits[:, rows]
        return logits.float(), cache

    def _new_cache(self, batch: int = 1, longest: int = 0):
        if not self.chunked:
            return None
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self.model.config)
        except TypeError:  # older transformers take no config
            return DynamicCache()

    # -- request kinds, in batches; one request is a batch of one ------------------------------
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

    def batch_limit(self, n_prompt: int, n_answer: int) -> int:
        """``--batch-size auto``: the token budget of ``auto_batch_size``, within the memory estimate."""
        from bamctl import devices

        n = n_prompt + n_answer
        one = estimate_bytes(self.model, n, self.chunk_size)
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters())
        budget = int(devices.available_bytes(self.model.device) * devices.MEMORY_SAFETY)
        fitting = 0 if one > budget else 1 + (budget - one) // max(one - weights, 1)
        return auto_batch_size(n, int(fitting), self.model.device.type)

    def check_batch_fits(self, n_prompt: int, n_answer: int, batch: int) -> None:
        from bamctl import devices

        n = n_prompt + n_answer
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters())
        need = weights + batch * (estimate_bytes(self.model, n, self.chunk_size) - weights)
        budget = int(devices.available_bytes(self.model.device) * devices.MEMORY_SAFETY)
        if need > budget:
            raise BamctlError(
                f"--batch-size {batch}: {batch} sequences of {n:,} tokens need about {need / 2**30:.1f} GiB for "
                f"{self.info.name} on {self.device}, but only {budget / 2**30:.1f} GiB are available; use --batch-size auto"
            )

    @torch.inference_mode()
    def generate_many(self, prompts, max_new_tokens: int, stop_strings=None) -> list[list[int]]:
        """Greedy decoding of a batch, left-padded: every row's last prompt token sits in the last
        column, so each step appends one column for all. The attention mask hides the padding and
        position ids count only real tokens, so each row sees what it would see alone. Each row
        stops after the model's EOS (included, as the native engine does), a stop string
        (``stop_strings``) or ``max_new_tokens``."""
        fed = [self.lengths.fit_prefix(self.shaper.prefix, list(prompt), max_new_tokens) for prompt in prompts]
        stopped = stop_tests(partial(decode_known, self.tokenizer), stop_strings, len(prompts))
        if max_new_tokens < 1:
            return [[] for _ in prompts]
        if not self.chunked:  # no cache to decode from: each prompt alone, the whole sequence each step
            return [self._generate_uncached(ids, max_new_tokens, stop) for ids, stop in zip(fed, stopped)]
        device = self.model.device
        longest = max(len(ids) for ids in fed)
        tokens = torch.zeros(len(fed), longest, dtype=torch.long)
        mask = torch.zeros(len(fed), longest, dtype=torch.long)
        for b, ids in enumerate(fed):
            tokens[b, longest - len(ids):] = torch.tensor(ids, dtype=torch.long)
            mask[b, longest - len(ids):] = 1
        tokens, mask = tokens.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp_(min=0)
        cache = self._new_cache(len(fed), longest)
        for start in range(0, longest, self.chunk_size):
            stop = min(start + self.chunk_size, longest)
            logits, cache = self._forward(
                tokens[:, start:stop], cache, [stop - 1 - start] if stop == longest else None,
                attention_mask=mask[:, :stop], position_ids=positions[:, start:stop],
            )
        next_ids = logits[:, -1].argmax(-1)
        out: list[list[int]] = [[] for _ in fed]
        done = [False] * len(fed)
        position = positions[:, -1:]
        while True:
            if self._append_greedy(next_ids, out, done, max_new_tokens, stopped):
                return out
            mask = torch.cat([mask, mask.new_ones(len(fed), 1)], dim=1)
            position = position + 1
            logits, cache = self._forward(next_ids[:, None], cache, [0], attention_mask=mask, position_ids=position)
            next_ids = logits[:, -1].argmax(-1)

