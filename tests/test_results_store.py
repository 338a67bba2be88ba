"""ResultStore: typed round trip, atomic crash-safe appends, concurrent writers, bad files, dedupe."""

from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from bamctl.errors import BamctlError
from bamctl.results.schema import COLUMNS, KEY_COLUMNS, SCHEMA, SCHEMA_VERSION, row_key, rows_to_table
from bamctl.results.store import ResultStore

from results_fakes import BASE_TIME, fake_row, passkey_grid, perplexity_rows

TESTS = Path(__file__).parent
REPO = TESTS.parent


def quiet_store(directory: Path) -> tuple[ResultStore, list[str]]:
    warnings: list[str] = []
    return ResultStore(directory, warn=warnings.append), warnings


def test_round_trip_keeps_every_value_and_type(tmp_path):
    rows = passkey_grid(samples=2) + perplexity_rows()
    store, warnings = quiet_store(tmp_path)
    store.append(rows[:10])
    store.append(rows[10:])

    table = store.read_table()
    assert table.schema.equals(SCHEMA, check_metadata=False)
    expected = rows_to_table(rows).sort_by([(c, "ascending") for c in
                                            ("task", "protocol", "setting", "model", "model_hash", "length", "depth", "seed", "sample")])
    assert table.equals(expected)
    by_key = {row_key(r): r for r in rows}
    for got in table.to_pylist():
        assert got == by_key[row_key(got)]

    frame = store.read()
    assert list(frame.columns) == [c.name for c in COLUMNS]
    assert str(frame["created_at"].dtype) == "datetime64[us, UTC]"
    assert frame["length"].dtype == "int64" and frame["ssmax"].dtype == bool
    assert frame["n_scored"].dtype == "Int64" and frame["correct"].dtype == "boolean"
    assert frame["depth"].dtype == "float64" and frame["score"].dtype == "float64"
    ppl = frame[frame["task"] == "ppl"]
    assert ppl["correct"].isna().all() and ppl["depth"].isna().all() and (ppl["n_scored"] > 0).all()
    assert warnings == []


def test_schema_version_in_every_part_file(tmp_path):
    path = ResultStore(tmp_path).append([fake_row()])
    assert re.fullmatch(r"part-\d{20}-[0-9a-f]{32}\.parquet", path.name)
    metadata = pq.read_schema(path).metadata
    assert metadata[b"bamctl.schema_version"] == str(SCHEMA_VERSION).encode()


def test_schema_doc_lists_every_column_with_its_type():
    doc = (REPO / "docs" / "SCHEMA.md").read_text()
    for column in COLUMNS:
        assert re.search(rf"^\| `{column.name}` \| `{re.escape(str(column.type))}` \| {'yes' if column.nullable else 'no'} \|", doc, re.M), column.name
    assert "bamctl.schema_version" in doc and "newest row wins" in doc.lower()


def test_schema_doc_says_what_score_holds_for_every_task():
    from bamctl.tasks import task_names
    from bamctl.tasks.score_docs import score_table

    doc = (REPO / "docs" / "SCHEMA.md").read_text()
    table = score_table()
    assert table in doc, ("docs/SCHEMA.md's table of what `score` holds is out of date; print the new one with "
                          "python -c 'from bamctl.tasks.score_docs import score_table; print(score_table())'")
    for task in task_names():
        assert task in table
    assert "nats" in table and "[0, 1]" in table


def test_bad_rows_are_rejected_before_anything_is_written(tmp_path):
    store = ResultStore(tmp_path)
    with pytest.raises(ValueError, match="unknown columns"):
        store.append([fake_row() | {"acc": 1.0}])
    with pytest.raises(ValueError, match="missing required"):
        store.append([{k: v for k, v in fake_row().items() if k != "model_hash"}])
    with pytest.raises(ValueError, match="timezone"):
        store.append([fake_row() | {"created_at": BASE_TIME.replace(tzinfo=None)}])
    with pytest.raises(ValueError, match="schema"):
        store.append([fake_row() | {"length": "long"}])
    assert store.part_files() == []


def test_pandas_nan_depth_is_stored_as_null_and_keys_match(tmp_path):
    store = ResultStore(tmp_path)
    store.append([fake_row(depth=float("nan"))])
    assert store.read_table().column("depth").null_count == 1
    assert store.done_keys() == {row_key(fake_row(depth=None))}


