"""Result directories written under schema version 1 stay readable, in today's columns."""

from __future__ import annotations

from datetime import datetime, timezone

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

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


ADDED_AFTER_5 = ["backend", "draw", "document_start", "dropped_tokens", "model_revision", "skipped_blocks", "key_blocks",
                 "answer_logprob", "answer_rank"]


def _older_file(tmp_path, version: int, drop: list[str]):
    """Today's fake row, written as a file of schema ``version`` without the columns ``drop``."""
    from results_fakes import fake_row

    from bamctl.results.schema import SCHEMA, rows_to_table

    row = fake_row()
    table = rows_to_table([row]).drop_columns(drop).replace_schema_metadata({**SCHEMA.metadata, VERSION_KEY: str(version).encode()})
    pq.write_table(table, tmp_path / "part-00000000000000000001-a.parquet")
    return row


@pytest.mark.parametrize("version", [3, 4, 5])
def test_rows_before_version_6_keep_no_request_or_code_and_before_5_no_fingerprint(tmp_path, version):
    """Before version 5 ``model_hash`` covered the weights alone: a fingerprint written then is
    dropped (nope and rope of one seed shared it). Before version 6 nothing said which request
    and code computed a row: whatever such a file holds under those names is dropped too (no
    writer of those versions wrote them), so the row is shown and never reused. Every other value
    is kept."""
    row = _older_file(tmp_path, version, ADDED_AFTER_5)
    table = ResultStore(tmp_path).read_table()
    assert table.num_rows == 1
    assert table.column("fingerprint").to_pylist() == [row["fingerprint"] if version >= 5 else None]
    assert table.column("request_digest").to_pylist() == [None] == table.column("compute_version").to_pylist()
    for kept in ("model", "model_hash", "length", "depth", "score", "expected", "predicted", "protocol", "setting"):
        assert table.column(kept).to_pylist() == [row[kept]], kept
    for added in ADDED_AFTER_5:
        assert table.column(added).null_count == 1, added
    (stored,) = ResultStore(tmp_path).done_requests().values()
    assert (stored.request_digest, stored.compute_version) == (None, None)  # never matches a request: computed again


def test_version_2_rows_are_read_as_written(tmp_path):
    """Version 2 already had today's protocol, setting and scoring: nothing of version 1's
    conversion applies (a version-2 row has no ``variant`` to convert from)."""
    row = _older_file(tmp_path, 2, ["fingerprint", "rope_scaling", *ADDED_AFTER_5, "request_digest", "compute_version"])
    table = ResultStore(tmp_path).read_table()
    got = table.to_pylist()[0]
    assert {k: got[k] for k in ("task", "protocol", "setting", "scoring", "depth", "needle_depth", "score")} == \
        {k: row[k] for k in ("task", "protocol", "setting", "scoring", "depth", "needle_depth", "score")}


@pytest.mark.parametrize("rows", [0, 1])
def test_a_version_1_file_of_one_row_or_none_reads(tmp_path, rows):
    """A file of one row (or of none: a run stopped before its first row) is read like any other;
    a passkey row's ``depth`` was asked for, so it gets no ``needle_depth``."""
    schema = pa.schema([pa.field(n, t) for n, t in V1_COLUMNS], metadata={VERSION_KEY: b"1"})
    written = [_v1_row("passkey", "authors", "teacher_forced", depth=0.25)][:rows]
    pq.write_table(pa.Table.from_pylist(written, schema=schema), tmp_path / "part-00000000000000000001-a.parquet")
    table = ResultStore(tmp_path).read_table()
    assert table.num_rows == rows
    if rows:
        got = table.to_pylist()[0]
        assert (got["protocol"], got["depth"], got["needle_depth"], got["score"]) == ("exact", 0.25, None, 0.5)
