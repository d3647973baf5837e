"""Materialisation metadata a person reads in the UI, as Dagster types: tables with a schema, sizes as
integers in bytes, times as timestamps (in a table, a column of type `datetime`), so that the UI plots
every numeric figure across materialisations on a scale that means something."""

import dagster as dg

from mailq_runtime.clock import MICROS_PER_SECOND, to_datetime

Column = tuple[str, str, str]  # name, type (string, int, float, bool, datetime), what it holds
DATETIME = "datetime"  # a table column of times, each as `when` writes it


def when(micros: int) -> str:
    """A runtime timestamp (microseconds since the epoch, UTC) as a date and time, for a table's cell
    (a table's values are text or numbers)."""
    return f"{to_datetime(micros):%Y-%m-%d %H:%M:%S} UTC"


def timestamp(micros: int) -> dg.TimestampMetadataValue:
    """A runtime timestamp as Dagster's timestamp, which the UI shows as a date in the viewer's zone."""
    return dg.MetadataValue.timestamp(micros / MICROS_PER_SECOND)


def micros_of(value: dg.MetadataValue) -> int:
    """The runtime timestamp that `timestamp` recorded (exact: a double holds today's microseconds to a
    fraction of one). A materialisation of before these types holds the microseconds as an integer."""
    if isinstance(value, dg.TimestampMetadataValue):
        return round(value.value * MICROS_PER_SECOND)
    return value.value


def table(key: str, columns: list[Column], records: list[dict], empty: str) -> dict[str, dg.MetadataValue]:
    """`key` as a Dagster table of `records`; an empty one comes with `<key>_note`, saying why it is empty,
    since the UI shows a table without rows as its bare header."""
    schema = dg.TableSchema(
        columns=[dg.TableColumn(name, kind, description=text) for name, kind, text in columns]
    )
    entries = {
        key: dg.MetadataValue.table(
            [dg.TableRecord({name: record[name] for name, _, _ in columns}) for record in records], schema
        )
    }
    if not records:
        entries[f"{key}_note"] = dg.MetadataValue.text(empty)
    return entries


def short_blob_id(blob_id: str) -> str:
    """A blob id as a table shows it first: its generation and the first 12 hex digits of its hash
    (`g1_0123456789ab…`), enough to tell the blobs of a table apart; the full id has its own column."""
    generation, _, digest = blob_id.partition("_")
    return f"{generation}_{digest[:12]}…" if len(digest) > 12 else blob_id
