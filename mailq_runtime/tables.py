"""The one interface by which a store offers its tables to the maintenance pipeline: a partition plan and
a row reader. `deployments.table_reader(settings)` hands out the deployment's; `assets/spark/table_source.py`
wraps it as the Spark data source, so nothing outside a store names that store's classes, files or schema.

A read (`TableRead`) names a table, the columns wanted, and optionally only the rows of some generations
or of some mailboxes, which a store may read by key. `plan` splits it into partitions on the process that
plans (rowid ranges on the embedded store, token ranges or partition keys on Cassandra); a partition is
picklable, since it travels to the process that reads it (a Spark task), which gets the reader from the
same settings. `read` yields one partition's rows as Arrow record batches of the read's columns: Arrow,
not Spark, is the hand-over, because Spark takes Arrow batches as they are, and building Python objects
for every value instead roughly halves a scan's rate (docs/benchmarks.md, `spark_read.py`).

No snapshot is promised across partitions or batches: maintenance relies on the reference generations
for safety, not on a consistent scan. A driver's failure while planning or reading is raised as the
store's mailq error (StoreUnavailable, StoreUnusable, NoStore), as every other call of the store does.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .errors import InvalidInput

if TYPE_CHECKING:  # pyarrow is loaded by the readers only, never by the runtime's commands
    import pyarrow as pa


@dataclass(frozen=True)
class Column:
    """A column of a table as the pipeline reads it: `kind` is "long", "string" or "binary", what
    every column of every store is read as."""

    name: str
    kind: str
    nullable: bool


@dataclass(frozen=True)
class TableRead:
    """What one read wants of a table: its `columns` (in this order); with `generations`, only the rows
    whose generation is one of them; with `mailboxes`, only the rows of these mailbox ids (an empty tuple:
    none). The caller checks that the table has the filtered column (`check_read`)."""

    table: str
    columns: tuple[Column, ...]
    generations: tuple[int, ...] | None = None
    mailboxes: tuple[str, ...] | None = None


class TableReader(Protocol):
    """A store's tables as the pipeline reads them."""

    tables: frozenset[str]

    def columns(self, table: str) -> list[Column]:
        """The table's columns in table order; key columns are not nullable."""
        ...

    def plan(self, read: TableRead, count: int) -> Sequence[object]:
        """At least one partition, and about `count` (more for a big table), covering the rows."""
        ...

    def read(self, read: TableRead, partition: object) -> Iterator[pa.RecordBatch]:
        """One partition's rows as Arrow batches of the read's columns."""
        ...

    def rows_upper_bound(self, table: str) -> int | None:
        """An upper bound of the table's rows from the store's metadata rather than a pass over the rows;
        None where the store has no cheap one."""
        ...


def check_table(reader: TableReader, table: str) -> str:
    """The allow-list: a table name ends up in statement text, and any name outside the schema is a
    mistake."""
    if table not in reader.tables:
        raise InvalidInput(
            f"unknown table {table!r}: the store's tables are {', '.join(sorted(reader.tables))}"
        )
    return table


def chosen(table: str, columns: Sequence[Column], names: Sequence[str] | None) -> tuple[Column, ...]:
    """The table's columns (in table order) or, given `names`, those in that order."""
    by_name = {column.name: column for column in columns}
    if names is None:
        return tuple(columns)
    unknown = [name for name in names if name not in by_name]
    if unknown or not names or len(set(names)) != len(names):
        raise InvalidInput(
            f"invalid columns {list(names)!r} for table {table!r}: give distinct names among {list(by_name)}"
        )
    return tuple(by_name[name] for name in names)


def check_read(reader: TableReader, read: TableRead) -> TableRead:
    """`read` if the table has the columns its filters need."""
    names = {column.name for column in reader.columns(read.table)}
    if read.generations is not None and "generation" not in names:
        raise InvalidInput(f"the option 'generations' needs a generation column, which {read.table!r} lacks")
    if read.mailboxes is not None and "mailbox_id" not in names:
        raise InvalidInput(f"the option 'mailboxes' needs a mailbox_id column, which {read.table!r} lacks")
    return read


def arrow_schema(columns: Sequence[Column]) -> pa.Schema:
    """The Arrow schema of the batches that read `columns`."""
    import pyarrow as pa

    types = {"long": pa.int64(), "string": pa.string(), "binary": pa.binary()}
    return pa.schema([pa.field(c.name, types[c.kind], nullable=c.nullable) for c in columns])
