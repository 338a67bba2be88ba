"""Models already in memory: a bamctl ``Transformer``, a Hugging Face causal LM, or any PyTorch module, with its tokenizer.

A training loop evaluates the model it is training without saving it first
(``bamctl.evaluate(model, task="passkey", lengths="1k..8k")`` every N steps). Such a model
has no file to hash, so its identity in result rows is the hash of what it computes with:
its state dict (every tensor's name, dtype, shape and bytes) and its config, taken when the
run opens it (once per call). The same weights find their stored rows again; a step later
they are another model.

It runs where it lives: its own device and dtype unless others are asked, and then on a
copy, so the caller's weights are never cast or moved. The back-ends put it in eval mode;
``bamctl.api`` puts it back as it found it. It is served by the back-end its kind has on
disk (``native``: bamctl's streaming engine; ``hf``: the same transformers loop as ``hf:``;
``module``: a plain module's own forward, as ``py:`` references run), so its numbers are those
of the same weights loaded from a folder.
"""

from __future__ import annotations

import copy
import hashlib
from collections import Counter
from dataclasses import dataclass, replace

import torch

from bamctl.backends.base import EngineOptions, HFOptions, ModelPeek, RunOptions, options_for
from bamctl.errors import BamctlError
from bamctl.fingerprints import digest


def state_digest(module: torch.nn.Module) -> str:
    """SHA-256 over every tensor of the state dict: name, dtype, shape and bytes, in name order."""
    sha = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        sha.update(f"{name}:{flat.dtype}:{tuple(tensor.shape)}:".encode())
        sha.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    return sha.hexdigest()


def own_dtype(module: torch.nn.Module) -> str:
    """The dtype most of the module's floating-point weights are in ("float32", "bfloat16", ...)."""
    counts = Counter(p.dtype for p in module.parameters() if p.is_floating_point())
    dtype = counts.most_common(1)[0][0] if counts else torch.float32
    return str(dtype).removeprefix("torch.")


def own_device(module: torch.nn.Module) -> str:
    first = next(module.parameters(), None)
    return "cpu" if first is None else str(first.device)


@dataclass(frozen=True)
class _Weights:
    """What ``EngineBackend`` takes of a checkpoint: the model and its identity."""

    model: torch.nn.Module
    model_hash: str