def test_readable_as_one_table_by_pyarrow_and_pandas(tmp_path):
    rows = passkey_grid(samples=1)
    store = ResultStore(tmp_path)
    for i in range(0, len(rows), 7):
        store.append(rows[i:i + 7])
    assert ds.dataset(tmp_path, format="parquet").count_rows() == len(rows)
    assert ds.dataset(str(tmp_path)).to_table().num_rows == len(rows)
    assert len(pd.read_parquet(tmp_path)) == len(rows)
    (tmp_path / "README.md").write_text("# results\n")  # as in the default results/ folder
    parts = sorted(glob.glob(str(tmp_path / "part-*.parquet")))
    assert len(pd.read_parquet(parts)) == len(rows)
    assert ds.dataset(parts, format="parquet").count_rows() == len(rows)


def test_newest_row_wins_for_a_duplicated_key(tmp_path):
    store, _ = quiet_store(tmp_path)
    old = fake_row(score=0.0, created_at=BASE_TIME, run_id="old")
    new = fake_row(score=1.0, created_at=BASE_TIME + timedelta(seconds=5), run_id="new")
    other = fake_row(sample=1, run_id="old")
    store.append([new])  # written first, but newer: order of files must not matter
    store.append([old, other])
    frame = store.read()
    assert len(frame) == 2
    assert frame.set_index("sample").loc[0, "run_id"] == "new"
    assert len(store.read(dedupe=False)) == 3
    assert len(store.done_keys()) == 2


def test_compact_merges_parts_keeping_the_newest_rows(tmp_path):
    store, warnings = quiet_store(tmp_path)
    store.append([fake_row(score=0.0, run_id="old")])
    store.append([fake_row(score=1.0, run_id="new", created_at=BASE_TIME + timedelta(seconds=1))])
    store.append([fake_row(sample=1)])
    before = store.read_table()
    merged = store.compact()
    assert store.part_files() == [merged]
    assert store.read_table().equals(before)
    assert warnings == []


def test_merge_replaces_a_runs_parts_by_one_and_leaves_other_files_alone(tmp_path):
    store, warnings = quiet_store(tmp_path)
    other = store.append([fake_row(sample=9, run_id="another process")])
    mine = [store.append([fake_row(sample=i)]) for i in range(4)]
    before = store.read_table()
    merged = store.merge(mine)
    assert sorted(store.part_files()) == sorted([other, merged])
    assert store.read_table().equals(before)
    assert store.read_table(dedupe=False).num_rows == 5  # nothing duplicated
    assert warnings == []


def test_a_read_racing_a_merge_lists_again_and_misses_nothing(tmp_path, monkeypatch):
    store, warnings = quiet_store(tmp_path)
    mine = [store.append([fake_row(sample=i)]) for i in range(3)]
    expected = store.read_table()
    reader = ResultStore(tmp_path)
    real_read = ResultStore._read_part
    raced = []

    def read_after_a_merge(self, path, columns):
        if not raced:  # another process's run ends between this reader's listing and its reads
            raced.append(None)
            raced[0] = ResultStore(tmp_path).merge(mine)
        return real_read(self, path, columns)

    monkeypatch.setattr(ResultStore, "_read_part", read_after_a_merge)
    assert reader.read_table().equals(expected)
    assert reader.part_files() == raced


def test_compact_leaves_no_part_or_one_part_as_it_is_and_merges_two(tmp_path):
    store, warnings = quiet_store(tmp_path / "results")
    assert store.compact() is None  # nothing to merge, not even a directory
    only = store.append([fake_row(sample=0)])
    written = only.stat().st_mtime_ns
    assert store.compact() == only and only.stat().st_mtime_ns == written  # not rewritten
    second = store.append([fake_row(sample=1)])
    merged = store.compact()
    assert merged not in (only, second) and store.part_files() == [merged]
    assert sorted(store.read()["sample"]) == [0, 1]
    assert warnings == []


def test_compact_removes_temp_files_of_appends_that_died_over_an_hour_ago(tmp_path):
    """A crash mid-append leaves a hidden temp file; compaction removes those older than an hour
    and leaves younger ones, which may be an append still writing."""
    store, _ = quiet_store(tmp_path)
    store.append([fake_row(sample=0)])
    dead = tmp_path / ".part-dead.parquet.tmp"
    writing = tmp_path / ".part-writing.parquet.tmp"
    for temp in (dead, writing):
        temp.write_bytes(b"PAR1")
    two_hours_ago = dead.stat().st_mtime - 7200
    os.utime(dead, (two_hours_ago, two_hours_ago))
    store.compact()
    assert not dead.exists() and writing.exists()


