"""Counts that a lost reply cannot break: each process (each `CassandraStore`, its `writer` id) keeps
its own share of every count in memory and writes it whole, as an absolute value, with a plain INSERT.
Readers sum the shares of every writer.

A Cassandra counter update adds: one sent again after its reply was lost (the driver's timeout, a
coordinator's, a retry policy's) counts twice. A share written whole is the same value however often it
arrives, so every write of a share may be retried freely (store.py retries it after a timeout). Its
write timestamp is the writer's own clock made strictly increasing, and each write carries the share as
it stood when the timestamp was taken (both under one lock), so of two writes of one share that arrive
out of order the later value wins.

A share whose write failed is remembered and written again with the writer's next write of any share
(and by `flush`), so one failed write costs nothing once the store answers again. What a share cannot
know is whether the fact it counts (a mail's row, a deletion mark) was written when that write failed
or the process died between the two: the queue view's recount heals that from the facts
(queue_view.py), the mailbox and destination counts their own recounts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple, Protocol


class Statement(NamedTuple):
    cql: str
    parameters: tuple


class Writes(Protocol):
    """What the tallies need of the store: its writes, in one request."""

    def write_all(self, statements: Sequence[Statement]) -> None: ...


class Tally:
    """One table's shares of this writer: a row per (key, writer) holding `values` (bigint columns)."""

    def __init__(self, table: str, keys: Sequence[str], values: Sequence[str]) -> None:
        columns = (*keys, "writer", *values)
        self.width = len(values)
        self.cql = (
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}) "
            "USING TIMESTAMP ?"
        )
        self.shares: dict[tuple, list[int]] = {}


class Change(NamedTuple):
    tally: Tally
    key: tuple
    deltas: tuple[int, ...]


class Tallies:
    """Every share of one writer, with the one lock and clock that order its writes."""

    def __init__(self, store: Writes, writer: str) -> None:
        self.store = store
        self.writer = writer
        self._lock = threading.Lock()
        self._last_timestamp = 0
        self._dirty: set[tuple[Tally, tuple]] = set()
        self._tallies: dict[str, Tally] = {}

    def tally(self, table: str, keys: Sequence[str], values: Sequence[str]) -> Tally:
        """The writer's shares in `table`, one `Tally` a table whichever DAO asks."""
        with self._lock:
            tally = self._tallies.get(table)
            if tally is None:
                tally = self._tallies[table] = Tally(table, keys, values)
            return tally

    def add(self, changes: Iterable[Change]) -> None:
        """Add the changes to this writer's shares and write each changed share whole, with the shares
        whose last write failed, in one request. On a failure the changed shares stay added and wait for
        the next write; the failure is raised."""
        with self._lock:
            touched = set(self._dirty)
            for tally, key, deltas in changes:
                share = tally.shares.setdefault(key, [0] * tally.width)
                for index, delta in enumerate(deltas):
                    share[index] += delta
                touched.add((tally, key))
            self._dirty.clear()
            statements = [self._statement(tally, key) for tally, key in touched]
        self._write(touched, statements)

    def take_back(self, changes: Iterable[Change]) -> None:
        """Undo changes whose fact was never written (the write of the shares failed before it): taken
        off the shares, written with the next write."""
        with self._lock:
            for tally, key, deltas in changes:
                share = tally.shares.setdefault(key, [0] * tally.width)
                for index, delta in enumerate(deltas):
                    share[index] -= delta
                self._dirty.add((tally, key))

    def flush(self) -> None:
        """Write again the shares whose last write failed."""
        self.add(())

    def forget(self, tally: Tally, forgotten: Callable[[tuple], bool]) -> None:
        """Drop the shares whose key is `forgotten`: never to be written again (queue_view.py's folded
        epochs, a deleted mailbox's)."""
        with self._lock:
            for key in [key for key in tally.shares if forgotten(key)]:
                del tally.shares[key]
                self._dirty.discard((tally, key))

    def _statement(self, tally: Tally, key: tuple) -> Statement:
        self._last_timestamp = max(time.time_ns() // 1000, self._last_timestamp + 1)
        return Statement(tally.cql, (*key, self.writer, *tally.shares[key], self._last_timestamp))

    def _write(self, touched: set[tuple[Tally, tuple]], statements: list[Statement]) -> None:
        if not statements:
            return
        try:
            self.store.write_all(statements)
        except BaseException:
            with self._lock:
                self._dirty |= {item for item in touched if item[1] in item[0].shares}
            raise