class InMemory:
    """A model object and the name its rows are given; ``peek`` and ``open`` as a reference's back-end."""

    what = "a model in memory"

    def __init__(self, module: torch.nn.Module, name: str):
        self.module, self.name = module, name

    @property
    def label(self) -> str:
        return f"{self.name} (in memory)"

    def _here(self, run: RunOptions) -> RunOptions:
        """The run's options with the model's own device and dtype where none were asked."""
        return replace(run, device=run.device or own_device(self.module), dtype=run.dtype or own_dtype(self.module))

    def _module_for(self, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
        """The module itself where it already lives on ``device`` in ``dtype``; a copy otherwise."""
        if torch.device(own_device(self.module)) == device and own_dtype(self.module) == str(dtype).removeprefix("torch."):
            return self.module
        return copy.deepcopy(self.module)


class TransformerInMemory(InMemory):
    """A ``bamctl.model.Transformer``: run by the streaming engine, with the tokenizer its config names."""

    def peek(self, run: RunOptions) -> ModelPeek:
        options_for(EngineOptions, self._here(run), self.what)
        config = self.module.config
        subset = config.token_subset
        return ModelPeek(train_length=config.train_length, tokenizer=config.tokenizer,
                         token_subset=None if subset is None else frozenset(subset))

    def open(self, run: RunOptions):
        from bamctl.backends.native import EngineBackend
        from bamctl.checkpoint import model_identity
        from bamctl.devices import resolve_device, resolve_precision
        from bamctl.tokenizer import get_tokenizer

        options = options_for(EngineOptions, self._here(run), self.what)
        device = resolve_device(options.device)
        module = self._module_for(device, resolve_precision(options.dtype, device).weights)
        weights = _Weights(module, model_identity(state_digest(module), module.config))
        return EngineBackend(weights, get_tokenizer(module.config.tokenizer), self.name, options)


class HFModelInMemory(InMemory):
    """A transformers causal LM module with its tokenizer: run by the ``hf`` back-end's loop."""

    what = "a Hugging Face model in memory"

    def __init__(self, module: torch.nn.Module, tokenizer, name: str):
        super().__init__(module, name)
        if tokenizer is None:
            raise BamctlError(f"{name}: a Hugging Face model in memory needs its tokenizer: pass (model, tokenizer)")
        self.tokenizer = tokenizer

    def peek(self, run: RunOptions) -> ModelPeek:
        from bamctl.backends.hf_common import max_positions, trained_length

        options_for(HFOptions, self._here(run), self.what)
        limit = max_positions(self.module.config)
        return ModelPeek(train_length=trained_length(self.module.config, limit), max_length=limit)

    def open(self, run: RunOptions):
        from bamctl.backends.hf import HFBackend
        from bamctl.backends.hf_tokenizer import tokenizer_in_memory
        from bamctl.devices import resolve_device, resolve_dtype

        options = options_for(HFOptions, self._here(run), self.what)
        device = resolve_device(options.device)
        module = self._module_for(device, resolve_dtype(options.dtype, device))
        config = module.config.to_dict()
        config.pop("_name_or_path", None)  # where it was once loaded from is not what it computes
        generation = getattr(module, "generation_config", None)
        identity = digest({"weights": state_digest(module), "config": config,
                           "generation": generation.to_dict() if generation is not None else None})
        tokenizer = tokenizer_in_memory(self.tokenizer, self.name)
        return HFBackend.around(module, tokenizer, self.name, identity, options)


class ModuleInMemory(InMemory):
    """Any other ``torch.nn.Module`` (a nanoGPT fork, an x-transformers wrapper ...) with its tokenizer,
    run by ``bamctl.backends.module`` through its own forward (or cached step)."""

    what = "a plain PyTorch module"

    def __init__(self, found, name: str):
        super().__init__(found.module, name)
        self.found = found

    def peek(self, run: RunOptions) -> ModelPeek:
        from bamctl.backends.base import ModuleOptions
        from bamctl.backends.module import train_length

        options_for(ModuleOptions, self._here(run), self.what)
        return ModelPeek(train_length=train_length(self.found, self.name))

    def open(self, run: RunOptions):
        from bamctl.backends.base import ModuleOptions
        from bamctl.backends.module import ModuleBackend
        from bamctl.devices import resolve_device, resolve_dtype

        options = options_for(ModuleOptions, self._here(run), self.what)
        device = resolve_device(options.device)
        module = self._module_for(device, resolve_dtype(options.dtype, device))
        return ModuleBackend(replace(self.found, module=module, name=self.name), options)


def is_transformers_model(model) -> bool:
    """A transformers ``PreTrainedModel`` (its own classes, or a folder's remote code built on them),
    told by the class's ancestry: asking ``transformers.PreTrainedModel`` itself imports its whole
    modeling stack (1.6 s) for every module that is not one."""
    return any(cls.__name__ == "PreTrainedModel" and cls.__module__.startswith("transformers.")
               for cls in type(model).__mro__)


def in_memory(model, tokenizer=None, name: str | None = None) -> InMemory:
    """A model object as a run takes it: a bamctl ``Transformer``; a transformers model and its
    ``tokenizer``; or any other ``torch.nn.Module`` (alone, with its tokenizer, or a dict with
    'model', 'tokenizer', 'step', 'train_length', 'name': ``bamctl.backends.module``).
    ``name``: what its rows are called."""
    from bamctl.model import Transformer

    if isinstance(model, Transformer):
        if tokenizer is not None:
            raise BamctlError("a bamctl Transformer takes the tokenizer its config names; pass no tokenizer")
        return TransformerInMemory(model, name or f"in-memory-{model.config.label}")
    if is_transformers_model(model):
        path = str(getattr(model.config, "_name_or_path", "") or "").rstrip("/")
        default = path.split("/")[-1] if path else getattr(model.config, "model_type", None) or type(model).__name__
        return HFModelInMemory(model, tokenizer, name or f"in-memory-{default}")
    if isinstance(model, (torch.nn.Module, dict)):
        from bamctl.backends.module import user_model

        found = user_model(model, tokenizer, who=name or "the model")
        return ModuleInMemory(found, name or found.name or f"in-memory-{type(found.module).__name__}")
    raise BamctlError(f"cannot evaluate a {type(model).__name__}: give a model reference (a catalog name, folder or "
                      "PREFIX:PATH), a torch.nn.Module with its tokenizer, or a bamctl Transformer")
