"""The embedded store's syncs at durability `fsync`: commits are written under the store's turn, and made
durable after it, by one fdatasync of the WAL file shared by every commit written before it.

SQLite's `synchronous=FULL` syncs the WAL inside COMMIT, so the turn is held through the sync and no other
thread's work overlaps it: a sync costs as much as a whole queue operation, and the store ran at one
group's work plus one sync at a time. The store commits with `synchronous=NORMAL` instead (SQLite then
syncs only around checkpoints, and a WAL reused after one has its header synced: the file never corrupts),
and every turn waits here, without the turn, until its commits are synced before it returns: what
`synchronous=FULL` promises, while the next group works during the sync. The WAL is one file written in
commit order, so one fdatasync makes every commit written before it durable; a thread that finds a sync
under way waits for it, and the next sync covers all the commits written meanwhile.

A failed sync may have lost written pages (Linux drops them and reports the failure once): every commit
not yet synced is lost for its caller, and the store refuses every later turn's wait until it is reopened.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from ...errors import StoreUnusable


class WalSyncs:
    __slots__ = ("path", "written", "synced", "_descriptor", "_syncing", "_failure", "_changed")

    def __init__(self, database: Path) -> None:
        self.path = database.with_name(database.name + "-wal")
        self.written = 0  # commits written to the WAL, counted under the store's turn
        self.synced = 0  # commits known durable
        self._syncing = False
        self._failure: StoreUnusable | None = None
        self._changed = threading.Condition(threading.Lock())
        try:
            # SQLite made the WAL at the store's first read; its directory entry must survive power too.
            self._descriptor = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            directory = os.open(database.parent, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except OSError as error:
            problem = f"cannot open its WAL {self.path}: {error.strerror}"
            raise StoreUnusable(f"mailq store {database}: {problem}") from None

    def wrote(self) -> int:
        """Count a commit just written (under the store's turn); its number, for `wait`."""
        self.written += 1
        return self.written

    def wait(self, commit: int) -> None:
        """Return once commit number `commit` is durable, syncing if no sync under way covers it."""
        if self.synced >= commit and self._failure is None:
            return
        changed = self._changed
        with changed:
            while self.synced < commit or self._failure is not None:
                if self._failure is not None:
                    raise self._failure
                if self._syncing:
                    changed.wait()
                    continue
                self._syncing = True
                covered = self.written
                changed.release()
                try:
                    failure = self._sync()
                finally:
                    changed.acquire()
                    self._syncing = False
                    changed.notify_all()
                if failure is not None:
                    self._failure = failure
                else:
                    self.synced = max(self.synced, covered)

    def _sync(self) -> StoreUnusable | None:
        try:
            os.fdatasync(self._descriptor)
        except OSError as error:
            return StoreUnusable(f"mailq store {self.path}: the sync of its commits failed: {error.strerror}")
        return None

    def close(self) -> None:
        # Idempotent, as closing the store is.
        if self._descriptor >= 0:
            os.close(self._descriptor)
            self._descriptor = -1
