"""Devices and dtypes by name: what ``--device`` and ``--dtype`` resolve to.

Used by the streaming engine, the trainer and the Hugging Face back-end alike, so it
sits below all of them and imports nothing of bamctl's but errors.
"""

from __future__ import annotations

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
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
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
