"""Content fingerprints: short hashes of what a result was built from.

A result row carries the fingerprint of everything that determined its prompt and its
scoring; resume, summaries and comparisons match on it, so a changed input can never
reuse or pool a number made from another one.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

LENGTH = 16  # hex digits kept: 64 bits, far beyond any collision a results table meets


def digest(payload: Any) -> str:
    """The fingerprint of a JSON-able value (keys sorted, so dict order never matters)."""
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:LENGTH]


def file_digest(path: str | Path) -> str:
    """The fingerprint of a file's bytes (remembered per path, size and modification time)."""
    path = Path(path).resolve()
    stat = path.stat()
    return _file_digest(str(path), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=256)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()[:LENGTH]


def scaled_hash(model_hash: str, rope_scaling: str | None) -> str:
    """A model's hash when run with RoPE scaled at inference: the same weights computing something
    else are another model, so rows, resume and tables keep them apart from the unscaled one's."""
    return model_hash if rope_scaling is None else digest([model_hash, rope_scaling])
