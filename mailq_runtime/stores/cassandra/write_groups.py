"""Group commit for the hot path's writes on Cassandra: the concurrent callers of one kind of write (the
deletion marks of done(), their counts, a release's deletions and references' removal) share a request.

A request costs the client and the server about the same whatever it carries (docs/benchmarks.md), so
consumers settling mails at once write their marks in one request, their counts in one, and so on, as
the embedded store's group commit shares a sync. Each caller still waits for the request that carries
its write and gets its outcome, so every write path keeps its order step by step: a caller's next write
starts only once its previous one is applied. A request that fails fails each of its callers, with the
store's error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

Item = TypeVar("Item")

# The most callers' writes in one request by default: a batch of ten partitions or more loads its
# coordinator (Cassandra warns from ten).
MAX_ITEMS = 8


class _Waiter(Generic[Item]):
    __slots__ = ("item", "woken", "leads", "error", "shares")

    def __init__(self, item: Item) -> None:
        self.item = item
        self.woken = threading.Event()
        self.leads = False  # woken to write the next request, not because its write is done
        self.error: BaseException | None = None
        self.shares = False  # its request was another caller's, which raises the failure itself


class WriteGroup(Generic[Item]):
    """Callers' items written together by `write(items)`, one request at a time: a caller that finds no
    request in flight writes every item waiting (its own first, up to `max_items`); the others wait, and
    the first still waiting when a request ends writes the next one. An item always goes in a request
    started after its caller arrived."""

    def __init__(self, write: Callable[[Sequence[Item]], None], max_items: int = MAX_ITEMS) -> None:
        self._write = write
        self._max_items = max_items
        self._lock = threading.Lock()
        self._waiting: list[_Waiter[Item]] = []
        self._busy = False

    def write(self, item: Item) -> None:
        waiter = _Waiter(item)
        with self._lock:
            self._waiting.append(waiter)
            leads = not self._busy
            self._busy = True
        if not leads:
            waiter.woken.wait()
            if not waiter.leads:
                _raise_for(waiter)
                return
        self._lead()
        _raise_for(waiter)

    def _lead(self) -> None:
        """Write the waiting items (the leader's own is the first), then hand over to the next waiter."""
        with self._lock:
            batch = self._waiting[: self._max_items]
            del self._waiting[: self._max_items]
        error = None
        try:
            self._write([waiter.item for waiter in batch])
        except BaseException as failure:  # every caller of the request gets it, the leader included
            error = failure
        for waiter in batch:
            waiter.error = error
            waiter.leads = False
            waiter.shares = waiter is not batch[0]
        for waiter in batch[1:]:
            waiter.woken.set()
        with self._lock:
            if self._waiting:
                following = self._waiting[0]
                following.leads = True
                following.woken.set()
            else:
                self._busy = False


def _raise_for(waiter: _Waiter) -> None:
    error = waiter.error
    if error is None:
        return
    if not waiter.shares:
        raise error
    # The others raise a copy each, chained as the failure is (to the driver's error), so that the
    # tracebacks of several threads do not mix.
    try:
        copy = type(error)(*error.args)
    except Exception:
        copy = None
    if copy is None:
        raise error
    raise copy from error.__cause__
