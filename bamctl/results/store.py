"""A results directory: crash-safe appends of Parquet part files, resume keys, one-table reads.

Layout: every `append` writes one file `part-<time_ns>-<uuid4>.parquet`. It is first written
to a hidden temp name in the same directory (`.part-....tmp`), fsynced, then renamed with
`os.replace`, which is atomic on POSIX: a reader sees a complete file or none, so a kill -9 at
any moment loses nothing appended before and never leaves a half file visible. Names are
unique, so any number of processes may append to one directory at once without locks.
An evaluation appends one row per part (a kill loses at most the row in flight) and `merge`s
its own parts into one when it ends, so a directory keeps about one file per run.
Hidden (`.`/`_`) files are ignored by bamctl and by pyarrow/polars/duckdb globbing alike.

Duplicates: the same resume key (`schema.KEY_COLUMNS`) can be written twice, by two runs
racing on one directory, by `--force`, or by a rerun that found the stored row computed from
another request or by other code. A run that replaced stored rows removes them when it ends
(`supersede`: each file holding one is replaced by a file without it), so a plain Parquet
reader sees each sample once; files are never rewritten in place, and until then (or after a
crash) bamctl's readers keep the row with the newest `created_at` per key (ties: the later
part file, by name) and drop the rest.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from bamctl.errors import BamctlError
from bamctl.results.schema import (
    COLUMNS,
    KEY_COLUMNS,
    REUSE_COLUMNS,
    SCHEMA,
    SCHEMA_VERSION,
    ResumeKey,
    row_key,
    rows_to_table,
    schema_version,
    upgrade,
)

PART_PREFIX = "part-"
PART_SUFFIX = ".parquet"
STALE_TEMP_SECONDS = 3600  # no append holds its temp file this long; older ones are crash leftovers

# Deterministic row order for reads: same rows in, same table out.
SORT_COLUMNS: tuple[str, ...] = ("task", "protocol", "setting", "model", "model_hash", "length", "depth", "seed", "sample", "position")

Warn = Callable[[str], None]


@dataclass(frozen=True)
class StoredRequest:
    """What the newest stored row of a resume key was computed from (None: not recorded, as in
    rows written before schema version 6, which are therefore never reused)."""

    request_digest: str | None
    compute_version: str | None
    unread: bool = False  # a server read its prompt at another length than sent: no score, asked again


def _warn_stderr(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


class ResultStore:
    """The rows of one results directory. Reading never creates the directory; appending does."""

    def __init__(self, directory: str | os.PathLike[str], *, warn: Warn | None = None) -> None:
        self.directory = Path(directory)
        self._warn = warn or _warn_stderr
        self._warned: set[Path] = set()  # each bad file is reported once per store, not per read

    def __repr__(self) -> str:
        return f"ResultStore({str(self.directory)!r})"

    # ---- writing -------------------------------------------------------------------------

    def ensure_writable(self) -> None:
        """Create the directory and prove a file can be written there; BamctlError if not.

        Call it before a long evaluation so a bad `--dir` fails in the first second.
        """
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            probe = self.directory / f".probe-{uuid.uuid4().hex}.tmp"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as err:
            raise self._write_error(err) from err

    def append(self, rows: Iterable[Mapping[str, Any]]) -> Path | None:
        """Write rows as one new part file, atomically and durably; returns its path (None if no rows).

        Row dicts follow `schema.COLUMNS`; nullable columns may be left out. A row that does not
        fit the schema raises ValueError (a caller bug); an unwritable directory raises BamctlError.
        """
        return self._write(rows_to_table(rows))

    def _write(self, table: pa.Table) -> Path | None:
        if table.num_rows == 0:
            return None
        name = f"{PART_PREFIX}{time.time_ns():020d}-{uuid.uuid4().hex}{PART_SUFFIX}"
        final = self.directory / name
        temp = self.directory / f".{name}.tmp"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(temp, "wb") as sink:
                pq.write_table(table, sink)
                sink.flush()
                os.fsync(sink.fileno())
            os.replace(temp, final)
            _fsync_directory(self.directory)  # the rename itself survives a power cut
        except OSError as err:
            try:
                temp.unlink(missing_ok=True)
            except OSError:  # the directory itself is the problem; nothing was created
                pass
            raise self._write_error(err) from err
        return final

    def merge(self, parts: list[Path]) -> Path | None:
        """Replace ``parts`` (files this process wrote) by one part file holding their rows.

        A run writes one part per row, so a crash loses nothing; merging them when the run
        ends keeps the directory at one file per run, which keeps reads fast (each file
        costs a footer read). Only the given files are touched, so concurrent appenders are
        unaffected; a crash between writing the merged file and deleting the parts only
        leaves duplicates, which readers drop; a reader racing the deletion re-lists.
        """
        if len(parts) < 2:
            return parts[0] if parts else None
        try:
            tables = [self._read_part(part, None) for part in parts]
            path = self._write(pa.concat_tables(tables))
        except (FileNotFoundError, _BadFile, BamctlError):  # compacted away, or a full disk: the parts stay valid
            return None
        for part in parts:
            part.unlink(missing_ok=True)
        return path

    def supersede(self, written: Path) -> int:
        """Rewrite every other part file without the rows that a row of ``written`` (a part this
        process wrote) replaces: the same resume key, written earlier. A plain reader (pandas,
        pyarrow, duckdb, polars) then sees each sample once, the newest, after ``--force`` or a
        recompute under another compute version, with no compaction step. Returns the rows
        removed. Only older rows of this run's keys go, so a concurrent run's rows stay; a file
        is replaced by a new one holding the rest (then deleted), so a crash in between leaves
        duplicates, which bamctl's readers drop, never a loss."""
        try:
            ours = self._read_part(written, [*KEY_COLUMNS, "created_at"])
        except (FileNotFoundError, _BadFile):
            return 0
        newest = _key_frame(ours).groupby("_key")["_created"].max()
        removed = 0
        for part in self.part_files():
            if part == written:
                continue
            try:
                keys = _key_frame(self._read_part(part, [*KEY_COLUMNS, "created_at"]))
            except (FileNotFoundError, _BadFile):
                continue
            replaced = (keys["_key"].map(newest) > keys["_created"]).to_numpy()
            if not replaced.any():
                continue
            try:
                table = self._read_part(part, None)
            except (FileNotFoundError, _BadFile):
                continue
            rest = table.filter(pa.array(~replaced))
            if rest.num_rows:
                self._write(rest)
            part.unlink(missing_ok=True)
            removed += int(replaced.sum())
        return removed

    def compact(self) -> Path | None:
        """Merge all readable part files into one (newest row per key), then delete the merged parts.

        Safe alongside appenders: files written after the listing are left alone, and a crash
        between writing the merged file and deleting the old parts only leaves duplicates,
        which readers drop. Foreign or broken files are left in place. Also removes temp files
        of appends that crashed more than an hour ago. A reader that lists the directory just
        before a compaction may miss the merged rows once: compact between runs, not during reads.
        """
        parts, tables = self._load(columns=None)
        self._remove_stale_temps()
        if len(parts) < 2:
            return parts[0] if parts else None
        merged = _dedupe(pa.concat_tables(tables))
        path = self._write(merged)
        for part in parts:
            part.unlink(missing_ok=True)  # another compaction may have removed it already
        return path

    # ---- reading -------------------------------------------------------------------------

    def part_files(self) -> list[Path]:
        """Visible `*.parquet` files, oldest first (part names start with their write time)."""
        if not self.directory.is_dir():
            return []
        return sorted(
            p for p in self.directory.iterdir()
            if p.suffix == PART_SUFFIX and not p.name.startswith((".", "_")) and p.is_file()
        )

    def done_keys(self) -> set[ResumeKey]:
        """Resume keys of every stored row."""
        return set(self.done_requests())

    def done_requests(self) -> dict[ResumeKey, StoredRequest]:
        """Per resume key, the request and compute version of its newest row: a rerun reuses that
        row only when both match what it would compute (``bamctl.evaluation``), and never a row a
        server read at another length than sent (it holds no score)."""
        _, tables = self._load(columns=[*KEY_COLUMNS, *REUSE_COLUMNS, "served_token_gap", "created_at"])
        if not tables:
            return {}
        table = _dedupe(pa.concat_tables(tables))
        return {
            row_key(row): StoredRequest(row["request_digest"], row["compute_version"], bool(row["served_token_gap"]))
            for row in table.to_pylist()
        }

    def read_table(self, *, dedupe: bool = True) -> pa.Table:
        """All rows as one Arrow table with `schema.SCHEMA`, sorted by key; newest row per key if dedupe."""
        _, tables = self._load(columns=None)
        table = pa.concat_tables(tables) if tables else SCHEMA.empty_table()
        if dedupe:
            table = _dedupe(table)
        return table.sort_by([(c, "ascending") for c in SORT_COLUMNS])

    def read(
        self,
        *,
        task: str | Iterable[str] | None = None,
        model: str | Iterable[str] | None = None,
        protocol: str | Iterable[str] | None = None,
        where: str | None = None,
        dedupe: bool = True,
        strict: bool = False,
    ) -> pd.DataFrame:
        """All rows as one DataFrame, filtered (see `select.select_rows`); newest row per key if dedupe.

        With `strict`, naming a task/model/protocol absent from the store is a BamctlError
        with close matches, as the CLI wants; otherwise the result is just empty.

        Nullable integer and boolean columns use pandas' nullable dtypes (Int64, boolean) so a
        missing value stays missing instead of turning ints into floats.
        """
        from bamctl.results.select import select_rows

        frame = to_pandas(self.read_table(dedupe=dedupe))
        return select_rows(frame, task=task, model=model, protocol=protocol, where=where, strict=strict)

    # ---- internals -----------------------------------------------------------------------

    def _load(self, columns: list[str] | None, attempts: int = 5) -> tuple[list[Path], list[pa.Table]]:
        """Readable part files and their tables, conformed to SCHEMA; bad files warned about once.

        A part that vanishes between the listing and its read was merged by a finishing run
        (or a compaction) whose merged file the listing may have missed: list again.
        """
        for _ in range(attempts - 1):
            try:
                return self._load_once(columns, vanished_ok=False)
            except FileNotFoundError:
                continue
        return self._load_once(columns, vanished_ok=True)

    def _load_once(self, columns: list[str] | None, vanished_ok: bool) -> tuple[list[Path], list[pa.Table]]:
        parts: list[Path] = []
        tables: list[pa.Table] = []
        for path in self.part_files():
            try:
                table = self._read_part(path, columns)
            except FileNotFoundError:
                if not vanished_ok:
                    raise
                continue
            except _BadFile as bad:
                if path not in self._warned:
                    self._warned.add(path)
                    self._warn(f"skipping {path}: {bad}")
                continue
            parts.append(path)
            tables.append(table)
        return parts, tables

    def _read_part(self, path: Path, columns: list[str] | None) -> pa.Table:
        try:
            parquet = pq.ParquetFile(path)
            version = schema_version(parquet.schema_arrow)
            if version is None:
                raise _BadFile("not a bamctl results file (no bamctl.schema_version in its metadata)")
            if version > SCHEMA_VERSION:
                raise _BadFile(f"written by a newer bamctl (schema {version} > {SCHEMA_VERSION}); upgrade bamctl")
            if version < SCHEMA_VERSION:  # an older layout: read it whole and move it into today's
                table = upgrade(parquet.read(), version)
            else:
                present = set(parquet.schema_arrow.names)
                table = parquet.read(columns=[c for c in (columns or SCHEMA.names) if c in present])
        except FileNotFoundError:
            raise
        except (pa.ArrowException, OSError) as err:
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise _BadFile(f"unreadable Parquet (truncated or not Parquet): {reason}") from err
        return _conform(table, columns or list(SCHEMA.names))

    def _remove_stale_temps(self) -> None:
        if not self.directory.is_dir():
            return
        cutoff = time.time() - STALE_TEMP_SECONDS
        for temp in self.directory.glob(f".{PART_PREFIX}*.tmp"):
            try:
                if temp.stat().st_mtime < cutoff:
                    temp.unlink()
            except FileNotFoundError:
                pass

    def _write_error(self, err: OSError) -> BamctlError:
        reason = err.strerror or type(err).__name__
        return BamctlError(f"cannot write results to {self.directory}: {reason} (choose another directory with --dir)")


