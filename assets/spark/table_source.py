"""The "mailq" Spark data source (PySpark Python Data Source API): any table of the runtime's store, read
in parallel partitions through the store's table reader (`mailq_runtime.tables`), handed to Spark as the
Arrow record batches the reader yields.

    read_table(spark, settings, "blob_references")
    read_table(spark, settings, "blob_deletions", generations=[5, 6])
    read_table(spark, settings, "message_id_table", mailboxes=[mailbox_id])
    spark.read.format("mailq").option("url", ...).option("table", ...).load()   # once registered

Options: `url` (the runtime's), `table` (one of the store's tables), `partitions` (default: 2 x cores;
`read_table` passes Spark's default parallelism), `columns` (comma-separated, default all, in table order),
`generations` (comma-separated: only the rows whose `generation` is one of them) and `mailboxes`
(comma-separated mailbox ids: only the rows whose `mailbox_id` is one of them, read by that key).

The URL is parsed once, where Spark plans; the tasks get the parsed settings with the plan, and each asks
`mailq_runtime.deployments.table_reader` for its store's reader. Settings hold no secret, so neither does the
plan: a task that connects to a store with a password reads it from its own environment.

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

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import BinaryType, DataType, LongType, StringType, StructField, StructType

from mailq_runtime.deployments import table_reader
from mailq_runtime.errors import InvalidInput
from mailq_runtime.model import MailboxId
from mailq_runtime.settings import Settings
from mailq_runtime.tables import Column, TableRead, check_read, check_table, chosen

NAME = "mailq"

_SPARK_TYPES: dict[str, DataType] = {"long": LongType(), "string": StringType(), "binary": BinaryType()}


def spark_schema(columns: Sequence[Column]) -> StructType:
    return StructType([StructField(c.name, _SPARK_TYPES[c.kind], nullable=c.nullable) for c in columns])


class MailqReader(DataSourceReader):
    """Plans on the driver and reads in the tasks through the table reader of `settings`."""

    def __init__(self, settings: Settings, read: TableRead, partitions: int) -> None:
        self.settings = settings
        self.table_read = read
        self.partition_count = partitions

    def partitions(self) -> Sequence[InputPartition]:
        # Spark takes InputPartitions; the store's own partition travels as the value.
        planned = table_reader(self.settings).plan(self.table_read, self.partition_count)
        return [InputPartition(partition) for partition in planned]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return table_reader(self.settings).read(self.table_read, partition.value)


class MailqDataSource(DataSource):
    """Reads one table of the runtime's store; see the module docstring for the options."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        settings, table = self._table()
        return spark_schema(chosen(table, table_reader(settings).columns(table), self._columns()))

    def reader(self, schema: StructType) -> DataSourceReader:
        settings, table = self._table()
        reader = table_reader(settings)
        columns = {column.name: column for column in reader.columns(table)}
        read = TableRead(
            table,
            tuple(columns[field.name] for field in schema),
            generations=self._generations(),
            mailboxes=self._mailboxes(),
        )
        return MailqReader(settings, check_read(reader, read), self._partitions())

    def _table(self) -> tuple[Settings, str]:
        settings = Settings.from_url(self._option("url"))
        return settings, check_table(table_reader(settings), self._option("table"))

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
    settings: Settings,
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
    check_table(table_reader(settings), table)
    if spark not in _registered:
        spark.dataSource.register(MailqDataSource)
        _registered.add(spark)
    options = {
        "url": settings.to_url(),
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


def rows_upper_bound(settings: Settings, table: str) -> int | None:
    """An upper bound of the number of rows of `table` read from the store's metadata rather than by a
    pass over the rows, or None where the store has no cheap one."""
    reader = table_reader(settings)
    return reader.rows_upper_bound(check_table(reader, table))
