"""Hand-made result rows for the results-layer tests: no model, fully deterministic."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pandas as pd

from bamctl.results.schema import rows_to_table
from bamctl.results.store import to_pandas

BASE_TIME = datetime(2025, 1, 1, tzinfo=timezone.utc)

UNSET: Any = object()  # a keyword left out, as opposed to one given as None (a null column)

# name -> (model_hash, train_length, pe)
MODELS = {
    "tiny-rope": ("a1" * 16, 512, "rope"),
    "tiny-bam": ("b2" * 16, 512, "bam"),
    "tiny-alibi": ("c3" * 16, 512, "alibi"),
    "tiny-nope": ("d4" * 16, 512, "nope"),
    "tiny-fire": ("e5" * 16, 512, "fire"),
}


def fake_row(
    model: str = "tiny-rope",
    *,
    task: str = "passkey",
    protocol: str = "authors",
    setting: str = "",
    scoring: str = "teacher_forced",
    length: int = 1024,
    depth: float | None = 0.5,
    seed: int = 0,
    sample: int = 0,
    score: float = 1.0,
    nll: float | None = None,
    n_scored: int | None = None,
    created_at: datetime | None = None,
    run_id: str = "run-1",
    draw: str | None = UNSET,
    backend: str = UNSET,
    compute_version: str | None = UNSET,
    answer_logprob: float | None = UNSET,
    answer_rank: int | None = UNSET,
) -> dict[str, Any]:
    model_hash, train_length, pe = MODELS[model]
    perplexity = nll is not None
    given = {"draw": draw, "backend": backend, "compute_version": compute_version, "answer_logprob": answer_logprob,
             "answer_rank": answer_rank}
    return {
        "run_id": run_id,
        "created_at": created_at or BASE_TIME,
        "task": task,
        "protocol": protocol,
        "setting": setting,
        "scoring": scoring,
        "fingerprint": f"fp-{task}-{protocol}",
        "model": model,
        "model_hash": model_hash,
        "backend": "native",
        "request_digest": f"rq-{task}-{length}-{depth}-{seed}-{sample}",
        "compute_version": "cv-1",
        "pe": pe,
        "ssmax": pe == "bam",
        "train_length": train_length,
        "length": length,
        "n_tokens": length - 3,
        "depth": depth,
        "needle_depth": depth,
        "bos": False,
        "sample": sample,
        "seed": seed,
        "draw": f"doc@{sample * length}" if perplexity else f"{seed}/{sample}",
        "document_start": sample * length if perplexity else None,
        "dropped_tokens": 0,
        "served_token_gap": None,
        "expected": None if perplexity else "12345",
        "predicted": None if perplexity else ("12345" if score >= 1 else "99999"),
        "correct": None if perplexity else score >= 1,
        "score": score,
        # a right key near certain, a wrong one far down: any value a teacher-forced row may hold
        "answer_logprob": None if perplexity else (-0.05 if score >= 1 else -7.5),
        "answer_rank": None if perplexity else (1 if score >= 1 else 12),
        "nll": nll,
        "n_scored": n_scored,
        "position": 0 if perplexity else None,
        "seconds": 0.25,
        "tokens_per_s": (length - 3) / 0.25,
        "peak_mem_bytes": None if perplexity else 1 << 20,
        "device": "cpu",
        "dtype": "float32",
        "attention": "sdpa",
        "skipped_blocks": None,
        "key_blocks": None,
        "rope_scaling": None,
        "model_revision": None,
        "bamctl_version": "0.1.0",
        "git_revision": None,
        "torch_version": "2.13.0",
    } | {name: value for name, value in given.items() if value is not UNSET}


def frame_of(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The frame `ResultStore.read()` gives for these rows: the schema's columns typed as stored."""
    return to_pandas(rows_to_table(rows))


def keys_found(model: str, right_of: dict[int, tuple[int, int]]) -> list[dict[str, Any]]:
    """Per length, (keys right, keys): one prompt per key, so each key is one 0/1 outcome."""
    return [fake_row(model, length=length, depth=0.5, sample=i, score=1.0 if i < right else 0.0)
            for length, (right, keys) in right_of.items() for i in range(keys)]


def passkey_grid(
    models: tuple[str, ...] = ("tiny-rope", "tiny-bam"),
    lengths: tuple[int, ...] = (512, 1024, 2048, 4096),
    depths: tuple[float, ...] = (0.0, 0.5, 1.0),
    samples: int = 4,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """A deterministic grid: tiny-rope fails past its training length, tiny-bam holds to 2048."""
    rows = []
    i = 0
    for model in models:
        train = MODELS[model][1]
        reach = train if model == "tiny-rope" else 4 * train
        for length in lengths:
            for depth in depths:
                for sample in range(samples):
                    # one miss per cell at the reachable lengths, so intervals are not degenerate
                    score = 1.0 if (length <= reach and (sample + int(depth * 100)) % 12 != 1) else (1.0 if sample == 0 and length <= 2 * train else 0.0)
                    rows.append(
                        fake_row(model, length=length, depth=depth, sample=sample, score=score, seed=seed,
                                 created_at=BASE_TIME + timedelta(microseconds=i))
                    )
                    i += 1
    return rows


def perplexity_rows() -> list[dict[str, Any]]:
    rows = []
    for model, base in (("tiny-rope", 2.0), ("tiny-bam", 1.5)):
        for length in (512, 1024):
            for sample in range(2):
                n_scored = length - 1
                rows.append(
                    fake_row(model, task="ppl", protocol="sliding", scoring="nll", length=length, depth=None, sample=sample,
                             score=base, nll=base * n_scored, n_scored=n_scored)
                )
    return rows
