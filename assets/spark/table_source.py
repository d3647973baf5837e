"""The "mailq" Spark data source (PySpark Python Data Source API): reads any table of the runtime's store
in parallel partitions, handing Spark Arrow record batches rather than Python rows.

    read_table(spark, "embedded:///var/lib/mailq", "blob_references")
    read_table(spark, "cassandra://db1/mailq?s3=mail-blobs&broker=amqp://mq1/", "blob_deletions",
               generations=[5, 6])
    read_table(spark, url, "message_id_table", mailboxes=[mailbox_id])
    spark.read.format("mailq").option("url", ...).option("table", ...).load()   # once registered

Options: `url`, `table` (one of the store's tables), `partitions` (default: 2 x cores; `read_table`
passes Spark's default parallelism), `columns` (comma-separated, default all, in table order) and
`generations` (comma-separated: only the rows whose `generation` is one of them) and `mailboxes`
(comma-separated mailbox ids: only the rows whose `mailbox_id` is one of them, read by that key).

The url is the runtime's (`Settings.from_url` reads it, on the driver and in every task), so the data
source finds everything it reads from there: a store's reader plans the partitions and reads them, the
rest is shared. The embedded store is read by rowid range (sqlite_tables.py), Cassandra by token range
or by partition key (cassandra_tables.py). A mailq URL holds no secret, so neither does the plan: a task
that connects to a store with a password reads it from its own environment.

Spark's filters are not pushed into the reads: in PySpark 4.3 the scans of one DataFrame within one query
share the read planned for one of them, so two branches filtered differently (the GC's per-generation
Bloom filters) would both read one branch's rows; pushing `generation = g` made the GC collect live blobs.
A read that wants fewer rows says so in its options (`generations`, `mailboxes`), which make it another
relation.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator, Sequence
from typing import Protocol

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from mailq_runtime.errors import InvalidInput
from mailq_runtime.model import MailboxId
from mailq_runtime.settings import EMBEDDED, Settings

from .columns import ARROW_TYPES

NAME = "mailq"


class Partitioning(Protocol):
    """How a store splits a table into partitions read in parallel."""

    def plan(self, count: int) -> list[InputPartition]:
        """At least one partition, and about `count` (more for a big table), covering the rows; runs on
        the driver."""
        ...

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """One partition's rows as Arrow batches of the planned schema; runs in a task."""
        ...


class StoreTables(Protocol):
    """A store's tables as the data source reads them."""

    tables: frozenset[str]

    def schema(self, table: str, columns: Sequence[str] | None) -> StructType: ...

    def partitioning(
        self,
        table: str,
        schema: StructType,
        generations: tuple[int, ...] | None,
        mailboxes: tuple[str, ...] | None = None,
    ) -> Partitioning: ...

    def rows_upper_bound(self, table: str) -> int | None:
        """An upper bound of the table's rows from the store's metadata; None: no cheap one."""
        ...


def store_tables(url: str) -> StoreTables:
    """The tables of the store of `url`; the drivers of the other store are never imported."""
    settings = Settings.from_url(url)
    if settings.backend == EMBEDDED:
        from .sqlite_tables import SqliteTables, embedded_database

        return SqliteTables(embedded_database(settings))
    from .cassandra_tables import CassandraTables

    return CassandraTables(settings.url)


def table_names(url: str) -> frozenset[str]:
    """The tables a store of `url`'s kind has, known without connecting."""
    if Settings.from_url(url).backend == EMBEDDED:
        from .sqlite_tables import TABLES
    else:
        from .cassandra_tables import TABLES
    return TABLES


def check_table(url: str, table: str) -> str:
    # The allow-list: a table name ends up in statement text, and any name outside the schema is a mistake.
    tables = table_names(url)
    if table not in tables:
        raise ValueError(f"unknown table {table!r}: the store's tables are {', '.join(sorted(tables))}")
    return table


def rows_upper_bound(url: str, table: str) -> int | None:
    """An upper bound of the number of rows of `table` read from the store's metadata rather than by a
    pass over the rows, or None where the store has no cheap one."""
    return store_tables(url).rows_upper_bound(check_table(url, table))


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
        url = self._option("url")
        return store_tables(url).schema(check_table(url, self._option("table")), self._columns())

    def reader(self, schema: StructType) -> DataSourceReader:
        return MailqReader(self._partitioning(schema), self._partitions())

    def _partitioning(self, schema: StructType) -> Partitioning:
        unsupported = [
            f"{f.name} {f.dataType.simpleString()}"
            for f in schema
            if f.dataType.typeName() not in ARROW_TYPES
        ]
        if unsupported:
            raise ValueError(
                f"the mailq data source reads long, string and binary columns, not {unsupported}"
            )
        url = self._option("url")
        table = check_table(url, self._option("table"))
        store = store_tables(url)
        generations = self._generations()
        if generations is not None and "generation" not in store.schema(table, None).names:
            raise ValueError(f"the option 'generations' needs a generation column, which {table!r} lacks")
        mailboxes = self._mailboxes()
        if mailboxes is not None and "mailbox_id" not in store.schema(table, None).names:
            raise ValueError(f"the option 'mailboxes' needs a mailbox_id column, which {table!r} lacks")
        return store.partitioning(table, schema, generations, mailboxes)

    def _option(self, key: str) -> str:
        value = self.options.get(key)
        if not value:
            raise ValueError(f"the mailq data source needs the option {key!r}")
        return value

    def _columns(self) -> list[str] | None:
        value = self.options.get("columns")
        return None if value is None else [name.strip() for name in value.split(",")]

    def _generations(self) -> tuple[int, ...] | None:
        value = self.options.get("generations")
        if value is None:
            return None
        items = [item.strip() for item in value.split(",") if item.strip()]
        if not all(item.isdigit() for item in items):
            raise ValueError(
                f"the option 'generations' must be comma-separated generation numbers, not {value!r}"
            )
        return tuple(sorted({int(item) for item in items}))

    def _mailboxes(self) -> tuple[str, ...] | None:
        value = self.options.get("mailboxes")
        if value is None:
            return None
        try:
            # Validated ids: the readers may put them in statement text.
            return tuple(sorted({str(MailboxId(item.strip())) for item in value.split(",") if item.strip()}))
        except InvalidInput as error:
            raise ValueError(f"the option 'mailboxes' must be comma-separated mailbox ids: {error}") from None

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
    generations: Sequence[int] | None = None,
    mailboxes: Sequence[str] | None = None,
) -> DataFrame:
    """A table of the store as a DataFrame, in `partitions` partitions (default: Spark's default
    parallelism), with the rows of `generations` only, and of `mailboxes` only, when given (an empty list:
    none)."""
    # Checked here too, so that a bad name fails in the caller's process with a plain error rather than
    # inside a Python worker's traceback.
    check_table(url, table)
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
    if generations is not None:
        options["generations"] = ",".join(str(int(g)) for g in generations)
    if mailboxes is not None:
        options["mailboxes"] = ",".join(str(m) for m in mailboxes)
    return spark.read.format(NAME).options(**options).load()
