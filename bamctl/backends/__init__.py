"""Back-ends: what answers a task's requests (``base.Backend``), found by a model reference.

A catalog name or checkpoint directory is served by bamctl's streaming engine
(``native``), unless the directory holds a user's module trained by a recipe (``trained-py``,
``bamctl.module_checkpoint``), which runs as a ``py:`` model; ``PREFIX:PATH`` references go to the back-end registered under PREFIX (``py:FILE.py:FUNCTION``:
a plain PyTorch module a user's function builds; ``openai:NAME``: a model an OpenAI-compatible server serves);
a bare path to the BAM authors' ``model.pt`` + ``args.json`` goes to ``authors``; a model
object already in memory (``in_memory``) goes to the back-end its kind has on disk.
Each back-end module is imported only when a reference asks for it, so heavy
dependencies (transformers, vLLM) stay unloaded otherwise.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path

from bamctl.backends.base import (
    AuthorsOptions,
    Backend,
    ContinuationScore,
    EngineOptions,
    HFOptions,
    ModelInfo,
    ModuleOptions,
    ModelPeek,
    RunOptions,
    ServedOptions,
    TrainedModuleOptions,
    VLLMOptions,
    options_for,
)
from bamctl.errors import BamctlError, did_you_mean

__all__ = ["Backend", "ContinuationScore", "ModelInfo", "ModelPeek", "RunOptions", "BACKENDS", "PREFIXES", "open_backend", "peek_backend"]


@dataclass(frozen=True)
class BackendEntry:
    """Where a back-end lives and what it takes; ``module:Class`` is imported on use."""

    target: str  # "bamctl.backends.hf:HFBackend"
    options: type  # its option type (bamctl.backends.base)
    what: str  # how errors name it: "hf: models"
    peeker: str  # "bamctl.backends.hf_common:peek": reads a reference's lengths without loading the model

    def options_for(self, run: RunOptions):
        return options_for(self.options, run, self.what)

    def open(self, reference: str, run: RunOptions) -> Backend:
        return _load(self.target)(reference, self.options_for(run))

    def peek(self, reference: str, options) -> ModelPeek:
        """``options``: the back-end's own (``options_for``), for what a peek depends on (trust_remote_code)."""
        return _load(self.peeker)(reference, options)


def _load(target: str):
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


BACKENDS: dict[str, BackendEntry] = {
    "native": BackendEntry("bamctl.backends.native:NativeBackend", EngineOptions, "bamctl's own models", "bamctl.backends.native:peek"),
    "bam": BackendEntry("bamctl.backends.authors:AuthorsBackend", AuthorsOptions, "the BAM authors' checkpoints (bam:)", "bamctl.backends.authors:peek"),
    "hf": BackendEntry("bamctl.backends.hf:HFBackend", HFOptions, "hf: models", "bamctl.backends.hf_common:peek"),
    "vllm": BackendEntry("bamctl.backends.vllm:VLLMBackend", VLLMOptions, "vllm: models", "bamctl.backends.hf_common:peek"),
    "py": BackendEntry("bamctl.backends.module:PyBackend", ModuleOptions, "py: models (plain PyTorch modules)",
                       "bamctl.backends.module:peek"),
    "trained-py": BackendEntry("bamctl.backends.module:TrainedModuleBackend", TrainedModuleOptions,
                               "a trained module's checkpoint (bamctl train --model py:...)",
                               "bamctl.backends.module:peek_trained"),
    "openai": BackendEntry("bamctl.backends.served:ServedBackend", ServedOptions,
                           "openai: models (served through an OpenAI-compatible API)", "bamctl.backends.served:peek"),
}
# Prefixes a reference may carry: PREFIX:PATH.
PREFIXES = ("bam", "hf", "vllm", "py", "openai")


# A model reference may end in @KIND:FACTOR: that model with RoPE scaled at inference (rope@yarn:8).
_ROPE_SUFFIX = re.compile(r"@(linear|ntk|yarn):([0-9]*\.?[0-9]+)$")


def split_rope_suffix(reference: str, options: RunOptions) -> tuple[str, RunOptions]:
    """``rope@ntk:8`` -> ("rope", options with RoPE scaling ntk by 8); other references unchanged."""
    match = _ROPE_SUFFIX.search(reference)
    if match is None:
        return reference, options
    if options.rope_scaling is not None:
        raise BamctlError(f"{reference} names a RoPE scaling; drop --rope-scaling or the @ suffix")
    return reference[: match.start()], replace(options, rope_scaling=match.group(1), rope_factor=float(match.group(2)))


def backend_for(reference: str) -> tuple[BackendEntry, str]:
    """The back-end a model reference names, and the rest of the reference (its path or name)."""
    prefix, sep, rest = reference.partition(":")
    if sep and len(prefix) > 1 and "/" not in prefix:  # not a Windows drive, not a path
        if prefix not in PREFIXES:
            raise BamctlError(f"unknown back-end prefix {prefix!r} in {reference!r}{did_you_mean(prefix, PREFIXES)}")
        return BACKENDS[prefix], rest
    if is_authors_folder(reference):  # a bare path to the authors' model.pt + args.json
        return BACKENDS["bam"], reference
    from bamctl.module_checkpoint import is_module_checkpoint

    if is_module_checkpoint(reference):  # a user's module trained by a recipe, its code beside it
        return BACKENDS["trained-py"], reference
    return BACKENDS["native"], reference


def is_authors_folder(path: str) -> bool:
    folder = Path(path).expanduser()
    return (folder / "model.pt").is_file() and (folder / "args.json").is_file()


def open_backend(reference, options: RunOptions = RunOptions()) -> Backend:
    """The back-end of a reference, or of a model in memory (``bamctl.backends.in_memory``)."""
    if not isinstance(reference, str):
        return reference.open(options)
    reference, options = split_rope_suffix(reference, options)
    entry, rest = backend_for(reference)
    return entry.open(rest, options)


def options_not_taken(reference, options: RunOptions) -> list[str]:
    """The names of the options asked in ``options`` that the back-end of ``reference`` does not take
    (a comparison of models of several back-ends applies each option to the models it applies to).
    A model in memory is checked when it opens: none."""
    if not isinstance(reference, str):
        return []
    entry, _ = backend_for(split_rope_suffix(reference, options)[0])
    known = {f.name for f in fields(entry.options)}
    return [name for name in options.asked() if name not in known]


def peek_backend(reference, options: RunOptions = RunOptions()) -> ModelPeek:
    """Check a reference and the options against its back-end, and read its lengths, loading nothing."""
    if not isinstance(reference, str):
        return reference.peek(options)
    reference, options = split_rope_suffix(reference, options)
    entry, rest = backend_for(reference)
    taken = entry.options_for(options)  # refuses, by name, any option this back-end cannot honour
    return entry.peek(rest, taken)
