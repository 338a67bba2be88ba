"""The CPU allocator of a training process: freed memory stays in the process for the next step.

glibc's ``malloc`` hands every block above its mmap threshold (32 MiB at most) to ``mmap`` and
gives it back with ``munmap`` when it is freed, and returns the top of the heap to the system
past its trim threshold. A training step allocates the same large tensors every time (lm-bam's
16 × 256 × 4,001 float32 logits are 65 MB, and their gradients as large), so by default each
step maps them, has the kernel zero the new pages, and unmaps them again: about a quarter of a
CPU training step's time went there (BENCHMARKS.md, "Training: the CPU allocator"). With mmap
off (``M_MMAP_MAX = 0``) and trimming off (``M_TRIM_THRESHOLD`` at its largest), freed blocks
are reused from the heap. The process keeps its peak memory until it exits, which a training
run does anyway. Numbers are unchanged: only where memory comes from moves
(``tests/test_train_loop.py`` holds the weights equal after training either way).
"""

from __future__ import annotations

import ctypes
import platform

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_MAX = -4
ALLOCATORS = ("keep", "system")  # bamctl train --cpu-allocator


def keep_freed_cpu_memory() -> bool:
    """Set glibc's malloc to keep freed memory for the rest of this process; False where the C
    library is not glibc (nothing changes there)."""
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
