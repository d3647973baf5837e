"""The embedded store's tables for the pipeline (tables.py): a table of the SQLite file split into rowid
ranges planned by the caller; every reading process opens its own read-only connection and reads its
range chunk by chunk.

There is no snapshot across chunks, and rows inserted after planning beyond the highest planned rowid are
not read: maintenance jobs rely on the reference generations for safety, not on a consistent scan.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from importlib.resources import files
from itertools import pairwise
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from ...errors import InvalidInput, NoStore, StoreUnusable
from ...tables import Column, TableRead, arrow_schema
from .files import DATABASE_FILE, store_failure


def _schema_tables() -> frozenset[str]:
    sql = files(__package__).joinpath("schema.sql").read_text()
    return frozenset(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", sql, flags=re.IGNORECASE))


TABLES: frozenset[str] = _schema_tables()

# Rowids per statement and Arrow batch: big enough that the per-batch costs (the statement, the hand-over
# to the JVM) vanish, small enough to keep a task's memory at a few MB.
_CHUNK_ROWIDS = 16_384
_OPEN_TIMEOUT_S = 60.0

_KINDS = {"INTEGER": "long", "TEXT": "string", "BLOB": "binary"}


@dataclass(frozen=True)
class RowidRange:
    """The rows with first <= rowid < stop."""

    first: int
    stop: int


@dataclass(frozen=True)
class WholeTable:
    """A table without rowid (the small generations log), or the rows of a few mailboxes, read at once."""


@dataclass(frozen=True)
class EmbeddedTableReader:
    """The tables of the embedded store of an absolute data dir (the processes that read do not run where
    the planner's working directory is).

    A partition is read in chunks of rowids, each chunk by one aggregate statement that returns every
    column already concatenated (`group_concat` of the values, and of their byte lengths for text and
    blobs), which Arrow then splits in C. SQLite thus walks the rows in C and Python handles a few objects
    per chunk, which is what lifts 2 cores past 1M rows/s (docs/benchmarks.md, `spark_read.py`).
    All aggregates of one statement see the rows in the same order, so the columns stay aligned; every
    column's value count is checked against count(*) all the same.
    """

    database: Path
    tables: frozenset[str] = TABLES

    @classmethod
    def of(cls, data_dir: Path, shown: str) -> EmbeddedTableReader:
        """The reader of the store in `data_dir` (`shown`: the URL as messages show it)."""
        if not data_dir.is_absolute():
            raise InvalidInput(
                f"the embedded store url needs an absolute path, embedded:///<data dir>: {shown}"
            )
        database = data_dir / DATABASE_FILE
        if not database.is_file():
            raise NoStore(f"no embedded store at {database} (url {shown})")
        return cls(database)

    def columns(self, table: str) -> list[Column]:
        """From PRAGMA table_info: INTEGER -> long, TEXT -> string, BLOB -> binary; NOT NULL columns are
        not nullable."""
        with self._failures(), closing(self._connect()) as connection:
            info = connection.execute(f"PRAGMA table_info({_quote(table)})").fetchall()
        if not info:
            raise InvalidInput(f"table {table!r} does not exist in {self.database}")
        columns = []
        for _, name, declared, not_null, _, _ in info:
            kind = _KINDS.get(declared.upper())
            if kind is None:
                raise StoreUnusable(
                    f"column {table}.{name} has type {declared!r}: only INTEGER, TEXT, BLOB are read"
                )
            columns.append(Column(name, kind, nullable=not not_null))
        return columns

    def plan(self, read: TableRead, count: int) -> list[RowidRange | WholeTable]:
        """Contiguous rowid ranges of equal width."""
        if read.mailboxes is not None:
            # A few mailboxes: one statement through the tables' mailbox_id index, not a pass over rowids.
            return [WholeTable()]
        with self._failures(), closing(self._connect()) as connection:
            if _without_rowid(connection, read.table):
                return [WholeTable()]
            low, high = connection.execute(_rowid_bounds_sql(read.table)).fetchone()
        if low is None:
            return [RowidRange(0, 0)]
        span = high - low + 1
        count = min(count, span)
        bounds = [low + span * i // count for i in range(count + 1)]
        return [RowidRange(first, stop) for first, stop in pairwise(bounds)]

    def read(self, read: TableRead, partition: object) -> Iterator[pa.RecordBatch]:
        schema = arrow_schema(read.columns)
        sql = _select(read, isinstance(partition, RowidRange))
        if isinstance(partition, RowidRange):
            chunks = [
                (first, min(first + _CHUNK_ROWIDS, partition.stop))
                for first in range(partition.first, partition.stop, _CHUNK_ROWIDS)
            ]
        else:
            chunks = [()]
        with self._failures(), closing(self._connect()) as connection:
            connection.text_factory = bytes
            for parameters in chunks:
                rows, *values = connection.execute(sql, parameters).fetchone()
                if not rows:
                    continue
                try:
                    batch = pa.RecordBatch.from_arrays(_arrays(read.columns, rows, values), schema=schema)
                except ValueError as error:  # pyarrow's ArrowInvalid included
                    raise StoreUnusable(
                        f"table {read.table!r}: a value does not fit its column's declared type: {error}"
                    ) from error
                yield batch

    def rows_upper_bound(self, table: str) -> int:
        """The span of the table's rowids (max - min + 1: two B-tree descents; deleted rows leave gaps,
        never extra rows). A table without rowid (the small generations log) is counted."""
        with self._failures(), closing(self._connect()) as connection:
            if _without_rowid(connection, table):
                return connection.execute(f"SELECT count(*) FROM {_quote(table)}").fetchone()[0]
            low, high = connection.execute(_rowid_bounds_sql(table)).fetchone()
        return 0 if low is None else high - low + 1

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(f"{self.database.as_uri()}?mode=ro", uri=True, timeout=_OPEN_TIMEOUT_S)

    @contextmanager
    def _failures(self) -> Iterator[None]:
        """SQLite's errors raised as the store's: its files or disk failing, or a store it cannot read."""
        try:
            yield
        except sqlite3.Error as error:
            failure = store_failure(self.database, error)
            raise failure or StoreUnusable(f"mailq store {self.database}: {error}") from error


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _without_rowid(connection: sqlite3.Connection, table: str) -> bool:
    (without_rowid,) = connection.execute(
        "SELECT wr FROM pragma_table_list WHERE schema = 'main' AND name = ?", (table,)
    ).fetchone()
    return bool(without_rowid)


def _select(read: TableRead, by_rowid: bool) -> str:
    conditions = []
    if read.generations is not None:
        conditions.append(f"generation IN ({', '.join(str(int(g)) for g in read.generations)})")
    if read.mailboxes is not None:
        # The ids are validated hex (MailboxId), so they may stand in the statement's text.
        conditions.append(f"mailbox_id IN ({', '.join(repr(str(m)) for m in read.mailboxes)})")
    if by_rowid:
        conditions.append("rowid >= ? AND rowid < ?")
    sql = f"SELECT count(*), {', '.join(_aggregates(read.columns))} FROM {_quote(read.table)}"
    return sql + (" WHERE " + " AND ".join(conditions) if conditions else "")


def _aggregates(columns: Sequence[Column]) -> Iterator[str]:
    for column in columns:
        name = _quote(column.name)
        if column.kind == "long":
            # An empty item is a NULL; any other non-integer value becomes '!', which fails the conversion
            # instead of passing for a NULL.
            item = (
                f"CASE typeof({name}) WHEN 'integer' THEN {name} WHEN 'null' THEN '' ELSE '!' END"
                if column.nullable
                else name
            )
            yield f"group_concat({item}, ',')"
        else:
            size = f"length(CAST({name} AS BLOB))"
            yield f"group_concat({name}, '')"  # NULLs are skipped: they add no bytes
            yield f"group_concat({f'ifnull({size}, -1)' if column.nullable else size}, ',')"


def _arrays(columns: Sequence[Column], rows: int, values: list[bytes | None]) -> list[pa.Array]:
    arrays = []
    remaining = iter(values)
    for column in columns:
        if column.kind == "long":
            arrays.append(_integers(next(remaining), rows))
        else:
            data, sizes = next(remaining), next(remaining)
            arrow_type = pa.string() if column.kind == "string" else pa.binary()
            arrays.append(_bytes(data or b"", _integers(sizes, rows), arrow_type))
    return arrays


def _integers(text: bytes, rows: int) -> pa.Array:
    items = pc.split_pattern(pa.array([text], pa.string()), ",").flatten()
    if len(items) != rows:
        raise ValueError(f"{len(items)} values for {rows} rows")
    return pc.if_else(pc.equal(items, ""), pa.scalar(None, pa.string()), items).cast(pa.int64())


def _bytes(data: bytes, sizes: pa.Array, arrow_type: pa.DataType) -> pa.Array:
    """Splits the concatenated values at their sizes; a size of -1 is a NULL."""
    present = pc.greater_equal(sizes, 0)
    offsets = pa.concat_arrays([pa.array([0], pa.int64()), pc.cumulative_sum(pc.max_element_wise(sizes, 0))])
    if offsets[-1].as_py() != len(data):
        raise ValueError(f"values of {offsets[-1].as_py()} bytes in all, but {len(data)} bytes read")
    validity = None if pc.all(present).as_py() else present.buffers()[1]
    values = pa.Array.from_buffers(
        pa.large_binary(), len(sizes), [validity, offsets.buffers()[1], pa.py_buffer(data)]
    )
    # Back to 32-bit offsets, which Spark expects; casting to string validates the UTF-8.
    return values.cast(arrow_type)


def _rowid_bounds_sql(table: str) -> str:
    """min and max rowid as two subqueries: SQLite answers each from one end of the B-tree, but a single
    `SELECT min(rowid), max(rowid)` scans the whole table (2 s for 10M references with a warm cache, and
    the data source plans every query with it)."""
    return f"SELECT (SELECT min(rowid) FROM {_quote(table)}), (SELECT max(rowid) FROM {_quote(table)})"
