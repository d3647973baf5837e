"""The embedded store: one SQLite file in WAL mode, shared safely by the threads and processes of a data dir.

A process opens one connection, and its threads take turns on it (`turn()`, held through every
transaction and read, and by the queue through whole operations): CPython runs one thread's Python at a
time and SQLite one writer at a time, so threads contending for both only lose time handing the GIL
back and forth: with 8 threads, taking turns went about twice as fast for dequeue + done as a
connection per thread with commits shared between threads (docs/benchmarks.md, "The embedded
deployment"). `transaction()` is reentrant, so a queue operation groups the view, the broker and the blob
metadata writes of one mail into one atomic commit. Processes are kept apart by SQLite's own file locks.

Group commit: a sync costs as much as a whole queue operation, so the turns of concurrent threads share
one. A thread that ends its turn while others wait for it leaves its writes in the open transaction and
waits; the last of the group commits once for all of them (each thread's transaction is a savepoint, so
one failing rolls back only its own writes). No call returns before its writes are committed, and a
failed commit is every member's failure: the acknowledgement a caller gets means what the durability
says. Alone, a thread commits at the end of its turn, as it would without grouping.

Combining: threads hand their operations to the thread holding the turn (`in_turn`, `in_group`; see
combining.py).

Syncs: at `fsync` SQLite commits as at `power` (no sync of its own) and the store syncs the WAL itself
once a group committed, unless none of its members promised durability (`transaction(synced=False)`: a
consumer's claim of a mail, which a power loss turns back into a mail to claim again). Every commit is
frames appended to the one WAL, so a sync makes every commit before it durable: an unsynced commit is made
durable by the next synced one, of this process or another.

Opening writes nothing: with `create` the store is made when missing and its schema completed (every
statement only adds what a store lacks, so an older store gains the tables of this version); without it
a missing store is NoStore and one lacking tables of this version is refused, naming them.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from ...errors import StoreUnusable
from .combining import Combiner
from .files import make_private, prepare, store_failure
from .groups import GROUP_LIMIT, Group
from .schema import check_schema, initialise
from .writers import WriterLock

_BUSY_TIMEOUT_MS = 60_000
# Tables every mailq store has had from the start: a database without them is something else's.
_MAILQ_TABLES = {"enqueued_mails", "blob_references"}

T = TypeVar("T")


# What survives a commit: anything (a sync per commit, shared by a group: the default, as Postfix syncs a
# mail before its 250; SQLite's FULL, which the store makes of NORMAL and syncs of its own, see the module),
# the loss of power but for the last commits (the WAL synced at checkpoints: they may roll back, the file
# never corrupts), or only the death of the process (the OS holds the written
# pages; a power loss may lose the last commits or, rarely, corrupt the file).
SYNCHRONOUS = {"fsync": "FULL", "power": "NORMAL", "process": "OFF"}


class EmbeddedStore:
    def __init__(self, data_dir: Path, durability: str = "fsync", create: bool = True) -> None:
        self.path, self.created = prepare(data_dir, create, initialise)
        # At `fsync` the store makes the syncs (see the module), SQLite does the rest as at `power`.
        self._syncs_commits = durability == "fsync"
        self.synchronous = SYNCHRONOUS["power" if self._syncs_commits else durability]
        self._wal: int | None = None  # a descriptor of the WAL file, to sync it
        self._writers = WriterLock(self.path)  # held by this process from BEGIN to the group's end
        self._turn = _Turn(self)
        self._combiner = Combiner(self)
        self._depth = 0
        self._group: Group | None = None
        self._closed = False
        self._connection = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=_BUSY_TIMEOUT_MS / 1000
        )
        try:
            # Read before anything is written: a foreign database is refused as it is, not converted.
            tables = {name for (name,) in self._connection.execute("SELECT name FROM sqlite_master")}
            if not _MAILQ_TABLES <= tables:
                raise StoreUnusable(f"mailq store {self.path} is an SQLite database, but not a mailq store")
            self._connection.execute(f"PRAGMA synchronous={self.synchronous}")
            self._connection.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
            self._connection.execute("PRAGMA cache_size=-65536")
            if create:
                initialise(self._connection)
            else:
                check_schema(self.path, self._connection, tables)
            make_private(self.path)
        except sqlite3.Error as error:
            self._connection.close()
            # At open, any error of SQLite's is one of this store's files.
            failure = store_failure(self.path, error) or StoreUnusable(f"mailq store {self.path}: {error}")
            raise failure from error
        except BaseException:
            self._connection.close()
            raise

    def raise_failure(self, error: sqlite3.Error | OSError) -> NoReturn:
        """Raise `error` as the store's StoreUnusable when its files or disk failed (a sync of the WAL
        that failed is one), else as it is (a statement mailq got wrong is a bug to show whole)."""
        if isinstance(error, OSError):
            raise StoreUnusable(f"mailq store {self.path}: syncing its WAL failed: {error}") from error
        failure = store_failure(self.path, error)
        if failure is None:
            raise error
        raise failure from error

    def transaction(self, synced: bool = True) -> _Transaction:
        """A write transaction (BEGIN IMMEDIATE: writers queue up front instead of deadlocking later),
        holding the turn until it ends, and committed by the end of the turn. `synced=False`: its writes
        promise nothing to anyone, so a group made of such transactions alone commits without a sync."""
        return _Transaction(self, synced)

    def turn(self) -> _Turn:
        """Hold the store for one whole operation, reentrantly."""
        return self._turn

    @property
    def open_group(self) -> Group | None:
        """The group of writes that the turns of now share, which a write made now joins (None: none is
        open)."""
        return self._group

    def in_turn(self, operation: Callable[[], T]) -> T:
        """Run `operation` in the store's turn, by this thread or by the thread holding the turn for
        another `in_turn` (see the module); returns its result, or raises its error, once its writes are
        committed."""
        return self._combiner.run(operation)

    def in_group(self, item: Any, write: Callable[[list[Any]], list[T]]) -> T:
        """`write([item])[0]` in the store's turn, as `in_turn` runs an operation; the holder of the turn
        writes the items handed over with an equal `write` in one call of it (one statement a table
        rather than a mail's statements a mail), and should that call fail, each item alone, so that each
        caller gets its own outcome."""
        return self._combiner.run(lambda: write([item])[0], item, write)

    def read(self, sql: str, parameters: tuple | list = ()) -> list[tuple]:
        with self._turn:
            try:
                return self._open().execute(sql, parameters).fetchall()
            except sqlite3.Error as error:
                self.raise_failure(error)

    def read_one(self, sql: str, parameters: tuple | list = ()) -> tuple | None:
        with self._turn:
            try:
                return self._open().execute(sql, parameters).fetchone()
            except sqlite3.Error as error:
                self.raise_failure(error)

    def _open(self) -> sqlite3.Connection:
        if self._closed:
            raise RuntimeError("the runtime is closed")
        return self._connection

    def _commit(self) -> None:
        """Commit the open group for every member; a failure is recorded for them all."""
        group = self._group
        assert group is not None
        self._group = None
        try:
            self._connection.execute("COMMIT")
        except sqlite3.Error as error:
            _rollback(self._connection)
            group.error = error
        finally:
            self._writers.release()
        if group.error is None and group.synced and self._syncs_commits:
            try:
                self._sync_wal()
            except OSError as error:  # committed, but maybe not durable: no member may say it is
                group.error = error
        if group.done is not None:
            group.done.set()

    def _sync_wal(self) -> None:
        if self._wal is None:
            # The WAL exists from the first commit until the last connection to the store closes.
            self._wal = os.open(f"{self.path}-wal", os.O_RDONLY | os.O_CLOEXEC)
        os.fdatasync(self._wal)

    def _abandon(self, error: sqlite3.Error) -> None:
        """SQLite rolled the whole open transaction back by itself (a full disk, an I/O error): the group's
        earlier members' writes are gone with it, and they must hear so."""
        group = self._group
        assert group is not None
        self._group = None
        self._writers.release()
        group.error = error
        if group.done is not None:
            group.done.set()

    def close(self) -> None:
        with self._turn:
            if self._group is not None:
                self._commit()
            self._closed = True
            self._connection.close()
            self._writers.close()
            if self._wal is not None:  # closing twice must not close a descriptor reused meanwhile
                os.close(self._wal)
                self._wal = None


class _Turn:
    """The store's turn: a reentrant lock whose outermost release ends the open group of writes. It commits
    the group, or, while other threads wait for the turn, leaves it open to them and waits for the commit
    the last of them makes.

    A thread waiting for a commit holds no turn, so whoever holds the turn never waits on it: the group
    always reaches a thread that finds no one waiting, and commits."""

    __slots__ = ("store", "waiting", "_lock", "_counting", "_owner", "_depth")

    def __init__(self, store: EmbeddedStore) -> None:
        self.store = store
        self.waiting = 0
        self._lock = threading.Lock()
        self._counting = threading.Lock()
        self._owner: int | None = None
        self._depth = 0

    def __enter__(self) -> _Turn:
        me = threading.get_ident()
        if self._owner == me:
            self._depth += 1
            return self
        if not self._lock.acquire(blocking=False):
            with self._counting:
                self.waiting += 1
            self._lock.acquire()
            with self._counting:
                self.waiting -= 1
        self._owner = me
        self._depth = 1
        return self

    def held(self) -> bool:
        """Whether the calling thread holds the turn."""
        return self._owner == threading.get_ident()

    def __exit__(self, kind: type | None, error: BaseException | None, trace: object) -> None:
        self._depth -= 1
        if self._depth:
            return
        store = self.store
        group = store._group
        if group is None:
            self._owner = None
            self._lock.release()
            return
        if self.waiting and group.members < GROUP_LIMIT:
            group.members += 1
            if group.done is None:
                group.done = threading.Event()
            done = group.done
            self._owner = None
            self._lock.release()
            done.wait()
        else:
            try:
                store._commit()
            finally:
                self._owner = None
                self._lock.release()
        # A failure of the body is the one to report; else a failed commit means these writes are lost.
        if group.error is not None and kind is None:
            store.raise_failure(group.error)


class _Transaction:
    """Reentrant: only the outermost level begins the group (or joins it with a savepoint) and ends its
    part of it; the turn's end commits.

    A plain class rather than a generator context manager: it sits on the hot path of every operation.
    """

    __slots__ = ("store", "synced", "outermost", "joined")

    def __init__(self, store: EmbeddedStore, synced: bool) -> None:
        self.store = store
        self.synced = synced

    def __enter__(self) -> sqlite3.Connection:
        store = self.store
        store._turn.__enter__()
        try:
            connection = store._open()
            self.outermost = store._depth == 0
            if self.outermost:
                self.joined = store._group is not None
                if self.joined:
                    connection.execute("SAVEPOINT member")
                else:
                    store._writers.acquire()
                    try:
                        connection.execute("BEGIN IMMEDIATE")
                    except BaseException:
                        store._writers.release()
                        raise
                    store._group = Group()
            if self.synced:
                store._group.synced = True  # type: ignore[union-attr]
        except sqlite3.Error as error:
            store._turn.__exit__(None, None, None)
            store.raise_failure(error)
        except BaseException as error:
            store._turn.__exit__(type(error), error, None)
            raise
        store._depth += 1
        return connection

    def __exit__(self, kind: type | None, error: BaseException | None, trace: object) -> None:
        store = self.store
        try:
            store._depth -= 1
            if self.outermost:
                _end(store, self.joined, succeeded=kind is None, error=error)
        finally:
            store._turn.__exit__(kind, error, trace)
        # A statement of the body that failed on the store's files or disk: said as the store's error.
        if isinstance(error, sqlite3.Error):
            store.raise_failure(error)


def _end(store: EmbeddedStore, joined: bool, succeeded: bool, error: BaseException | None) -> None:
    """End one member's part of the group: kept (its savepoint released), or undone alone."""
    connection = store._connection
    try:
        if joined:
            if succeeded:
                connection.execute("RELEASE member")
            elif connection.in_transaction:
                connection.execute("ROLLBACK TO member")
                connection.execute("RELEASE member")
        elif not succeeded:
            _rollback(connection)
            store._group = None
            store._writers.release()
            return
    except sqlite3.Error as failure:
        _rollback(connection)
        store._abandon(failure)
        store.raise_failure(failure)
    if not connection.in_transaction:
        # Only after a statement failed, whether or not the body went on.
        lost = error if isinstance(error, sqlite3.Error) else sqlite3.OperationalError("SQLite rolled back")
        store._abandon(lost)
        if succeeded:
            store.raise_failure(lost)


def _rollback(connection: sqlite3.Connection) -> None:
    # SQLite rolls back by itself on some failures (a full disk, an I/O error): then there is nothing left
    # to roll back, and the failure is what the caller must hear about.
    if connection.in_transaction:
        try:
            connection.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # the connection is broken: the failure that led here is the one reported
