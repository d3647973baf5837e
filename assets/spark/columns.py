"""What the store readers of the mailq data source share: the column types they hand Spark, as Spark and
Arrow types, and the choice of a read's columns."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
from pyspark.sql.types import StructField, StructType

# Every column of every store is read as one of these.
ARROW_TYPES: dict[str, pa.DataType] = {"long": pa.int64(), "string": pa.string(), "binary": pa.binary()}


def arrow_schema(schema: StructType) -> pa.Schema:
    return pa.schema(
        [pa.field(f.name, ARROW_TYPES[f.dataType.typeName()], nullable=f.nullable) for f in schema]
    )


def chosen(table: str, fields: dict[str, StructField], columns: Sequence[str] | None) -> StructType:
    """The table's fields (by name, in table order) or, given `columns`, those in that order."""
    if columns is None:
        return StructType(list(fields.values()))
    unknown = [name for name in columns if name not in fields]
    if unknown or not columns or len(set(columns)) != len(columns):
        raise ValueError(
            f"invalid columns {list(columns)!r} for table {table!r}: give distinct names among {list(fields)}"
        )
    return StructType([fields[name] for name in columns])
