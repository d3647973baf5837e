"""The "mailq" Spark data source (PySpark Python Data Source API): reads any table of the runtime's store
in parallel partitions, handing Spark Arrow record batches rather than Python rows.

    read_table(spark, "embedded:///var/lib/mailq", "blob_references")
    spark.read.format("mailq").option("url", ...).option("table", ...).load()   # once registered

Options: `url`, `table` (one of the schema's tables), `partitions` (default: 2 x cores; `read_table`
passes Spark's default parallelism) and `columns` (comma-separated, default all, in table order).

The url is the runtime's (`Settings.from_url` reads it, on the driver and in every task), so the data
source finds everything it reads from there and the deployment's factory decides what it can read. A mailq
URL holds no secret, so neither does the plan: a task that connects to a store with a password reads it
from its own environment.

Filters are left to Spark, not pushed into the SQL: in PySpark 4.3 the scans of one DataFrame within one
query share the read planned for one of them, so two branches filtered differently (the GC's per-generation
Bloom filters) would both read one branch's rows. Pushing `generation = g` read one generation of four
1.5x faster, and made the GC collect live blobs.

The embedded store is split into rowid ranges planned on the driver; every task opens its own read-only
connection and reads its range chunk by chunk (see `SqliteRowidRanges`). There is no snapshot across
chunks, and rows inserted after planning beyond the highest planned rowid are not read: maintenance jobs
rely on the reference generations for safety, not on a consistent scan.
"""

from __future__ import annotations

import os
import re
import sqlite3
import weakref
from collections.abc import Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass
from importlib.resources import files
from itertools import pairwise
from pathlib import Path
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import BinaryType, DataType, LongType, StringType, StructField, StructType

from mailq_runtime.settings import EMBEDDED, Settings
from mailq_runtime.stores.embedded import DATABASE_FILE

NAME = "mailq"


