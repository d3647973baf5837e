"""The per-slice counts on Cassandra (slice_counters): each writer's share of a (slice, bucket) and epoch
(tallies.py), and a bucket's folded row, which the queue view's recount writes from the rows and marks
of the settled epochs (queue_view.py's docstring has the design)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import NamedTuple

from ...clock import MICROS_PER_SECOND
from .store import CassandraStore
from .tallies import Change

# Seconds of a share's epoch: a writer writes a share an epoch and a (slice, bucket) it counts in.
EPOCH = 10.0
# Seconds after its end when an epoch is settled, and folded: longer than an insert or a deletion takes
# from its `counted_at` to its last write on a cluster that answers (each write is bounded by the
# request timeout; a slower one is healed by the next fold).
SETTLE = 30.0
# The epoch of a slice's folded row, before every epoch.
FOLDED = -1
# The write timestamp of a fold's deletion of shares: larger than any clock's, so that no share of a
# folded epoch, however late it is written, comes back.
_NEVER = 2**62
# How many shares a writer keeps before it forgets those of settled epochs, folded or not (a share
# written after the fold of its epoch is deleted at once anyway).
_SHARES_KEPT = 4096


def now_micros() -> int:
    """The writer's clock: the shares' epochs and the folds' are read on it, whatever the queue's."""
    return time.time_ns() // 1000


def epoch_of(at: int) -> int:
    length = int(EPOCH * MICROS_PER_SECOND)
    return at - at % length


def settled_before(now: int) -> int:
    """The start of the first epoch not yet settled at `now`."""
    return epoch_of(now - int(SETTLE * MICROS_PER_SECOND))


class SliceBucket(NamedTuple):
    """A partition of enqueued_mails, and a row of the slice counters."""

    slice_start: int
    bucket: int


class Counted(NamedTuple):
    """One row of the slice counts: a writer's share of an epoch, or a bucket's folded row."""

    bucket: int
    epoch: int
    enqueued: int
    deleted: int


class SliceCountersDAO:
    def __init__(self, store: CassandraStore) -> None:
        self.store = store
        self.tally = store.tallies.tally(
            "slice_counters", ("queue", "slice_start", "bucket", "epoch"), ("enqueued", "deleted")
        )

    def counting(
        self, queue: str, slice_start: int, bucket: int, counted_at: int, enqueued: int = 0, deleted: int = 0
    ) -> Change:
        """The change of this writer's share of the epoch of `counted_at`."""
        return Change(self.tally, (queue, slice_start, bucket, epoch_of(counted_at)), (enqueued, deleted))

    def count(self, changes: Sequence[Change]) -> None:
        if len(self.tally.shares) > _SHARES_KEPT:
            settled = settled_before(now_micros())
            self.store.tallies.forget(self.tally, lambda key: key[3] < settled)
        self.store.tallies.add(changes)

    def of_slice(self, queue: str, slice_start: int) -> list[Counted]:
        rows = self.store.execute(
            "SELECT bucket, epoch, enqueued, deleted FROM slice_counters WHERE queue = ? AND slice_start = ?",
            (queue, slice_start),
        )
        return [Counted(row.bucket, row.epoch, row.enqueued or 0, row.deleted or 0) for row in rows]

    def fold(
        self, queue: str, slice_start: int, bucket: int, settled: int, enqueued: int, deleted: int
    ) -> None:
        """Replace the shares of the bucket's epochs before `settled` with its folded row (see the
        module's docstring), in one single-partition batch."""
        self.store.write_all(
            [
                (
                    "INSERT INTO slice_counters (queue, slice_start, bucket, epoch, writer, enqueued, "
                    "deleted) VALUES (?, ?, ?, ?, '', ?, ?) USING TIMESTAMP ?",
                    (queue, slice_start, bucket, FOLDED, enqueued, deleted, settled),
                ),
                (
                    "DELETE FROM slice_counters USING TIMESTAMP ? WHERE queue = ? AND slice_start = ? "
                    "AND bucket = ? AND epoch > ? AND epoch < ?",
                    (_NEVER, queue, slice_start, bucket, FOLDED, settled),
                ),
            ]
        )
        self.store.tallies.forget(
            self.tally, lambda key: key[:3] == (queue, slice_start, bucket) and key[3] < settled
        )

    def rows_from(self, queue: str, start: int) -> list:
        return list(
            self.store.execute(
                "SELECT slice_start, bucket, enqueued, deleted FROM slice_counters "
                "WHERE queue = ? AND slice_start >= ?",
                (queue, start),
            )
        )

    def buckets(self, queue: str, start: int, end: int) -> list[SliceBucket]:
        """The buckets counted in the slices [start, end)."""
        rows = self.store.execute(
            "SELECT slice_start, bucket FROM slice_counters "
            "WHERE queue = ? AND slice_start >= ? AND slice_start < ?",
            (queue, start, end),
        )
        return sorted({SliceBucket(row.slice_start, row.bucket) for row in rows})

    def delete(self, queue: str, start: int, end: int) -> None:
        self.store.execute(
            "DELETE FROM slice_counters WHERE queue = ? AND slice_start >= ? AND slice_start < ?",
            (queue, start, end),
        )
