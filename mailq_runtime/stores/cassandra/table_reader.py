"""The Cassandra store's tables for the pipeline (tables.py): a table read by token range, or by naming its
partitions where the table's key allows it.

Planning splits the Murmur3 ring into equal token ranges, at least as many as asked for, and more when
`system.size_estimates` says the table is big (one range per SPLIT_BYTES). Each reading process pages
through `token(pk) > ? AND token(pk) <= ?` and hands out one Arrow batch a page, the next page asked for
before this one is converted. A table whose partitions are named by the generation (`blob_deletions`:
(generation, shard)) is read, when the read asks for some generations only, partition by partition: a GC
iteration reads its eligible generations' deletions and nothing else. A read of some mailboxes only (a
scoped counter recomputation) asks for `mailbox_id = ?` mailbox by mailbox: a partition read where
mailbox_id is the partition key (mailboxes, message_id_table, mailbox_counters), an index read on
imap_uid_table.

The reader opens its session at its first statement, never before: knowing the tables, or that there is
no cheap bound of their rows, costs no connection. `deployments.table_reader` keeps one reader a process, so
its session serves the process's next reads; a partition holds no secret, and a password comes from the
environment of the process that connects.
"""

from __future__ import annotations

import atexit
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise

import pyarrow as pa
import pyarrow.compute as pc
from cassandra.cluster import EXEC_PROFILE_DEFAULT
from cassandra.query import tuple_factory

from ...errors import InvalidInput, StoreUnusable
from ...tables import Column, TableRead, arrow_schema
from .schema import DELETION_SHARDS
from .schema import TABLES as SCHEMA_TABLES
from .store import _FAILURES, CassandraStore

TABLES: frozenset[str] = frozenset(SCHEMA_TABLES)

# Murmur3Partitioner's tokens: it never gives MIN_TOKEN to a key, so (MIN_TOKEN, MAX_TOKEN] is the ring.
MIN_TOKEN = -(2**63)
MAX_TOKEN = 2**63 - 1
# A token range's share of a big table, as the Spark Cassandra connector sizes its splits.
SPLIT_BYTES = 64 * 1024 * 1024
MAX_SPLITS = 4096
# Rows a page: one statement round trip and one Arrow batch.
PAGE_ROWS = 5_000

_KINDS = {
    "bigint": "long",
    "int": "long",
    "counter": "long",
    "text": "string",
    "varchar": "string",
    "ascii": "string",
    "blob": "binary",
}
# The tables whose partition keys a set of generations names.
_PARTITIONS_OF_GENERATION = {"blob_deletions": lambda g: [(g, shard) for shard in range(DELETION_SHARDS)]}


@dataclass(frozen=True)
class TokenRange:
    """The partitions whose token is in (low, high]."""

    low: int
    high: int


@dataclass(frozen=True)
class PartitionKeys:
    """Partitions named by their keys."""

    keys: tuple[tuple, ...]


@dataclass(frozen=True)
class MailboxIds:
    """The rows of these mailboxes."""

    mailboxes: tuple[str, ...]


