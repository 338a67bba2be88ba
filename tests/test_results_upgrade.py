"""Result directories written under schema version 1 stay readable, in today's columns."""

from __future__ import annotations

from datetime import datetime, timezone

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from bamctl.results.schema import VERSION_KEY
from bamctl.results.store import ResultStore

V1_COLUMNS = [
    ("run_id", pa.string()), ("created_at", pa.timestamp("us", tz="UTC")), ("task", pa.string()), ("variant", pa.string()),
    ("protocol", pa.string()), ("model", pa.string()), ("model_hash", pa.string()), ("pe", pa.string()), ("ssmax", pa.bool_()),
    ("train_length", pa.int64()), ("length", pa.int64()), ("n_tokens", pa.int64()), ("depth", pa.float64()),
    ("sample", pa.int64()), ("seed", pa.int64()), ("expected", pa.string()), ("predicted", pa.string()), ("correct", pa.bool_()),
    ("score", pa.float64()), ("nll", pa.float64()), ("n_scored", pa.int64()), ("position", pa.int64()),
    ("seconds", pa.float64()), ("tokens_per_s", pa.float64()), ("peak_mem_bytes", pa.int64()), ("device", pa.string()),
    ("dtype", pa.string()), ("attention", pa.string()), ("bamctl_version", pa.string()), ("git_revision", pa.string()),
    ("torch_version", pa.string()),
]


def _v1_row(task, variant, protocol, depth=None, position=None, nll=None, n_scored=None):
    return {
        "run_id": "r", "created_at": datetime(2025, 1, 1, tzinfo=timezone.utc), "task": task, "variant": variant,
        "protocol": protocol, "model": "m", "model_hash": "h" * 16, "pe": "bam", "ssmax": False, "train_length": 128,
        "length": 512, "n_tokens": 500, "depth": depth, "sample": 0, "seed": 0, "expected": None, "predicted": None,
        "correct": None, "score": 0.5, "nll": nll, "n_scored": n_scored, "position": position, "seconds": 1.0,
        "tokens_per_s": 500.0, "peak_mem_bytes": None, "device": "cpu", "dtype": "float32", "attention": "native",
        "bamctl_version": "0.1.0", "git_revision": None, "torch_version": "2.13.0",
    }


def test_version_1_rows_read_into_version_2_columns(tmp_path):
    rows = [
        _v1_row("passkey", "authors", "teacher_forced", depth=0.25),
        _v1_row("passkey", "landmark", "generate", depth=0.5),
        _v1_row("niah_single_2", "niah_single_2", "generate", depth=0.4375),
        _v1_row("ppl", "ppl", "sliding", position=1, nll=10.0, n_scored=20),
        _v1_row("ppl", "ppl", "sliding:stride=64", position=65, nll=10.0, n_scored=20),
        _v1_row("ppl", "ppl", "buckets:512", position=0, nll=10.0, n_scored=20),
        _v1_row("ppl", "ppl", "buckets:1024", position=1024, nll=10.0, n_scored=20),
    ]
    schema = pa.schema([pa.field(n, t) for n, t in V1_COLUMNS], metadata={VERSION_KEY: b"1"})
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp_path / "part-00000000000000000001-a.parquet")
    frame = ResultStore(tmp_path).read()
    got = {(r.task, r.protocol, r.setting, r.scoring, None if pd.isna(r.position) else r.position) for r in frame.itertuples()}
    assert got == {
        ("passkey", "exact", "", "teacher_forced", None),  # version 1's "authors" was the exact-length form
        ("passkey", "landmark", "", "generate", None),
        ("niah_single_2", "ruler", "", "generate", None),
        ("ppl", "sliding", "", "nll", 1),
        ("ppl", "sliding", "stride=64", "nll", 65),
        ("ppl", "buckets", "bucket=512", "nll", 0),
        ("ppl", "buckets", "", "nll", 1024),
    }
    ruler = frame[frame["task"] == "niah_single_2"].iloc[0]
    assert ruler["needle_depth"] == 0.4375
    assert frame[frame["protocol"] == "exact"].iloc[0]["depth"] == 0.25
    assert len(ResultStore(tmp_path).done_keys()) == 7


def test_version_6_rows_read_with_a_null_model_revision_and_keep_their_keys(tmp_path):
    from results_fakes import fake_row

    from bamctl.results.schema import SCHEMA, row_key, rows_to_table

    row = fake_row()
    v6 = rows_to_table([row]).drop_columns(["model_revision"])
    v6 = v6.replace_schema_metadata({**SCHEMA.metadata, VERSION_KEY: b"6"})
    pq.write_table(v6, tmp_path / "part-00000000000000000001-a.parquet")
    store = ResultStore(tmp_path)
    table = store.read_table()
    assert table.column("model_revision").null_count == 1 == table.num_rows
    # unlike the versions before 6, its request digest and compute version stay: it can be reused
    (key, stored), = store.done_requests().items()
    assert key == row_key(row) and (stored.request_digest, stored.compute_version) == ("rq-passkey-1024-0.5-0-0", "cv-1")


def test_version_8_rows_read_with_null_answer_scores_and_keep_their_keys(tmp_path):
    from results_fakes import fake_row

    from bamctl.results.schema import SCHEMA, row_key, rows_to_table

    row = fake_row()
    v8 = rows_to_table([row]).drop_columns(["answer_logprob", "answer_rank"])
    v8 = v8.replace_schema_metadata({**SCHEMA.metadata, VERSION_KEY: b"8"})
    pq.write_table(v8, tmp_path / "part-00000000000000000001-a.parquet")
    store = ResultStore(tmp_path)
    table = store.read_table()
    for name in ("answer_logprob", "answer_rank"):
        assert table.column(name).null_count == 1 == table.num_rows
    assert table.column("score").to_pylist() == [row["score"]]
    (key, stored), = store.done_requests().items()  # still reused when its request and code match
    assert key == row_key(row) and (stored.request_digest, stored.compute_version) == ("rq-passkey-1024-0.5-0-0", "cv-1")