def _schema_tables() -> frozenset[str]:
    sql = files("mailq_runtime.stores").joinpath("embedded_schema.sql").read_text()
    return frozenset(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", sql, flags=re.IGNORECASE))


# The allow-list: a table name ends up in SQL text, and any name outside the schema is a mistake.
TABLES: frozenset[str] = _schema_tables()

# Rowids per statement and Arrow batch: big enough that the per-batch costs (the statement, the hand-over
# to the JVM) vanish, small enough to keep a task's memory at a few MB.
_CHUNK_ROWIDS = 16_384
_OPEN_TIMEOUT_S = 60.0

_SPARK_TYPES: dict[str, DataType] = {"INTEGER": LongType(), "TEXT": StringType(), "BLOB": BinaryType()}
_ARROW_TYPES: dict[str, pa.DataType] = {"long": pa.int64(), "string": pa.string(), "binary": pa.binary()}


def check_table(table: str) -> str:
    if table not in TABLES:
        raise ValueError(f"unknown table {table!r}: the store's tables are {', '.join(sorted(TABLES))}")
    return table


def embedded_database(url: str) -> Path:
    """The SQLite file of the deployment of `url`, which must be an embedded one with an absolute data
    dir (`embedded:///<data dir>`): Spark's tasks do not run where the driver's working directory is."""
    settings = Settings.from_url(url)
    if settings.backend != EMBEDDED:
        # Cassandra's token ranges plug in as another Partitioning.
        raise ValueError(f"the mailq data source reads embedded stores only, not {settings.shown()}")
    if not settings.data_dir.is_absolute():
        raise ValueError(
            f"the embedded store url needs an absolute path, embedded:///<data dir>: {settings.shown()}"
        )
    database = settings.data_dir / DATABASE_FILE
    if not database.is_file():
        raise FileNotFoundError(f"no embedded store at {database} (url {settings.shown()})")
    return database


def _connect(database: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"{database.as_uri()}?mode=ro", uri=True, timeout=_OPEN_TIMEOUT_S)


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def sqlite_schema(database: Path, table: str, columns: Sequence[str] | None = None) -> StructType:
    """The Spark schema of a table from PRAGMA table_info: INTEGER -> long, TEXT -> string, BLOB -> binary;
    NOT NULL columns are not nullable."""
    check_table(table)
    with closing(_connect(database)) as connection:
        info = connection.execute(f"PRAGMA table_info({_quote(table)})").fetchall()
    if not info:
        raise ValueError(f"table {table!r} does not exist in {database}")
    fields: dict[str, StructField] = {}
    for _, name, declared, not_null, _, _ in info:
        spark_type = _SPARK_TYPES.get(declared.upper())
        if spark_type is None:
            raise ValueError(
                f"column {table}.{name} has type {declared!r}: only INTEGER, TEXT, BLOB are read"
            )
        fields[name] = StructField(name, spark_type, nullable=not not_null)
    if columns is None:
        return StructType(list(fields.values()))
    unknown = [name for name in columns if name not in fields]
    if unknown or not columns or len(set(columns)) != len(columns):
        raise ValueError(
            f"invalid columns {list(columns)!r} for table {table!r}: give distinct names among {list(fields)}"
        )
    return StructType([fields[name] for name in columns])


class RowidRange(InputPartition):
    """The rows with first <= rowid < stop."""

    def __init__(self, first: int, stop: int) -> None:
        super().__init__((first, stop))
        self.first = first
        self.stop = stop


class WholeTable(InputPartition):
    """A table without rowid (the small generations log), read in one task."""

    def __init__(self) -> None:
        super().__init__(None)


class Partitioning(Protocol):
    """How a store splits a table into partitions read in parallel; Cassandra token ranges plug in here."""

    def plan(self, count: int) -> list[InputPartition]:
        """At most `count` partitions covering the table; runs on the driver."""
        ...

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """One partition's rows as Arrow batches of the planned schema; runs in a task."""
        ...


@dataclass(frozen=True)
class SqliteRowidRanges:
    """The embedded store's partitioning: contiguous rowid ranges of equal width.

    A partition is read in chunks of rowids, each chunk by one aggregate statement that returns every
    column already concatenated (`group_concat` of the values, and of their byte lengths for text and
    blobs), which Arrow then splits in C. SQLite thus walks the rows in C and Python handles a few objects
    per chunk: in a Spark task, fetching rows with fetchmany and converting them costs about 1.7 us of
    CPU a row, this about 1 us, mostly inside SQLite, which is what lifts 2 cores past 1M rows/s.
    All aggregates of one statement see the rows in the same order, so the columns stay aligned; every
    column's value count is checked against count(*) all the same.
    """

    database: Path
    table: str
    schema: StructType

    def plan(self, count: int) -> list[InputPartition]:
        with closing(_connect(self.database)) as connection:
            (without_rowid,) = connection.execute(
                "SELECT wr FROM pragma_table_list WHERE schema = 'main' AND name = ?", (self.table,)
            ).fetchone()
            if without_rowid:
                return [WholeTable()]
            low, high = connection.execute(_rowid_bounds_sql(self.table)).fetchone()
        if low is None:
            return [RowidRange(0, 0)]
        span = high - low + 1
        count = min(count, span)
        bounds = [low + span * i // count for i in range(count + 1)]
        return [RowidRange(first, stop) for first, stop in pairwise(bounds)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        schema = pa.schema(
            [pa.field(f.name, _ARROW_TYPES[f.dataType.typeName()], nullable=f.nullable) for f in self.schema]
        )
        sql = f"SELECT count(*), {', '.join(_aggregates(self.schema))} FROM {_quote(self.table)}"
        if isinstance(partition, RowidRange):
            sql += " WHERE rowid >= ? AND rowid < ?"
            chunks = [
                (first, min(first + _CHUNK_ROWIDS, partition.stop))
                for first in range(partition.first, partition.stop, _CHUNK_ROWIDS)
            ]
        else:
            chunks = [()]
        with closing(_connect(self.database)) as connection:
            connection.text_factory = bytes
            for parameters in chunks:
                rows, *values = connection.execute(sql, parameters).fetchone()
                if not rows:
                    continue
                try:
                    batch = pa.RecordBatch.from_arrays(_columns(self.schema, rows, values), schema=schema)
                except ValueError as error:  # pyarrow's ArrowInvalid included
                    raise ValueError(
                        f"table {self.table!r}: a value does not fit its column's declared type: {error}"
                    ) from error
                yield batch


def _aggregates(schema: StructType) -> Iterator[str]:
    for field in schema:
        column = _quote(field.name)
        if field.dataType.typeName() == "long":
            # An empty item is a NULL; any other non-integer value becomes '!', which fails the conversion
            # instead of passing for a NULL.
            item = (
                f"CASE typeof({column}) WHEN 'integer' THEN {column} WHEN 'null' THEN '' ELSE '!' END"
                if field.nullable
                else column
            )
            yield f"group_concat({item}, ',')"
        else:
            size = f"length(CAST({column} AS BLOB))"
            yield f"group_concat({column}, '')"  # NULLs are skipped: they add no bytes
            yield f"group_concat({f'ifnull({size}, -1)' if field.nullable else size}, ',')"


def _columns(schema: StructType, rows: int, values: list[bytes | None]) -> list[pa.Array]:
    columns = []
    remaining = iter(values)
    for field in schema:
        if field.dataType.typeName() == "long":
            columns.append(_integers(next(remaining), rows))
        else:
            data, sizes = next(remaining), next(remaining)
            arrow_type = _ARROW_TYPES[field.dataType.typeName()]
            columns.append(_bytes(data or b"", _integers(sizes, rows), arrow_type))
    return columns


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


def rows_upper_bound(url: str, table: str) -> int:
    """An upper bound of the number of rows of `table`, from the store's metadata rather than a pass over
    the rows: for the embedded store the span of its rowids (max - min + 1: two B-tree descents; deleted
    rows leave gaps, never extra rows). A table without rowid (the small generations log) is counted."""
    with closing(_connect(embedded_database(url))) as connection:
        (without_rowid,) = connection.execute(
            "SELECT wr FROM pragma_table_list WHERE schema = 'main' AND name = ?", (check_table(table),)
        ).fetchone()
        if without_rowid:
            return connection.execute(f"SELECT count(*) FROM {_quote(table)}").fetchone()[0]
        low, high = connection.execute(_rowid_bounds_sql(table)).fetchone()
    return 0 if low is None else high - low + 1


def _rowid_bounds_sql(table: str) -> str:
    """min and max rowid as two subqueries: SQLite answers each from one end of the B-tree, but a single
    `SELECT min(rowid), max(rowid)` scans the whole table (2 s for 10M references with a warm cache, and
    the data source plans every query with it)."""
    return f"SELECT (SELECT min(rowid) FROM {_quote(table)}), (SELECT max(rowid) FROM {_quote(table)})"


class MailqReader(DataSourceReader):
    def __init__(self, partitioning: Partitioning, partitions: int) -> None:
        self.partitioning = partitioning
        self.partition_count = partitions

    def partitions(self) -> Sequence[InputPartition]:
        return self.partitioning.plan(self.partition_count)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.partitioning.read(partition)


class MailqDataSource(DataSource):
    """Reads one table of the runtime's store; see the module docstring for the options."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return sqlite_schema(embedded_database(self._option("url")), self._option("table"), self._columns())

    def reader(self, schema: StructType) -> DataSourceReader:
        return MailqReader(self._partitioning(schema), self._partitions())

    def _partitioning(self, schema: StructType) -> Partitioning:
        unsupported = [
            f"{f.name} {f.dataType.simpleString()}"
            for f in schema
            if f.dataType.typeName() not in _ARROW_TYPES
        ]
        if unsupported:
            raise ValueError(
                f"the mailq data source reads long, string and binary columns, not {unsupported}"
            )
        table = check_table(self._option("table"))
        return SqliteRowidRanges(embedded_database(self._option("url")), table, schema)

    def _option(self, key: str) -> str:
        value = self.options.get(key)
        if not value:
            raise ValueError(f"the mailq data source needs the option {key!r}")
        return value

    def _columns(self) -> list[str] | None:
        value = self.options.get("columns")
        return None if value is None else [name.strip() for name in value.split(",")]

    def _partitions(self) -> int:
        value = self.options.get("partitions")
        if value is None:
            return 2 * (os.cpu_count() or 1)
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"the option 'partitions' must be a positive integer, not {value!r}")
        return int(value)


_registered: weakref.WeakSet[SparkSession] = weakref.WeakSet()


def read_table(
    spark: SparkSession,
    url: str,
    table: str,
    *,
    partitions: int | None = None,
    columns: str | Sequence[str] | None = None,
) -> DataFrame:
    """A table of the store as a DataFrame, in `partitions` partitions (default: Spark's default
    parallelism)."""
    # Checked here too, so that a bad name fails in the caller's process with a plain error rather than
    # inside a Python worker's traceback.
    check_table(table)
    if spark not in _registered:
        spark.dataSource.register(MailqDataSource)
        _registered.add(spark)
    options = {
        "url": url,
        "table": table,
        "partitions": str(partitions if partitions is not None else spark.sparkContext.defaultParallelism),
    }
    if columns is not None:
        options["columns"] = columns if isinstance(columns, str) else ",".join(columns)
    return spark.read.format(NAME).options(**options).load()
