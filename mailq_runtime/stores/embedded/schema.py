"""The embedded store's schema (schema.sql): made or completed by a creating open, checked by any other."""

from __future__ import annotations

import re
import sqlite3
from importlib.resources import files
from pathlib import Path

from ...errors import StoreUnusable

_SCHEMA = files(__package__).joinpath("schema.sql")
# Columns added to a table after it first shipped, with their type: CREATE TABLE IF NOT EXISTS keeps an
# older store's table as it is, so a creating open adds them.
_ADDED_COLUMNS = {("blob_deletions", "owner"): "TEXT"}


def initialise(connection: sqlite3.Connection) -> None:
    """WAL mode (kept in the file) and the schema, whose statements only add what a store lacks."""
    connection.execute("PRAGMA journal_mode=WAL")
    connection.executescript(_SCHEMA.read_text())
    if _missing_columns(connection):
        # Another process may be completing the same store: the look and the change in one write lock.
        connection.execute("BEGIN IMMEDIATE")
        try:
            for table, column in _missing_columns(connection):
                connection.execute(f"ALTER TABLE {table} ADD COLUMN {column} {_ADDED_COLUMNS[table, column]}")
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise


def _missing_columns(connection: sqlite3.Connection) -> list[tuple[str, str]]:
    columns: dict[str, set[str]] = {}
    for table, _ in _ADDED_COLUMNS:
        if table not in columns:
            columns[table] = {row[1] for row in connection.execute(f"PRAGMA table_info({table})")}
    return [(table, column) for table, column in _ADDED_COLUMNS if column not in columns[table]]


def check_schema(path: Path, connection: sqlite3.Connection, found: set[str]) -> None:
    """Refuse a store that lacks tables, indexes or columns of this version, which only a creating open
    adds."""
    wanted = re.findall(r"CREATE (?:TABLE|INDEX) IF NOT EXISTS (\w+)", _SCHEMA.read_text(), re.IGNORECASE)
    missing = [name for name in wanted if name not in found]
    if not missing:
        missing = [f"{table}.{column}" for table, column in _missing_columns(connection)]
    if missing:
        raise StoreUnusable(
            f"mailq store {path} lacks {', '.join(missing)} of this version of mailq: "
            "`mailq schema create` adds them"
        )
