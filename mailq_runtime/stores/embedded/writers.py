"""The store's writers take turns across processes on a lock file next to it (`mailq.db-writer`).

SQLite lets one writer at a time into a database and makes the others poll: a BEGIN IMMEDIATE that finds
another process writing sleeps 1, 2, 5, 10, 15, 20, 25 ms and then up to 100 ms between tries (its busy
handler), however soon the other commits. `mailq smtp` and `mailq worker` write to one store from two
processes many times a second, so they would spend most of their waiting asleep after the lock was free.
A process instead takes an exclusive flock of the lock file before it begins a write transaction and
drops it once the transaction ended: the kernel wakes a waiting process as the lock is dropped, and SQLite
then finds the database free. The kernel drops the flock of a process that dies, so a crash leaves
nothing held. Writers that do not take the lock (an older mailq, the sqlite3 shell) still meet SQLite's
own busy handling.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ...errors import StoreUnusable
from .files import PRIVATE_FILE

WRITER_SUFFIX = "-writer"


class WriterLock:
    """The exclusive flock a process holds from the beginning of a write transaction to its end. The
    threads of a process take turns before they take it (the store's turn), so one descriptor serves
    them all."""

    __slots__ = ("path", "_descriptor")

    def __init__(self, database: Path) -> None:
        self.path = database.with_name(database.name + WRITER_SUFFIX)
        self._descriptor: int | None = None

    def acquire(self) -> None:
        try:
            if self._descriptor is None:
                # Made at the first write, not at open: opening a store writes nothing.
                self._descriptor = os.open(self.path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE)
                os.fchmod(self._descriptor, PRIVATE_FILE)
            fcntl.flock(self._descriptor, fcntl.LOCK_EX)
        except OSError as error:
            raise StoreUnusable(f"cannot take the writers' lock {self.path}: {error.strerror}") from error

    def release(self) -> None:
        assert self._descriptor is not None
        fcntl.flock(self._descriptor, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None
