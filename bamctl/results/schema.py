"""The typed columns of one result row (one evaluated sample) and the schema version.

`docs/SCHEMA.md` documents the same columns for people; a test keeps the two in step.
Bump `SCHEMA_VERSION` whenever a column is added, removed or changes meaning.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

SCHEMA_VERSION = 10
VERSION_KEY = b"bamctl.schema_version"


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    nullable: bool
    doc: str


COLUMNS: tuple[Column, ...] = (
    Column("run_id", pa.string(), False, "id of the run (one command invocation) that wrote the row"),
    Column("created_at", pa.timestamp("us", tz="UTC"), False, "when the sample finished, UTC"),
    Column("task", pa.string(), False, "task name (Sample.task): passkey, niah_single_1, ..., ppl"),
    Column("protocol", pa.string(), False, "how the task was posed (`--protocol`): passkey authors, exact or landmark (`auto` resolved); ruler for RULER's tasks; ppl sliding or buckets"),
    Column("setting", pa.string(), False, "options that set the prompts apart from the protocol's defaults, as key=value words (e.g. stride=256, bucket=512, corpus=FILE); empty with the defaults"),
    Column("scoring", pa.string(), False, "the request kind the model answered: teacher_forced, generate or nll"),
    Column("fingerprint", pa.string(), True, "hash of everything that made the prompt and its scoring: task spec and generator version, data file contents (texts, word lists, --corpus), tokenizer, resolved options, what the back-end puts around a prompt (BOS, chat template); null in rows written before version 3, and in rows of versions 3 and 4 read today (their `model_hash` covered the weights alone: never trusted)"),
    Column("model", pa.string(), False, "model name as the user gave it"),
    Column("request_digest", pa.string(), True, "digest of exactly what the sample asked of the model: the ids fed, the answer fed after them and its scored targets (or the scored spans), the generation budget, the request kind and metric, what the back-end put around the prompt (BOS, chat template), and the expected answer a generation teacher-forces with `--answer-logprob`; a row is reused only for the same digest; null before version 6 (such rows are recomputed)"),
    Column("model_hash", pa.string(), False, "hash of the model weights and every config field that changes its forward pass (bamctl checkpoints: config.json's `model` table; the authors' checkpoints: the config read from args.json, prior form included; hf:/vllm:: config.json and generation_config.json), and of `rope_scaling` when RoPE is scaled at inference (another model); a renamed folder keeps it; identifies the model"),
    Column("model_revision", pa.string(), True, "the Hub commit sha of an hf:/vllm: model named by its Hub id (`hf:ORG/NAME[@REVISION]`, resolved through the Hugging Face cache); also in `model_hash`, so two revisions never share rows, even with identical weights; null for local folders, bamctl's own models and rows before version 7"),
    Column("backend", pa.string(), True, "the back-end that computed the row: native (bamctl's engine), authors (bam:), hf, vllm; part of the model's identity (an hf and a vLLM run of one checkpoint are two models); null before version 6"),
    Column("compute_version", pa.string(), True, "digest of the code and library versions that turned the request into the row's number (the back-end's module and every bamctl module it reaches, its C++ kernel, the scoring code; torch, transformers, vLLM versions); a docstring or comment edit does not move it; a rerun under another one recomputes unless `--reuse`; null before version 6"),
    Column("pe", pa.string(), False, "positional encoding (rope, alibi, nope, bam, ...)"),
    Column("ssmax", pa.bool_(), False, "whether scalable softmax is on"),
    Column("train_length", pa.int64(), False, "context length the model was trained at, tokens"),
    Column("rope_scaling", pa.string(), True, "RoPE scaled at inference (`--rope-scaling`, `--rope-factor`, or a `@KIND:FACTOR` model suffix), e.g. yarn:8; null when not"),
    Column("length", pa.int64(), False, "target context length of the sample, tokens"),
    Column("n_tokens", pa.int64(), False, "actual length of the prompt (the passkey `authors` protocol's achieved length, usually a little under `length`), tokens"),
    Column("dropped_tokens", pa.int64(), True, "prompt tokens the back-end left out from the prompt's start to fit the model's maximum length (hf:/vllm: at exactly that length, teacher forcing: BOS + answer tokens before the last); 0 almost always; null before version 6"),
    Column("bos", pa.bool_(), True, "whether the back-end put one BOS token before the prompt or document (`--bos`; never counted in `n_tokens`, never scored)"),
    Column("served_token_gap", pa.int64(), True, "openai: the prompt tokens the server said it read for this row's request minus those bamctl sent (`usage.prompt_tokens` against the ids; the larger of a generation's and its teacher-forced answer's); 0 when it read exactly the plan's prompt; a row with another value is not scored (no prediction, no log-probabilities where they could not be aligned) and every summary leaves it out and says how many; null for every other back-end and before version 10"),
    Column("depth", pa.float64(), True, "needle depth asked for (`--depths`), a fraction of the haystack (0 = start, 1 = end); null when the task places its needles itself (RULER's default) or has none"),
    Column("needle_depth", pa.float64(), True, "where the (first) needle landed, a fraction of the haystack (passkey: snapped to a sentence end; RULER: its random placement); null without a needle"),
    Column("sample", pa.int64(), False, "index of the sample (Sample.index) within (task, protocol, length, depth, seed)"),
    Column("seed", pa.int64(), False, "seed the sample was generated from"),
    Column("draw", pa.string(), True, "the independent draw the sample belongs to, the unit statistics count: `SEED/SAMPLE` for passkey and RULER (one key or set of needles at every depth), `doc@START` for perplexity (a document two seeds picked is one draw); null before version 6 (read as SEED/SAMPLE)"),
    Column("document_start", pa.int64(), True, "perplexity only: the document's first token in the corpus (the seed picks the document); null otherwise and before version 6"),
    Column("expected", pa.string(), True, "reference answer; null for perplexity"),
    Column("predicted", pa.string(), True, "model answer; null for perplexity"),
    Column("correct", pa.bool_(), True, "whether the answer counts as right; null for perplexity"),
    Column("score", pa.float64(), False, "the task's metric: in [0, 1] for accuracy tasks (1.0/0.0 for exact match, fraction found for string_match_all); mean token NLL (nll / n_scored) for perplexity; per task in \"What `score` holds\" below"),
    Column("answer_logprob", pa.float64(), True, "the answer's summed log-probability under teacher forcing, nats (at most 0): the log-probabilities of the answer tokens `score` judges (passkey: the key's digits; a generated row: its answers in the order the task lists them, joined by \", \", after a space unless the prompt ends in one), each given the prompt and the answer tokens before it; continuous where `score` is 0 or 1, so a fading answer shows before it is lost; teacher_forced rows of every back-end; generate rows (RULER, passkey landmark) only when run with `--answer-logprob`, which teacher-forces the expected answer after the prompt in one more pass; null otherwise, for perplexity and before version 9"),
    Column("answer_rank", pa.int64(), True, "rank of the answer's first scored token among every token the model scores at its position, 1-based: 1 = the argmax, else 1 + the tokens scored strictly above it (a tie shares the better rank); null where `answer_logprob` is"),
    Column("nll", pa.float64(), True, "perplexity only: SUM of the token negative log-likelihoods of the sample, nats"),
    Column("n_scored", pa.int64(), True, "perplexity only: number of tokens whose NLL is in `nll`"),
    Column("position", pa.int64(), True, "perplexity only: the span's label: a sliding window's first new token, or a bucket's first prediction (k * bucket; without a BOS it scores document tokens from k * bucket + 1); null otherwise"),
    Column("seconds", pa.float64(), False, "wall time of the batch the sample ran in (--batch-size), shared equally among the rows that batch computed; with batches of one, the sample's own time"),
    Column("tokens_per_s", pa.float64(), False, "the throughput of the batch the sample ran in: its samples' n_tokens summed over its wall time"),
    Column("peak_mem_bytes", pa.int64(), True, "peak memory during the sample (GPU if on one, else process RSS); null when unknown"),
    Column("device", pa.string(), False, "torch device the sample ran on, e.g. cpu, cuda:0 (`auto` resolved); never splits a table"),
    Column("dtype", pa.string(), False, "compute dtype the sample ran in, e.g. float32, bfloat16 (`auto` resolved); part of the resume key and of the summary group"),
    Column("attention", pa.string(), False, "attention code path that ran (bamctl's engine: native, fused, blockwise, flex or dense, `auto` resolved; hf: transformers' sdpa or eager; vllm); never splits a table"),
    Column("skipped_blocks", pa.int64(), True, "key blocks the attention kernel left out for this sample (`--block-skip auto`: their softmax mass provably below 2^-40 of each row's, docs/engine.md), summed over layers, heads and query blocks; one unit is a (head, query block, key block) tile of the path that ran (`attention`), at that path's tile size: blockwise 512 queries × 1,024 keys, native 32, 64 or 256 queries (by the call's queries) × 512 keys, flex 128 × 128 (a key block is counted for a query block up to its last query); so counts of two paths are not comparable, their ratio `skipped_blocks / key_blocks` (the share of attention's tiles left out) is; for the sample's sequence in the batch it ran in: like `seconds`, it describes that batch's work (a sample padded to a longer one counts the padding's blocks, and a chunk's query blocks depend on its size), so another batch size or shard may count otherwise; 0 with `--block-skip off` or a model without a distance prior; null where the path keeps no count (dense, fused; hf:, vllm:, module back-ends) and in rows before version 8"),
    Column("key_blocks", pa.int64(), True, "the key blocks the kernel considered for this sample, in `skipped_blocks`' unit (the same whether it skipped or not), `skipped_blocks` among them: their ratio is the share of attention's work left out; null where `skipped_blocks` is"),
    Column("bamctl_version", pa.string(), False, "bamctl version that wrote the row"),
    Column("git_revision", pa.string(), True, "git commit of bamctl (suffix +dirty with local changes); null outside a checkout"),
    Column("torch_version", pa.string(), False, "torch version"),
)

COLUMN_NAMES: tuple[str, ...] = tuple(c.name for c in COLUMNS)

SCHEMA: pa.Schema = pa.schema(
    [pa.field(c.name, c.type, nullable=c.nullable) for c in COLUMNS],
    metadata={VERSION_KEY: str(SCHEMA_VERSION).encode()},
)

# The identity of a row: one slot of one request to one model on one back-end, in one dtype.
# Readers keep the newest row per key. A rerun reuses the stored row of a key only when its
# `request_digest` and `compute_version` match too (REUSE_COLUMNS): what was computed, by
# what code, not only a label for it.
KEY_COLUMNS: tuple[str, ...] = (
    "model_hash", "backend", "fingerprint", "dtype", "task", "protocol", "setting", "length", "depth", "seed", "sample",
    "position",
)
REUSE_COLUMNS: tuple[str, ...] = ("request_digest", "compute_version")

ResumeKey = tuple[str, str | None, str | None, str, str, str, str, int, float | None, int, int, int | None]


def row_key(row: Mapping[str, Any]) -> ResumeKey:
    """The resume key of a row (dict), normalised so keys from dicts and from files compare equal."""
    depth = row.get("depth")
    if depth is not None:
        depth = float(depth)
        if math.isnan(depth):  # pandas spells null as NaN; NaN != NaN would break set lookups
            depth = None
    return (
        str(row["model_hash"]),
        _optional_str(row.get("backend")),
        _optional_str(row.get("fingerprint")),
        str(row["dtype"]),
        str(row["task"]),
        str(row["protocol"]),
        str(row["setting"]),
        int(row["length"]),
        depth,
        int(row["seed"]),
        int(row["sample"]),
        _optional_int(row.get("position")),
    )


def _optional_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None  # null, NaN or pandas' NA: a row from before the column


def _optional_int(value: Any) -> int | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):  # pandas' NA
        return None


def schema_version(schema: pa.Schema) -> int | None:
    """The version stored in a file's metadata, or None for a file bamctl did not write."""
    raw = (schema.metadata or {}).get(VERSION_KEY)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