@pytest.mark.parametrize("operation", ["compact", "merge"])
def test_a_part_another_process_removed_meanwhile_is_no_error(tmp_path, monkeypatch, operation):
    """compact and merge write the merged file, then delete the parts they read; a part another
    process's compaction deleted in between is already gone, not an error."""
    store, _ = quiet_store(tmp_path)
    parts = [store.append([fake_row(sample=i)]) for i in range(3)]
    real_write = ResultStore._write

    def write_then_lose_one(self, table):
        path = real_write(self, table)
        parts[1].unlink()  # another process's compaction got there first
        return path

    monkeypatch.setattr(ResultStore, "_write", write_then_lose_one)
    merged = store.compact() if operation == "compact" else store.merge(parts)
    assert store.part_files() == [merged] and sorted(store.read()["sample"]) == [0, 1, 2]


def test_ensure_writable_makes_the_whole_path_and_leaves_nothing_in_it(tmp_path):
    store = ResultStore(tmp_path / "a" / "b" / "results")
    assert repr(store) == f"ResultStore({str(tmp_path / 'a' / 'b' / 'results')!r})"
    store.ensure_writable()
    assert store.directory.is_dir() and list(store.directory.iterdir()) == []


def test_a_write_error_without_a_reason_names_its_kind(tmp_path, monkeypatch):
    """An OSError that carries no strerror (raised bare by a filesystem layer) still gives a reason."""
    from pathlib import Path

    def refuse(self, *args, **kwargs):
        raise PermissionError()

    monkeypatch.setattr(Path, "mkdir", refuse)
    store = ResultStore(tmp_path / "results")
    with pytest.raises(BamctlError) as err:
        store.ensure_writable()
    assert str(err.value) == (f"cannot write results to {tmp_path / 'results'}: PermissionError "
                              "(choose another directory with --dir)")


def test_merge_of_two_parts_is_one_part(tmp_path):
    store, _ = quiet_store(tmp_path)
    mine = [store.append([fake_row(sample=i)]) for i in range(2)]
    merged = store.merge(mine)
    assert store.part_files() == [merged] and sorted(store.read()["sample"]) == [0, 1]
    assert store.merge([merged]) == merged and store.merge([]) is None


def test_supersede_removes_elsewhere_only_the_older_rows_of_the_keys_it_wrote(tmp_path):
    """After a rerun writes newer rows, every other file loses the older rows of those keys, wherever
    it sits in the listing (before or after the new file, after a foreign file or one with nothing
    to remove); rows of other keys stay, and so does a row of the same key written at the same instant
    (another process's, not an older one). The count is every row removed."""
    store, warnings = quiet_store(tmp_path)
    t = lambda seconds: BASE_TIME + timedelta(seconds=seconds)  # noqa: E731
    untouched = store.append([fake_row(sample=5)])
    first_run = store.append([fake_row(sample=i) for i in (0, 1, 2)])
    other_run = store.append([fake_row(sample=3, run_id="other"), fake_row(sample=1, run_id="other", created_at=t(1))])
    written = store.append([fake_row(sample=i, run_id="rerun", created_at=t(10)) for i in (0, 1, 4)])
    started_earlier = store.append([fake_row(sample=0, run_id="slow", created_at=t(5)), fake_row(sample=6, run_id="slow")])
    same_instant = store.append([fake_row(sample=4, run_id="twin", created_at=t(10))])
    pq.write_table(pa.table({"x": [1]}), tmp_path / "foreign.parquet")  # listed first, skipped
    assert store.supersede(written) == 4  # samples 0 and 1 of the first run, 1 of the other, 0 of the slow one
    files = set(store.part_files())
    assert {untouched, written, same_instant, tmp_path / "foreign.parquet"} <= files
    assert not files & {first_run, other_run, started_earlier}  # each replaced by what it kept
    rows = store.read(dedupe=False)
    assert sorted(rows["sample"]) == [0, 1, 2, 3, 4, 4, 5, 6]
    assert set(rows[rows["sample"].isin([0, 1])]["run_id"]) == {"rerun"}
    assert store.supersede(tmp_path / "part-gone.parquet") == 0
    assert len(warnings) == 1 and "foreign.parquet" in warnings[0]


