"""Devices and dtypes by name: what ``--device`` and ``--dtype`` resolve to.

Used by the streaming engine, the trainer and the Hugging Face back-end alike, so it
sits below all of them and imports nothing of bamctl's but errors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bamctl.errors import BamctlError

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
# Precisions that keep float32 weights and run the forward pass under ``torch.autocast`` at
# a lower dtype, as the BAM authors' evaluation does on CUDA (their evaluate.py, --dtype
# bfloat16; on a CPU theirs runs float32): matmuls in bfloat16, the residual stream, norms and
# priors in float32. Both spellings; rows record the first. Every name starts "autocast-"
# (bamctl.backends.base refuses them by that prefix).
AUTOCAST_DTYPES = {
    "autocast-bfloat16": torch.bfloat16,
    "autocast-bf16": torch.bfloat16,
}


@dataclass(frozen=True)
class Precision:
    """What ``--dtype`` asks of bamctl's engine: the weights' dtype and, under autocast, the
    dtype autocast computes in."""

    weights: torch.dtype
    autocast: torch.dtype | None = None

    @property
    def activations(self) -> torch.dtype:
        """What the matmuls produce, and so what the KV cache holds."""
        return self.autocast or self.weights

    @property
    def label(self) -> str:
        """The name a result row records: ``float32``, ``bfloat16``, ``autocast-bfloat16`` …"""
        name = str(self.activations).removeprefix("torch.")
        return f"autocast-{name}" if self.autocast is not None else name


def resolve_precision(name: str, device: torch.device) -> Precision:
    """``--dtype`` for bamctl's engine: every dtype of ``resolve_dtype``, and the autocast ones."""
    if name in AUTOCAST_DTYPES:
        return Precision(torch.float32, AUTOCAST_DTYPES[name])
    if name != "auto" and name not in DTYPES:
        raise BamctlError(f"unknown dtype {name!r}; use auto, float32, bfloat16, float16 or autocast-bfloat16")
    return Precision(resolve_dtype(name, device))


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise BamctlError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BamctlError(f"device {name!r} asked for, but no CUDA GPU is available here")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """One dtype for a whole model (``resolve_precision`` adds the autocast precisions)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name in AUTOCAST_DTYPES:
        raise BamctlError(f"--dtype {name} (float32 weights under autocast) runs on bamctl's streaming engine only; "
                          "use float32, bfloat16 or float16 here")
    try:
        return DTYPES[name]
    except KeyError:
        raise BamctlError(f"unknown dtype {name!r}; use auto, float32, bfloat16 or float16") from None


def available_bytes(device: torch.device) -> int:
    """Memory a run may still take: free GPU memory, or the kernel's MemAvailable on a CPU."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62  # unknown: do not refuse


MEMORY_SAFETY = 0.9  # a run plans to use at most this share of the memory reported available