_NULLABLE = tuple(c.name for c in COLUMNS if c.nullable)


def rows_to_table(rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    """Typed table from row dicts. Nullable columns may be left out; `created_at` defaults to now.

    Unknown or missing required columns, naive timestamps and values of the wrong type raise
    ValueError naming the column: these are bugs in the caller, not user input.
    """
    required = {c.name for c in COLUMNS if not c.nullable} - {"created_at"}
    now = datetime.now(timezone.utc)
    filled = []
    for i, row in enumerate(rows):
        unknown = set(row) - set(COLUMN_NAMES)
        if unknown:
            raise ValueError(f"result row {i}: unknown columns {sorted(unknown)}")
        missing = required - {k for k, v in row.items() if v is not None}
        if missing:
            raise ValueError(f"result row {i}: missing required columns {sorted(missing)}")
        created = row.get("created_at") or now
        if not isinstance(created, datetime) or created.tzinfo is None:
            raise ValueError(f"result row {i}: created_at must be a timezone-aware datetime, got {created!r}")
        values = {name: row.get(name) for name in COLUMN_NAMES} | {"created_at": created}
        for name in _NULLABLE:  # NaN is how pandas spells "missing", in any column; store a real null
            if isinstance(values[name], float) and math.isnan(values[name]):
                values[name] = None
        filled.append(values)
    try:
        return pa.Table.from_pylist(filled, schema=SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise ValueError(f"result rows do not match the schema: {err}") from err


# -- older files ---------------------------------------------------------------------------


def upgrade(table: pa.Table, version: int) -> pa.Table:
    """Rows written under schema ``version`` in today's columns (what could be recovered).

    Version 1 had ``variant`` (the passkey protocol, its ``authors`` being today's
    ``exact``; else the task's own name) and a
    ``protocol`` holding the scoring kind, or the perplexity plan (``sliding``,
    ``sliding:stride=N``, ``buckets:N``); its ``depth`` was where a RULER needle landed.

    Before version 5, ``model_hash`` covered the weights alone, so two models differing only
    in their config (nope and rope of one seed) shared it: those rows lose their fingerprint,
    as rows from before fingerprints have none. Resume never matches them (today's rows are
    computed afresh) and summaries keep them apart, labelled ``none``.

    Before version 6 no row said which request and code computed it (``request_digest``,
    ``compute_version``, ``backend``, ``draw`` read as null): such rows are shown, never reused.

    Before version 7 no model was named by its Hub id, so every row's ``model_revision`` is null
    (a local folder or bamctl's own model) and its identity is unchanged: such a row is reused
    as any other, when its request digest and compute version match.

    Before version 8 no row counted the key blocks its kernel left out: ``skipped_blocks`` and
    ``key_blocks`` read as null; nothing else changes.

    Before version 9 no row kept its answer's log-probability or rank: ``answer_logprob`` and
    ``answer_rank`` read as null; nothing else changes.

    Before version 10 no served model's row kept the server's count of prompt tokens (a
    miscount stopped the run): ``served_token_gap`` reads as null; nothing else changes.
    """
    if version < 5 and "fingerprint" in table.column_names:
        table = table.set_column(table.column_names.index("fingerprint"), "fingerprint", pa.nulls(table.num_rows, pa.string()))
    for name in ("request_digest", "compute_version"):  # before version 6 nothing said what computed a row
        if version < 6 and name in table.column_names:
            table = table.set_column(table.column_names.index(name), name, pa.nulls(table.num_rows, pa.string()))
    if version >= 2:
        # version 2 lacked `fingerprint`, version 3 `rope_scaling`, version 6 `model_revision`, version 7
        # `skipped_blocks` and `key_blocks`, version 8 `answer_logprob` and `answer_rank`, version 9
        # `served_token_gap`: all read as null
        return table
    rows = table.to_pylist()
    for row in rows:
        old, variant = row.pop("protocol"), row.pop("variant")
        plan, _, detail = old.partition(":")
        if plan in ("sliding", "buckets"):
            row["scoring"], row["protocol"] = "nll", plan
            row["setting"] = f"stride={detail.removeprefix('stride=')}" if plan == "sliding" and detail else ""
            if plan == "buckets" and detail and detail != "1024":
                row["setting"] = f"bucket={detail}"
        else:
            row["scoring"], row["setting"] = old, ""
            # version 1's "authors" passkey was bamctl's exact-length GPT-2 form, today's "exact"
            row["protocol"] = {"authors": "exact"}.get(variant, variant) if variant != row["task"] else "ruler"
        row["needle_depth"] = row.get("depth") if row["protocol"] == "ruler" else None
    columns = [c for c in COLUMN_NAMES if rows and c in rows[0]] or [c for c in COLUMN_NAMES if c in table.column_names]
    fields = [pa.field(c.name, c.type, nullable=True) for c in COLUMNS if c.name in columns]
    return pa.Table.from_pylist([{c: row.get(c) for c in columns} for row in rows], schema=pa.schema(fields))