def test_supersede_takes_a_file_another_process_removed_meanwhile(tmp_path, monkeypatch):
    store, _ = quiet_store(tmp_path)
    old = store.append([fake_row(sample=0), fake_row(sample=1)])
    written = store.append([fake_row(sample=0, created_at=BASE_TIME + timedelta(seconds=1))])
    real_read = ResultStore._read_part

    def read_then_lose(self, path, columns):
        table = real_read(self, path, columns)
        if columns is None and path == old:
            path.unlink()  # another process's compaction took it after this read
        return table

    monkeypatch.setattr(ResultStore, "_read_part", read_then_lose)
    assert store.supersede(written) == 1
    assert sorted(store.read()["sample"]) == [0, 1]


def test_supersede_goes_on_past_a_file_removed_between_its_two_reads(tmp_path, monkeypatch):
    store, _ = quiet_store(tmp_path)
    lost = store.append([fake_row(sample=0)])
    kept = store.append([fake_row(sample=1)])
    written = store.append([fake_row(sample=s, created_at=BASE_TIME + timedelta(seconds=1)) for s in (0, 1)])
    assert store.part_files().index(lost) < store.part_files().index(kept)
    real_read = ResultStore._read_part

    def lose_before_the_whole_read(self, path, columns):
        if columns is None and path == lost:
            path.unlink()  # another process's compaction took it after its keys were read
            raise FileNotFoundError(path)
        return real_read(self, path, columns)

    monkeypatch.setattr(ResultStore, "_read_part", lose_before_the_whole_read)
    assert store.supersede(written) == 1  # the next file's older row still goes
    assert store.part_files() == [written]


def test_the_first_append_makes_the_whole_path_and_read_selects_by_protocol(tmp_path):
    store, _ = quiet_store(tmp_path / "a" / "b" / "results")
    store.append([fake_row(sample=0, protocol="authors"), fake_row(sample=1, protocol="ruler")])
    assert list(store.read(protocol="ruler")["sample"]) == [1]
    assert list(store.read(protocol="authors")["sample"]) == [0]
    assert sorted(store.read()["sample"]) == [0, 1]


def test_of_rows_written_at_the_same_instant_the_later_in_the_file_is_kept(tmp_path):
    """Ties in created_at (one clock tick, many rows) go to the row written later: the sort that puts
    the newest last must keep the file's order among equal times."""
    import random

    store, _ = quiet_store(tmp_path)
    draw = random.Random(7)
    ticks = [draw.randrange(5) for _ in range(200)]  # five instants shared by 200 keys
    rows = [fake_row(sample=i, run_id=run, created_at=BASE_TIME + timedelta(microseconds=ticks[i]))
            for run in ("earlier", "later") for i in range(200)]
    store.append(rows)
    kept = store.read()
    assert len(kept) == 200 and set(kept["run_id"]) == {"later"}


def test_unwritable_directory_is_one_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    store = ResultStore(blocker / "results")
    with pytest.raises(BamctlError, match=r"cannot write results to .*results: Not a directory \(choose another") as err:
        store.append([fake_row()])
    assert "\n" not in str(err.value)
    with pytest.raises(BamctlError, match="cannot write results"):
        store.ensure_writable()
    assert ResultStore(blocker / "results").read().empty  # reading a missing directory is just empty


def test_foreign_and_truncated_files_are_skipped_with_one_warning(tmp_path):
    rows = passkey_grid(samples=1)
    store, warnings = quiet_store(tmp_path)
    good = store.append(rows)
    (tmp_path / "truncated.parquet").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    (tmp_path / "notes.parquet").write_text("not parquet at all")
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "foreign.parquet")  # valid Parquet, not ours
    (tmp_path / "README.md").write_text("ignored silently")
    (tmp_path / ".part-x.parquet.tmp").write_bytes(b"PAR1")  # an append that died mid-write

    assert len(store.read()) == len(rows)
    assert len(store.done_keys()) == len(rows)
    assert len(warnings) == 3
    assert sorted(re.search(r"skipping \S*?([a-z]+\.parquet)", w).group(1) for w in warnings) == [
        "foreign.parquet", "notes.parquet", "truncated.parquet"]
    assert any("not a bamctl results file" in w for w in warnings)


