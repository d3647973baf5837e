"""Materialisation metadata a person reads in the UI: tables with a schema, sizes in human units too,
times with their date."""

import dagster as dg

from mailq_runtime.clock import to_datetime

Column = tuple[str, str, str]  # name, type (string, int, float, bool), what it holds


def human_bytes(count: int) -> str:
    size = float(count)
    for unit in ("bytes", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{count} bytes" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def when(micros: int) -> str:
    """A runtime timestamp (microseconds since the epoch, UTC) as a date and time."""
    return f"{to_datetime(micros):%Y-%m-%d %H:%M:%S} UTC"


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
