"""The embedded store: one SQLite file in WAL mode, shared safely by the threads and processes of a data dir.

Each thread has its own connection. `transaction()` is reentrant per thread, so a queue operation can
group the view, the broker and the blob metadata writes of one mail into a single atomic commit.
`turn()` makes the threads of a process take turns for whole queue operations: CPython runs one
thread's Python at a time and SQLite one writer at a time, and threads contending for both (every
statement gives the GIL up and takes it back) were measured twice as slow as threads taking turns.
"""

from __future__ import annotations

import sqlite3
import threading
from importlib.resources import files
from pathlib import Path

from ..errors import NoStore

DATABASE_FILE = "mailq.db"
_BUSY_TIMEOUT_MS = 60_000


# What survives a commit: the death of the process (the OS holds the written pages), the loss of power
# (WAL synced at checkpoints: the last commits may roll back, the file never corrupts), or anything
# (a sync per commit). Syncs cost milliseconds on virtual disks, which is why "process" is the default.
SYNCHRONOUS = {"process": "OFF", "power": "NORMAL", "fsync": "FULL"}


class EmbeddedStore:
    def __init__(self, data_dir: Path, durability: str = "process", create: bool = True) -> None:
        self.path = data_dir / DATABASE_FILE
        if not create and not self.path.is_file():
            raise NoStore(f"no mailq data in {data_dir}: nothing was enqueued there yet (check MAILQ_URL)")
        data_dir.mkdir(parents=True, exist_ok=True)
        self.synchronous = SYNCHRONOUS[durability]
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._closed = False
        self._turn = threading.RLock()
        schema = files(__package__).joinpath("embedded_schema.sql").read_text()
        self._connection().executescript(schema)

    def _connection(self) -> sqlite3.Connection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            if self._closed:
                raise RuntimeError("the runtime is closed")
            connection = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=_BUSY_TIMEOUT_MS / 1000
            )
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute(f"PRAGMA synchronous={self.synchronous}")
            connection.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
            connection.execute("PRAGMA cache_size=-65536")
            self._local.connection = connection
            self._local.depth = 0
            with self._lock:
                self._connections.append(connection)
        return connection

    def transaction(self) -> _Transaction:
        """A write transaction (BEGIN IMMEDIATE: writers queue up front instead of deadlocking later)."""
        return _Transaction(self)

    def turn(self) -> threading.RLock:
        """Hold the store for one whole operation, reentrantly; take it before any transaction."""
        return self._turn

    def read(self, sql: str, parameters: tuple | list = ()) -> list[tuple]:
        return self._connection().execute(sql, parameters).fetchall()

    def read_one(self, sql: str, parameters: tuple | list = ()) -> tuple | None:
        return self._connection().execute(sql, parameters).fetchone()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            connections, self._connections = self._connections, []
        for connection in connections:
            connection.close()


class _Transaction:
    """Reentrant per thread: only the outermost level begins and commits (or rolls back).

    A plain class rather than a generator context manager: it sits on the hot path of every operation.
    """

    __slots__ = ("store", "connection", "outermost")

    def __init__(self, store: EmbeddedStore) -> None:
        self.store = store

    def __enter__(self) -> sqlite3.Connection:
        self.connection = connection = self.store._connection()
        local = self.store._local
        self.outermost = local.depth == 0
        if self.outermost:
            connection.execute("BEGIN IMMEDIATE")
        local.depth += 1
        return connection

    def __exit__(self, kind: type | None, error: BaseException | None, trace: object) -> None:
        local = self.store._local
        local.depth -= 1
        if self.outermost:
            self.connection.execute("ROLLBACK" if kind is not None else "COMMIT")
