"""One read shared by the callers that want it at once, each served by a read that started after it asked:
as fresh as a read of its own, one request for the crowd (the saves of concurrent enqueues and their
reference generation, a request each on Cassandra)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class _Round(Generic[T]):
    """The callers one read serves, and what it gave them."""

    __slots__ = ("done", "result", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: T | None = None
        self.error: BaseException | None = None


class SharedRead(Generic[T]):
    """`read()` for concurrent callers. A caller arriving while no read is under way reads at once; those
    arriving while one is under way wait for it to end, then share the next one, which the first of them
    makes: no caller gets a value read before it asked, so a value that may only move forward (a
    generation) is never older than the caller's own read would have been."""

    def __init__(self, read: Callable[[], T]) -> None:
        self._read = read
        self._lock = threading.Condition(threading.Lock())
        self._reading = False  # a read is under way
        self._gathering: _Round[T] | None = None  # the callers waiting for the next read

    def __call__(self) -> T:
        with self._lock:
            joined = self._gathering
            if joined is None:
                joined = self._gathering = _Round()
                while self._reading:  # the first of this round waits for the read under way, then makes it
                    self._lock.wait()
                self._reading = True
                self._gathering = None  # whoever asks from now on asked after this read began
                leads = True
            else:
                leads = False
        if leads:
            try:
                joined.result = self._read()
            except BaseException as error:  # every caller of the round gets the failure it would have had
                joined.error = error
            finally:
                with self._lock:
                    self._reading = False
                    self._lock.notify_all()
                joined.done.set()
        else:
            joined.done.wait()
        if joined.error is not None:
            raise joined.error
        return joined.result  # type: ignore[return-value]
