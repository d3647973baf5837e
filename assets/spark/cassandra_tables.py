"""The Cassandra store's reader of the mailq data source: a table read by token range, or by naming its
partitions where the table's key allows it.

Planning splits the Murmur3 ring into equal token ranges, at least as many as Spark asks for, and more
when `system.size_estimates` says the table is big (one range per SPLIT_BYTES). Each task pages through
`token(pk) > ? AND token(pk) <= ?` and hands Spark one Arrow batch a page, the next page asked for
before this one is converted. A table whose partitions are
named by the generation (`blob_deletions`: (generation, shard)) is read, when the read asks for some
generations only, partition by partition: a GC iteration reads its eligible generations' deletions and
nothing else. A read of some mailboxes only (a scoped counter recomputation) asks for `mailbox_id = ?`
mailbox by mailbox: a partition read where mailbox_id is the partition key (mailboxes, message_id_table,
mailbox_counters), an index read on imap_uid_table.

Every process (a task's Python worker, the driver's planner) opens its own session from the URL the
plan carries, once, and keeps it for the tasks it runs next: the plan holds no secret, and a password
comes from the environment of the process that connects (`MAILQ_CASSANDRA_PASSWORD`). As on the
embedded store, there is no snapshot: safety rests on the reference generations, not on the scan.
"""

from __future__ import annotations

import atexit
import math
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise

import pyarrow as pa
import pyarrow.compute as pc
from cassandra.cluster import EXEC_PROFILE_DEFAULT
from cassandra.query import tuple_factory
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import BinaryType, DataType, LongType, StringType, StructField, StructType

from mailq_runtime.runtime import open_cassandra
from mailq_runtime.settings import Settings
from mailq_runtime.stores.cassandra import CassandraStore
from mailq_runtime.stores.cassandra.schema import DELETION_SHARDS
from mailq_runtime.stores.cassandra.schema import TABLES as SCHEMA_TABLES

from .columns import arrow_schema, chosen

TABLES: frozenset[str] = frozenset(SCHEMA_TABLES)

# Murmur3Partitioner's tokens: it never gives MIN_TOKEN to a key, so (MIN_TOKEN, MAX_TOKEN] is the ring.
MIN_TOKEN = -(2**63)
MAX_TOKEN = 2**63 - 1
# A token range's share of a big table, as the Spark Cassandra connector sizes its splits.
SPLIT_BYTES = 64 * 1024 * 1024
MAX_SPLITS = 4096
# Rows a page: one statement round trip and one Arrow batch.
PAGE_ROWS = 5_000

_SPARK_TYPES: dict[str, DataType] = {
    "bigint": LongType(),
    "int": LongType(),
    "counter": LongType(),
    "text": StringType(),
    "varchar": StringType(),
    "ascii": StringType(),
    "blob": BinaryType(),
}
# The tables whose partition keys a set of generations names.
_PARTITIONS_OF_GENERATION = {"blob_deletions": lambda g: [(g, shard) for shard in range(DELETION_SHARDS)]}


class TokenRange(InputPartition):
    """The partitions whose token is in (low, high]."""

    def __init__(self, low: int, high: int) -> None:
        super().__init__((low, high))
        self.low = low
        self.high = high


class PartitionKeys(InputPartition):
    """Partitions named by their keys."""

    def __init__(self, keys: Sequence[tuple]) -> None:
        super().__init__(tuple(keys))
        self.keys = tuple(keys)


class MailboxIds(InputPartition):
    """The rows of these mailboxes."""

    def __init__(self, mailboxes: Sequence[str]) -> None:
        super().__init__(tuple(mailboxes))
        self.mailboxes = tuple(mailboxes)


_stores: dict[str, CassandraStore] = {}
_opening = threading.Lock()


def store_of(url: str) -> CassandraStore:
    """This process's session on the store of `url`, opened at the first call (never creating)."""
    with _opening:
        store = _stores.get(url)
        if store is None:
            store = _stores[url] = open_cassandra(Settings.from_url(url))
    return store


@atexit.register
def _close_stores() -> None:
    for store in _stores.values():
        store.close()