def test_each_kind_of_file_not_ours_is_skipped_with_its_own_reason(tmp_path, monkeypatch):
    from bamctl.results.schema import VERSION_KEY

    store, warnings = quiet_store(tmp_path)
    good = store.append([fake_row(sample=0)])
    table = pq.read_table(good)
    newer = table.replace_schema_metadata({**table.schema.metadata, VERSION_KEY: str(SCHEMA_VERSION + 1).encode()})
    pq.write_table(newer, tmp_path / "newer.parquet")
    pq.write_table(table.drop_columns(["model"]), tmp_path / "modelless.parquet")
    seeds = pa.array(["not a seed"] * table.num_rows)
    pq.write_table(table.set_column(table.schema.get_field_index("seed"), "seed", seeds), tmp_path / "mistyped.parquet")
    pq.write_table(pa.table({"x": [1]}), tmp_path / "foreign.parquet")
    (tmp_path / "text.parquet").write_text("not parquet at all")
    assert list(store.read()["sample"]) == [0]
    reasons = {re.search(r"skipping \S*?([a-z]+)\.parquet", w).group(1): w.split(": ", 1)[1] for w in warnings}
    # pyarrow's own first line says what is wrong with a file that is not Parquet
    assert re.fullmatch(r"unreadable Parquet \(truncated or not Parquet\): .*magic bytes.*", reasons.pop("text"))
    assert reasons == {
        "newer": f"written by a newer bamctl (schema {SCHEMA_VERSION + 1} > {SCHEMA_VERSION}); upgrade bamctl",
        "modelless": "missing required column 'model'",
        "mistyped": "column 'seed' is not int64",
        "foreign": "not a bamctl results file (no bamctl.schema_version in its metadata)",
    }

    def silent(path):  # an error without a message is named by its kind
        raise pa.ArrowInvalid("")

    monkeypatch.setattr(pq, "ParquetFile", silent)
    quiet, said = quiet_store(tmp_path)
    assert quiet.read().empty
    assert "skipping " + str(good) + ": unreadable Parquet (truncated or not Parquet): ArrowInvalid" in said


def test_a_part_that_keeps_vanishing_is_listed_again_four_times_then_left_out(tmp_path, monkeypatch):
    store, _ = quiet_store(tmp_path)
    ghost = store.append([fake_row(sample=1)])
    store.append([fake_row(sample=0)])  # listed after the ghost: still read
    real_read = ResultStore._read_part
    reads = []

    def always_gone(self, path, columns):
        if path == ghost:
            reads.append(path)
            raise FileNotFoundError(path)  # merged away by another process, each time it is listed
        return real_read(self, path, columns)

    monkeypatch.setattr(ResultStore, "_read_part", always_gone)
    assert list(store.read()["sample"]) == [0]
    assert len(reads) == 5  # four strict listings, then one that reads what is there


def test_hidden_parquet_files_are_not_parts(tmp_path):
    import shutil

    store, warnings = quiet_store(tmp_path)
    good = store.append([fake_row(sample=0)])
    for hidden in (".copy.parquet", "_copy.parquet"):  # an editor's or a tool's, even if ours
        shutil.copy(good, tmp_path / hidden)
    assert store.part_files() == [good] and len(store.read()) == 1 and warnings == []


def test_done_requests_tell_a_row_a_server_read_at_another_length(tmp_path):
    store, _ = quiet_store(tmp_path)
    rows = [{**fake_row(sample=s), "served_token_gap": gap} for s, gap in ((0, None), (1, 0), (2, -3))]
    store.append(rows)
    done = store.done_requests()
    assert [done[row_key(row)].unread for row in rows] == [False, False, True]
    assert done[row_key(rows[2])].request_digest == rows[2]["request_digest"]


def test_warnings_go_to_stderr(tmp_path, capsys):
    (tmp_path / "broken.parquet").write_text("x")
    assert ResultStore(tmp_path).read().empty
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("warning: skipping") == 1