class _BadFile(Exception):
    """A file in the results directory that is not a readable bamctl part file."""


def _conform(table: pa.Table, columns: list[str]) -> pa.Table:
    """Table with exactly `columns` in SCHEMA's types; columns an older version lacked become null."""
    arrays = []
    for name in columns:
        field = SCHEMA.field(name)
        if name in table.column_names:
            try:
                arrays.append(table.column(name).cast(field.type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
                raise _BadFile(f"column {name!r} is not {field.type}") from err
        elif field.nullable:
            arrays.append(pa.nulls(table.num_rows, field.type))
        else:
            raise _BadFile(f"missing required column {name!r}")
    schema = pa.schema([SCHEMA.field(c) for c in columns], metadata=SCHEMA.metadata)
    return pa.Table.from_arrays(arrays, schema=schema)


def _key_frame(table: pa.Table) -> pd.DataFrame:
    """Per row: its resume key (one hashable value) and ``created_at`` in nanoseconds."""
    keys = table.select(list(KEY_COLUMNS)).to_pylist()
    return pd.DataFrame({"_key": [row_key(row) for row in keys],
                         "_created": table.column("created_at").cast(pa.int64()).to_numpy()})


def _dedupe(table: pa.Table) -> pa.Table:
    """Keep the newest row per resume key: latest `created_at`, then latest position in the table."""
    if table.num_rows == 0:
        return table
    keys = table.select(list(KEY_COLUMNS)).to_pandas()
    keys["_created"] = table.column("created_at").cast(pa.int64()).to_numpy()
    ordered = keys.sort_values("_created", kind="stable")
    # duplicated() treats NaN depths as equal, which is what a null depth means here
    keep = ordered.index[~ordered.duplicated(subset=list(KEY_COLUMNS), keep="last")]
    return table.take(pa.array(sorted(keep), type=pa.int64()))


_NULLABLE_TYPES = {pa.int64(): pd.Int64Dtype(), pa.bool_(): pd.BooleanDtype()}


def to_pandas(table: pa.Table) -> pd.DataFrame:
    """DataFrame with exact types: nullable Int64/boolean where a column may hold nulls."""
    frame = table.to_pandas(types_mapper=_NULLABLE_TYPES.get)
    for column in COLUMNS:
        if column.name in frame and not column.nullable:
            if column.type == pa.int64():
                frame[column.name] = frame[column.name].astype("int64")
            elif column.type == pa.bool_():
                frame[column.name] = frame[column.name].astype(bool)
    return frame


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # not supported on every platform/filesystem; the data file itself is synced
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
