"""The embedded store: one SQLite file in WAL mode, shared safely by the threads and processes of a data dir.

Each thread has its own connection. `transaction()` is reentrant per thread, so a queue operation can
group the view, the broker and the blob metadata writes of one mail into a single atomic commit.
`atomically()` goes further for the hot operations: concurrent callers share commits (group commit),
because on a virtual disk the commit, not the statements, is what a mail costs.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path
from typing import Any, TypeVar

from ..errors import NoStore

T = TypeVar("T")
_GROUP_LIMIT = 64

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
        self._pending: list[_Work] = []
        self._pending_lock = threading.Lock()
        self._leading = False
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

    def atomically(self, work: Callable[[], T]) -> T:
        """Run `work` in a transaction of its own or one shared with other threads' work (group commit).

        Whoever finds no commit in progress leads: it runs every pending piece of work, each in its own
        savepoint (one failing rolls back alone), commits once for all, wakes exactly the callers it
        committed, and hands the lead to the oldest caller still waiting. A lone caller thus leads at
        once and pays nothing; concurrent callers pay one commit between them. Each caller returns only
        after the commit that holds its work, so durability per call is unchanged.
        """
        if getattr(self._local, "depth", 0):
            return work()  # already inside a transaction of this thread: join it
        item = _Work(work)
        with self._pending_lock:
            self._pending.append(item)
            leads = not self._leading
            self._leading = True
        if not leads:
            item.wake.acquire()  # released once committed, or when handed the lead
        if not item.finished:
            self._lead()
        return item.result()

    def _lead(self) -> None:
        with self._pending_lock:
            batch, self._pending = self._pending[:_GROUP_LIMIT], self._pending[_GROUP_LIMIT:]
        try:
            with self.transaction() as connection:
                if len(batch) == 1:  # alone, a failure rolls the whole transaction back: no savepoint
                    batch[0].value = batch[0].work()
                else:
                    for item in batch:
                        _run_in_savepoint(connection, item)
        except BaseException as error:  # the lone work or the commit failed: nothing of the batch is durable
            for item in batch:
                item.error, item.value = error, None
        finally:
            with self._pending_lock:
                successor = self._pending[0] if self._pending else None
                self._leading = successor is not None
            for item in batch:
                item.finished = True
                item.wake.release()
            if successor is not None:
                successor.wake.release()

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


def _run_in_savepoint(connection: sqlite3.Connection, item: _Work) -> None:
    connection.execute("SAVEPOINT work")
    try:
        item.value = item.work()
    except BaseException as error:
        connection.execute("ROLLBACK TO work")
        item.error = error
    connection.execute("RELEASE work")


class _Work:
    __slots__ = ("work", "wake", "finished", "value", "error")

    def __init__(self, work: Callable[[], Any]) -> None:
        self.work = work
        self.wake = threading.Lock()
        self.wake.acquire()
        self.finished = False
        self.value: Any = None
        self.error: BaseException | None = None

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value