WRITER = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, sys.argv[3])
    from results_fakes import passkey_grid
    from bamctl.results.schema import row_key
    from bamctl.results.store import ResultStore

    store = ResultStore(sys.argv[1])
    done = store.done_keys()
    if len(sys.argv) > 4:  # start line: wait until every writer is imported and ready
        print("ready", flush=True)
        while not os.path.exists(sys.argv[4]):
            time.sleep(0.01)
    for row in passkey_grid(seed=int(sys.argv[2])):
        if row_key(row) in done:
            continue
        store.append([row])  # one part per finished sample, as the runner does
        print("appended", flush=True)
    """
)


def writer(tmp_path: Path, directory: Path, seed: int, start: Path | None = None) -> subprocess.Popen:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    return subprocess.Popen(
        [sys.executable, str(script), str(directory), str(seed), str(TESTS)] + ([str(start)] if start else []),
        stdout=subprocess.PIPE, text=True, cwd=REPO,
    )


def test_sigkill_mid_run_loses_nothing_and_resume_equals_an_uninterrupted_run(tmp_path):
    interrupted = tmp_path / "interrupted"
    proc = writer(tmp_path, interrupted, seed=0)
    for _ in range(12):
        assert proc.stdout.readline() == "appended\n"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL

    store, warnings = quiet_store(interrupted)
    expected = {row_key(r): r for r in passkey_grid(seed=0)}
    partial = store.read_table().to_pylist()
    assert 12 <= len(partial) < len(expected)
    assert warnings == []  # every visible file is complete
    for row in partial:  # and every row in it is whole
        assert row == expected[row_key(row)]

    resume = writer(tmp_path, interrupted, seed=0)
    resume.communicate(timeout=120)
    assert resume.returncode == 0

    uninterrupted = ResultStore(tmp_path / "uninterrupted")
    uninterrupted.append(list(expected.values()))
    assert store.read_table(dedupe=False).num_rows == len(expected)  # nothing written twice
    assert store.read_table().equals(uninterrupted.read_table())
    assert warnings == []


def test_two_processes_appending_at_once(tmp_path):
    shared, start = tmp_path / "shared", tmp_path / "start"
    procs = [writer(tmp_path, shared, seed, start) for seed in (1, 2)]
    for proc in procs:
        assert proc.stdout.readline() == "ready\n"
    start.touch()  # both write from here on, interleaved
    for proc in procs:
        proc.communicate(timeout=120)
        assert proc.returncode == 0
    store, warnings = quiet_store(shared)
    table = store.read_table(dedupe=False)
    expected = passkey_grid(seed=1) + passkey_grid(seed=2)
    assert table.num_rows == len(expected)
    assert {row_key(r) for r in table.to_pylist()} == {row_key(r) for r in expected}
    assert len(store.part_files()) == len(expected)
    assert warnings == []
    assert set(KEY_COLUMNS) <= set(table.column_names)


def test_read_filters(tmp_path):
    store, _ = quiet_store(tmp_path)
    store.append(passkey_grid(samples=1) + perplexity_rows())
    assert set(store.read(task="ppl")["task"]) == {"ppl"}
    assert set(store.read(model="b2b2b2")["model"]) == {"tiny-bam"}  # hash prefix
    assert store.read(model="b2").empty  # too short to be a hash prefix
    assert set(store.read(where="length >= 2048 and depth < 0.5")["length"]) == {2048, 4096}
    assert store.read(task="nope").empty
    with pytest.raises(BamctlError, match="did you mean ppl"):
        store.read(task="ppx", strict=True)
    with pytest.raises(BamctlError, match="bad --where"):
        store.read(where="length >")


@pytest.mark.parametrize("field, other", [("model_hash", "h-other"), ("backend", "hf"), ("fingerprint", "fp-other"),
                                          ("dtype", "bfloat16"), ("task", "niah_single_1"), ("protocol", "exact"),
                                          ("setting", "stride=64"), ("length", 2048), ("depth", 0.25), ("seed", 1),
                                          ("sample", 1), ("position", 512)])
def test_every_field_of_the_resume_key_tells_two_rows_apart(field, other):
    """A row differing from another in any one field of its key is another sample: reusing one for
    the other would put a number where it was never measured."""
    row = fake_row()
    assert row_key({**row, field: other}) != row_key(row)


def test_keys_of_rows_read_back_equal_the_keys_of_the_rows_written(tmp_path):
    """Nulls spelt as pandas spells them (NaN, NA) and numpy integers key as None and int."""
    rows = [fake_row(sample=i, depth=None if i else 0.5) | {"position": None if i else 7} for i in range(3)]
    store = ResultStore(tmp_path)
    store.append(rows)
    frame = store.read()
    assert {row_key(r) for r in frame.to_dict("records")} == {row_key(r) for r in rows} == store.done_keys()
    nan_key = row_key({**rows[1], "position": float("nan"), "backend": float("nan")})
    assert nan_key[-1] is None and nan_key[1] is None
    assert row_key({**rows[1], "position": pd.NA, "fingerprint": pd.NA})[2] is None
    assert row_key({**rows[0], "position": 7.0})[-1] == 7 and isinstance(row_key({**rows[0], "position": 7.0})[-1], int)


def test_a_row_without_its_time_is_stamped_now_in_utc():
    from datetime import datetime, timezone

    before = datetime.now(timezone.utc)
    table = rows_to_table([fake_row() | {"created_at": None}])
    stamped = table.column("created_at").to_pylist()[0]
    assert before <= stamped <= datetime.now(timezone.utc)
    given = rows_to_table([fake_row()]).column("created_at").to_pylist()[0]
    assert given == BASE_TIME