def token_ranges(count: int) -> list[TokenRange]:
    """The ring in `count` ranges of equal width."""
    span = MAX_TOKEN - MIN_TOKEN
    bounds = [MIN_TOKEN + span * i // count for i in range(count + 1)]
    return [TokenRange(low, high) for low, high in pairwise(bounds)]


class CassandraTableReader:
    """The tables of a Cassandra store's keyspace, read on the session `open_store` opens."""

    tables: frozenset[str] = TABLES

    def __init__(self, open_store: Callable[[], CassandraStore]) -> None:
        self._open_store = open_store
        self._store: CassandraStore | None = None
        self._opening = threading.Lock()

    @property
    def store(self) -> CassandraStore:
        with self._opening:
            if self._store is None:
                self._store = self._open_store()
                atexit.register(self._store.close)
        return self._store

    def columns(self, table: str) -> list[Column]:
        """bigint, int and counter -> long, text -> string, blob -> binary; key columns are not nullable."""
        metadata = self._metadata(table)
        key = {column.name for column in metadata.primary_key}
        columns = []
        for name, column in metadata.columns.items():
            kind = _KINDS.get(column.cql_type)
            if kind is None:
                raise StoreUnusable(
                    f"column {table}.{name} has type {column.cql_type!r}: only {', '.join(_KINDS)} are read"
                )
            columns.append(Column(name, kind, nullable=name not in key))
        return columns

    def plan(self, read: TableRead, count: int) -> list[TokenRange | PartitionKeys | MailboxIds]:
        if read.mailboxes is not None:
            ids = read.mailboxes
            return [MailboxIds(ids[i::count]) for i in range(min(count, len(ids)))] or [MailboxIds(())]
        naming = _PARTITIONS_OF_GENERATION.get(read.table)
        if naming is not None and read.generations is not None:
            keys = [key for generation in read.generations for key in naming(generation)]
            if not keys:
                return [PartitionKeys(())]
            return [PartitionKeys(tuple(keys[i::count])) for i in range(min(count, len(keys)))]
        return token_ranges(max(count, self._splits_by_size(read.table)))

    def read(self, read: TableRead, partition: object) -> Iterator[pa.RecordBatch]:
        names = [column.name for column in read.columns]
        filtered = read.generations is not None
        # The filter's column is read even when the caller does not want it, and dropped after.
        extra = filtered and "generation" not in names
        schema = arrow_schema(read.columns)
        read_schema = schema.append(pa.field("generation", pa.int64())) if extra else schema
        wanted = pa.array(read.generations or (), pa.int64())
        for cql, parameters in self._statements(read, partition, [*names, "generation"] if extra else names):
            for rows in self._pages(cql, parameters):
                batch = _batch(rows, read_schema)
                if filtered:
                    batch = batch.filter(pc.is_in(batch.column("generation"), value_set=wanted))
                yield batch.select(names) if extra else batch

    def rows_upper_bound(self, table: str) -> int | None:
        """None: Cassandra's estimates count partitions, not rows, and lag minutes behind the writes."""
        return None

    def _metadata(self, table: str):
        store = self.store
        metadata = store.cluster.metadata.keyspaces[store.keyspace].tables.get(table)
        if metadata is None:
            raise InvalidInput(f"table {table!r} does not exist in keyspace {store.keyspace!r}")
        return metadata

    def _splits_by_size(self, table: str) -> int:
        """Ranges of about SPLIT_BYTES by the table's size estimates, which Cassandra refreshes every
        few minutes (none yet for a young table: then the count asked for decides)."""
        store = self.store
        try:
            # Not through `store.execute`, which qualifies a statement's table with the store's keyspace.
            rows = store.session.execute(
                "SELECT partitions_count, mean_partition_size FROM system.size_estimates "
                "WHERE keyspace_name = %s AND table_name = %s",
                (store.keyspace, table),
            )
        except _FAILURES as error:
            raise store.failure(error, "reading system.size_estimates") from error
        estimated = sum(row.partitions_count * row.mean_partition_size for row in rows)
        return min(MAX_SPLITS, math.ceil(estimated / SPLIT_BYTES))

    def _statements(self, read: TableRead, partition: object, names: Sequence[str]) -> list[tuple]:
        columns = ", ".join(names)
        key = [column.name for column in self._metadata(read.table).partition_key]
        if isinstance(partition, TokenRange):
            token = f"token({', '.join(key)})"
            cql = f"SELECT {columns} FROM {read.table} WHERE {token} > ? AND {token} <= ?"
            return [(cql, (partition.low, partition.high))]
        if isinstance(partition, MailboxIds):
            cql = f"SELECT {columns} FROM {read.table} WHERE mailbox_id = ?"
            return [(cql, (mailbox,)) for mailbox in partition.mailboxes]
        assert isinstance(partition, PartitionKeys)
        where = " AND ".join(f"{name} = ?" for name in key)
        return [(f"SELECT {columns} FROM {read.table} WHERE {where}", k) for k in partition.keys]

    def _pages(self, cql: str, parameters: tuple) -> Iterator[list[tuple]]:
        """The statement's rows a page at a time, as plain tuples (a named tuple a row costs more than the
        rest of the conversion); the server and the driver's I/O thread fetch the next page while this one
        is converted. A failure of the driver is raised as the store's."""
        store = self.store
        doing = f"reading {cql.split(' FROM ', 1)[1].split(' ', 1)[0]}"
        try:
            profile = store.session.execution_profile_clone_update(
                EXEC_PROFILE_DEFAULT, row_factory=tuple_factory
            )
            statement = store.statement(cql).bind(parameters)
            statement.fetch_size = PAGE_ROWS
            future = store.session.execute_async(statement, execution_profile=profile)
            while True:
                rows = future.result().current_rows
                more = future.has_more_pages
                if more:
                    future.start_fetching_next_page()
                if rows:
                    yield rows
                if not more:
                    return
        except _FAILURES as error:
            raise store.failure(error, doing) from error


def _batch(rows: list[tuple], schema: pa.Schema) -> pa.RecordBatch:
    columns = zip(*rows, strict=True)
    return pa.RecordBatch.from_arrays(
        [pa.array(values, type=field.type) for values, field in zip(columns, schema, strict=True)],
        schema=schema,
    )