def token_ranges(count: int) -> list[TokenRange]:
    """The ring in `count` ranges of equal width."""
    span = MAX_TOKEN - MIN_TOKEN
    bounds = [MIN_TOKEN + span * i // count for i in range(count + 1)]
    return [TokenRange(low, high) for low, high in pairwise(bounds)]


@dataclass(frozen=True)
class CassandraTokenRanges:
    url: str
    table: str
    schema: StructType
    partition_key: tuple[str, ...]
    generations: tuple[int, ...] | None = None  # only the rows of these generations
    mailboxes: tuple[str, ...] | None = None  # only the rows of these mailbox ids

    def plan(self, count: int) -> list[InputPartition]:
        if self.mailboxes is not None:
            ids = self.mailboxes
            return [MailboxIds(ids[i::count]) for i in range(min(count, len(ids)))] or [MailboxIds(())]
        naming = _PARTITIONS_OF_GENERATION.get(self.table)
        if naming is not None and self.generations is not None:
            keys = [key for generation in self.generations for key in naming(generation)]
            if not keys:
                return [PartitionKeys(())]
            return [PartitionKeys(keys[i::count]) for i in range(min(count, len(keys)))]
        return token_ranges(max(count, self._splits_by_size()))

    def _splits_by_size(self) -> int:
        """Ranges of about SPLIT_BYTES by the table's size estimates, which Cassandra refreshes every
        few minutes (none yet for a young table: then the count Spark asked for decides)."""
        store = store_of(self.url)
        rows = store.session.execute(
            "SELECT partitions_count, mean_partition_size FROM system.size_estimates "
            "WHERE keyspace_name = %s AND table_name = %s",
            (store.keyspace, self.table),
        )
        estimated = sum(row.partitions_count * row.mean_partition_size for row in rows)
        return min(MAX_SPLITS, math.ceil(estimated / SPLIT_BYTES))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        store = store_of(self.url)
        # Plain tuples: a named tuple a row costs more than the rest of the conversion.
        profile = store.session.execution_profile_clone_update(
            EXEC_PROFILE_DEFAULT, row_factory=tuple_factory
        )
        names = [field.name for field in self.schema]
        filtered = self.generations is not None
        # The filter's column is read even when the caller does not want it, and dropped after.
        extra = filtered and "generation" not in names
        columns = ", ".join([*names, "generation"] if extra else names)
        if isinstance(partition, TokenRange):
            key = ", ".join(self.partition_key)
            cql = f"SELECT {columns} FROM {self.table} WHERE token({key}) > ? AND token({key}) <= ?"
            reads = [(cql, (partition.low, partition.high))]
        elif isinstance(partition, MailboxIds):
            cql = f"SELECT {columns} FROM {self.table} WHERE mailbox_id = ?"
            reads = [(cql, (mailbox,)) for mailbox in partition.mailboxes]
        else:
            assert isinstance(partition, PartitionKeys)
            where = " AND ".join(f"{name} = ?" for name in self.partition_key)
            reads = [(f"SELECT {columns} FROM {self.table} WHERE {where}", key) for key in partition.keys]
        schema = arrow_schema(self.schema)
        read_schema = schema.append(pa.field("generation", pa.int64())) if extra else schema
        wanted = pa.array(self.generations or (), pa.int64())
        for cql, parameters in reads:
            statement = store.statement(cql).bind(parameters)
            statement.fetch_size = PAGE_ROWS
            future = store.session.execute_async(statement, execution_profile=profile)
            while True:
                rows = future.result().current_rows
                more = future.has_more_pages
                if more:
                    # The server and the driver's I/O thread fetch the next page while this one converts.
                    future.start_fetching_next_page()
                if rows:
                    batch = _batch(rows, read_schema)
                    if filtered:
                        batch = batch.filter(pc.is_in(batch.column("generation"), value_set=wanted))
                    yield batch.select(names) if extra else batch
                if not more:
                    break


def _batch(rows: list[tuple], schema: pa.Schema) -> pa.RecordBatch:
    columns = zip(*rows, strict=True)
    return pa.RecordBatch.from_arrays(
        [pa.array(values, type=field.type) for values, field in zip(columns, schema, strict=True)],
        schema=schema,
    )


@dataclass(frozen=True)
class CassandraTables:
    """The tables of a Cassandra store's keyspace, as the data source reads them."""

    url: str
    tables: frozenset[str] = TABLES

    def _metadata(self, table: str):
        store = store_of(self.url)
        metadata = store.cluster.metadata.keyspaces[store.keyspace].tables.get(table)
        if metadata is None:
            raise ValueError(f"table {table!r} does not exist in keyspace {store.keyspace!r}")
        return metadata

    def schema(self, table: str, columns: Sequence[str] | None) -> StructType:
        """bigint, int and counter -> long, text -> string, blob -> binary; key columns are not nullable."""
        metadata = self._metadata(table)
        key = {column.name for column in metadata.primary_key}
        fields: dict[str, StructField] = {}
        for name, column in metadata.columns.items():
            spark_type = _SPARK_TYPES.get(column.cql_type)
            if spark_type is None:
                raise ValueError(
                    f"column {table}.{name} has type {column.cql_type!r}: only {', '.join(_SPARK_TYPES)} "
                    "are read"
                )
            fields[name] = StructField(name, spark_type, nullable=name not in key)
        return chosen(table, fields, columns)

    def partitioning(
        self,
        table: str,
        schema: StructType,
        generations: tuple[int, ...] | None,
        mailboxes: tuple[str, ...] | None = None,
    ) -> CassandraTokenRanges:
        key = tuple(column.name for column in self._metadata(table).partition_key)
        return CassandraTokenRanges(self.url, table, schema, key, generations, mailboxes)

    def rows_upper_bound(self, table: str) -> int | None:
        """None: Cassandra's estimates count partitions, not rows, and lag minutes behind the writes."""
        return None
