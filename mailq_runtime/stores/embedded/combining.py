"""Combining, in the embedded store's turn: a thread that finds another holding the turn for the same kind
of operation (`in_turn`) hands its operation over instead of waiting for the turn, and the holder runs it
in its own turn, in a savepoint of its own as a member of the group. A group then costs one handover of
the turn instead of one per thread, and the threads that handed over wait blocked rather than running
Python beside the holder's statements (each of them would take the GIL from it while SQLite runs).
`in_group` goes one step further for operations that can be written together (enqueues): the holder
writes those handed over in one call, one statement a table for the group, and each alone only if that
call fails.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, NoReturn, Protocol, TypeVar

from ...errors import StoreUnusable
from .groups import GROUP_LIMIT, Group

T = TypeVar("T")
# `in_group`'s writer: the results of its items, in order.
Write = Callable[[list[Any]], list[Any]]


class Turn(Protocol):
    """The store's turn, reentrant, and whether the calling thread holds it."""

    def held(self) -> bool: ...
    def __enter__(self) -> object: ...
    def __exit__(self, *exception: object) -> object: ...


class CombinedStore(Protocol):
    """What the hand-over takes of the store (store.EmbeddedStore): its turn, a transaction for a member,
    the group a write joins now, and how the group's failure is raised."""

    def turn(self) -> Turn: ...
    def transaction(self) -> AbstractContextManager: ...
    @property
    def open_group(self) -> Group | None: ...
    def raise_failure(self, error: sqlite3.Error | OSError) -> NoReturn: ...


class Task:
    """One operation handed to the holder of the turn, and its outcome."""

    __slots__ = ("operation", "result", "error", "group", "done", "handed_back", "item", "write")

    done: threading.Event  # set by the holder: made only for an operation handed over

    def __init__(self, operation: Callable[[], Any], item: Any = None, write: Write | None = None) -> None:
        self.operation = operation
        self.item = item
        self.write = write
        self.result: Any = None
        self.error: BaseException | None = None
        self.group: Group | None = None
        self.handed_back = False

    def perform(self, store: CombinedStore) -> None:
        try:
            self.result = self.operation()
            # The group its writes joined: should it fail to commit, or be rolled back by a later member's
            # failure, these writes are lost with it.
            self.group = store.open_group
        except BaseException as error:
            self.error = error

    def outcome(self, store: CombinedStore) -> Any:
        if self.error is None and self.group is not None and self.group.error is not None:
            store.raise_failure(self.group.error)
        if self.error is not None:
            raise self.error
        return self.result


class Combiner:
    """`in_turn`'s hand-over: the operations of the threads that came while a holder ran, in order."""

    __slots__ = ("store", "_lock", "_pending", "_active")

    def __init__(self, store: CombinedStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._pending: deque[Task] = deque()
        self._active = False

    def run(self, operation: Callable[[], T], item: Any = None, write: Write | None = None) -> T:
        if self.store.turn().held():
            # Called from inside this thread's turn: handing it over could wait for a holder that waits
            # for this very turn.
            return operation()
        with self._lock:
            handed = self._active
            if handed:
                task = Task(operation, item, write)
                task.done = threading.Event()
                self._pending.append(task)
            else:
                self._active = True
        if not handed:
            return self._hold(operation, item, write)
        task.done.wait()
        if task.handed_back:  # the holder reached the group limit: this one takes its own turn
            return self.run(operation, item, write)
        return task.outcome(self.store)

    def _hold(self, operation: Callable[[], T], item: Any, write: Write | None) -> T:
        store = self.store
        own = Task(operation, item, write)
        served: list[Task] = []
        turn = store.turn()
        turn.__enter__()
        try:
            self._perform([own])
            while True:
                with self._lock:
                    if not self._pending:
                        self._active = False
                        break
                    if len(served) >= GROUP_LIMIT:
                        rest, self._pending, self._active = self._pending, deque(), False
                        for task in rest:
                            task.handed_back = True
                            task.done.set()
                        break
                    taken = [
                        self._pending.popleft()
                        for _ in range(min(len(self._pending), GROUP_LIMIT - len(served)))
                    ]
                served.extend(taken)
                self._perform(taken)
        finally:
            try:
                turn.__exit__(None, None, None)
            except (sqlite3.Error, StoreUnusable):
                pass  # the group's failed commit, recorded in the group each task checks
            for task in served:
                task.done.set()
        return own.outcome(store)

    def _perform(self, tasks: list[Task]) -> None:
        """Run the operations, those of an equal `write` together."""
        writes: dict[Write, list[Task]] = {}
        for task in tasks:
            if task.write is None:
                task.perform(self.store)
            else:
                writes.setdefault(task.write, []).append(task)
        for batch in writes.values():
            self._write_batch(batch)

    def _write_batch(self, batch: list[Task]) -> None:
        store = self.store
        if len(batch) > 1:
            write = batch[0].write
            assert write is not None
            try:
                # A member of the group as one operation is: undone alone should it fail.
                with store.transaction():
                    results = write([task.item for task in batch])
            except Exception:
                pass  # each is written alone below, and gets its own outcome
            else:
                for task, result in zip(batch, results, strict=True):
                    task.result = result
                    task.group = store.open_group
                return
        for task in batch:
            task.perform(store)
