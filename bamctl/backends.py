"""Back-ends: what answers a task's requests. Tasks never see models, only these three calls.

- ``score_continuation(prompt_ids, target_ids)``: teacher-forced argmax and log-probs;
- ``generate(prompt_ids, max_new_tokens)``: greedy continuation;
- ``token_nll(ids, score_from)``: per-token negative log-likelihood.

A model reference picks its back-end: a catalog name or checkpoint directory is served
by the native streaming engine; ``PREFIX:PATH`` references go to the back-end registered
under PREFIX, imported only when asked for (heavy dependencies stay unloaded otherwise).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch

from bamctl.errors import BamctlError
from bamctl.tokenizer import Tokenizer, get_tokenizer


@dataclass(frozen=True)
class ModelInfo:
    """How a model is described in every result row."""

    name: str
    model_hash: str
    pe: str
    ssmax: bool
    train_length: int


class Backend(Protocol):
    info: ModelInfo
    tokenizer: Tokenizer
    device: str
    dtype: str
    attention: str

    def score_continuation(self, prompt_ids: Sequence[int], target_ids: Sequence[int]): ...

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]: ...

    def token_nll(self, ids: Sequence[int], score_from: int = 1) -> torch.Tensor: ...


@dataclass(frozen=True)
class EngineOptions:
    """How to run a model; every evaluation command exposes these as options."""

    device: str = "auto"
    dtype: str = "auto"
    chunk_size: int = 2048
    attention: str = "auto"
    tokenizer: str | None = None  # a tokenizer path or name overriding the model's own (external models)
    beyond_max: str = "warn"  # past a model's configured max positions: "warn" and run, or "refuse"
    chat_template: bool = False  # external chat models: wrap prompts in their template
    tensor_parallel: int = 1  # vLLM: GPUs one model is split over


class EngineBackend:
    """A ``bamctl.model.Transformer`` run by the streaming engine, with a tokenizer."""

    def __init__(self, checkpoint, tokenizer: Tokenizer, name: str, options: EngineOptions):
        from bamctl.engine.stream import StreamingEngine

        config = checkpoint.model.config
        self.checkpoint = checkpoint
        self.tokenizer = tokenizer
        self.engine = StreamingEngine(
            checkpoint.model,
            device=options.device,
            dtype=options.dtype,
            chunk_size=options.chunk_size,
            attention=options.attention,
        )
        self.info = ModelInfo(
            name=name,
            model_hash=checkpoint.model_hash,
            pe=config.pe,
            ssmax=config.ssmax,
            train_length=config.train_length,
        )
        self.device = str(self.engine.device)
        self.dtype = str(self.engine.dtype).removeprefix("torch.")
        self.attention = self.engine.attention

    def score_continuation(self, prompt_ids, target_ids):
        return self.engine.score_continuation(prompt_ids, target_ids)

    def generate(self, prompt_ids, max_new_tokens):
        eos = () if self.tokenizer.eos_id is None else (self.tokenizer.eos_id,)
        return self.engine.generate(prompt_ids, max_new_tokens, stop_ids=eos)

    def token_nll(self, ids, score_from=1):
        return self.engine.token_nll(ids, score_from)

    def check_fits(self, n_tokens: int) -> None:
        self.engine.check_fits(n_tokens)


class NativeBackend(EngineBackend):
    """A bamctl checkpoint (catalog name or directory)."""

    def __init__(self, reference: str, options: EngineOptions):
        from bamctl.catalog import resolve_model

        checkpoint = resolve_model(reference)
        tokenizer = get_tokenizer(options.tokenizer or checkpoint.model.config.tokenizer)
        super().__init__(checkpoint, tokenizer, reference.rstrip("/").split("/")[-1], options)


def _authors_backend(path: str, options: EngineOptions) -> Backend:
    from bamctl.external.authors import AuthorsBackend

    return AuthorsBackend(path, options)


def _hf_backend(path: str, options: EngineOptions) -> Backend:
    from bamctl.external.hf import HFBackend

    return HFBackend(path, options)


def _vllm_backend(path: str, options: EngineOptions) -> Backend:
    from bamctl.external.vllm import VLLMBackend

    return VLLMBackend(path, options)


# prefix -> factory(path, options); each imports its heavy dependencies only when called.
PREFIXED_BACKENDS: dict[str, Callable[[str, EngineOptions], Backend]] = {
    "bam": _authors_backend,  # the BAM authors' model.pt + args.json
    "hf": _hf_backend,  # a local Hugging Face causal LM
    "vllm": _vllm_backend,  # the same through vLLM (GPU extra)
}


def open_backend(reference: str, options: EngineOptions = EngineOptions()) -> Backend:
    prefix, sep, rest = reference.partition(":")
    if sep and len(prefix) > 1 and "/" not in prefix:  # not a Windows drive, not a path
        if prefix not in PREFIXED_BACKENDS:
            close = difflib.get_close_matches(prefix, PREFIXED_BACKENDS, n=2)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            known = ", ".join(PREFIXED_BACKENDS) or "none installed yet"
            raise BamctlError(f"unknown back-end prefix {prefix!r} in {reference!r}{hint} (known: {known})")
        return PREFIXED_BACKENDS[prefix](rest, options)
    from bamctl.external.authors import is_authors_checkpoint

    if is_authors_checkpoint(reference):  # a bare path to the authors' model.pt + args.json
        return _authors_backend(reference, options)
    return NativeBackend(reference, options)
