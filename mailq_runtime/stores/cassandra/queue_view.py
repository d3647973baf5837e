"""Records 31 and 32 on Cassandra: one small DAO a table as in James (`EnqueuedMailsDAO`,
`DeletedMailsDAO`, one `SliceStartDAO` for browse_start and content_start, plus the per-slice counters
and the queue list), behind `CassandraQueueView`, which has the methods of the embedded store's view.

Every method commits on its own; the order of the writes is what keeps a crash harmless:

- insert: the slice counter first, then the row. The counter rows are what list a queue's slices and
  buckets (size, browse, clean-up), so no row sits in a bucket that nothing lists; a crash in between
  only counts one mail too many, which `recount` repairs.
- mark_deleted (remove, clear, reject): a lightweight transaction (INSERT ... IF NOT EXISTS) marks the
  mail, and only the call whose insert applied counts the deletion, so an operator's removal racing
  another counts each mail once. A crash between the mark and the count leaves the deleted counter one
  short, which `recount` repairs.
- mark_done (a consumer's done(), the hot path): a plain, idempotent INSERT marks the mail, then the
  deleted counter counts it, in one counter batch with its destination counts' changes
  (destinations.py): one request, each partition applied on its own; no lightweight transaction. Two
  settlements of one mail at once (a lease that expired while its consumer still worked, a done()
  racing a remove) count it twice, as may the batch's retry after a node's failure (store.py's
  `count_all`); a crash (or a failed write) between the mark and the count leaves it uncounted. Either
  leaves the slice's counter wrong by one, which `recount` repairs.
- recount: a slice's counters against its rows and marks, corrected by adding the difference (a
  counter cannot be set). The writers' orders make every in-flight operation err on one side only: an
  insert counts before its row lands, a done() marks before it counts. So `enqueued` is read after the
  rows and `deleted` before the marks, and the slice is looked at twice, RECOUNT_SETTLE apart: an
  operation in flight at one look has landed by the other, and each counter is corrected by the
  smaller of its two errors, which is the crash's (or the double count's) unless both looks met an
  operation in flight; a correction too large then shows as an error of the other sign at the next
  recount, which corrects it.
- create_queue: a lightweight transaction (INSERT ... IF NOT EXISTS) creates the queue row with the
  slice it starts at, and every creator then writes that slice as both starts. Without it, two
  processes creating one queue a slice apart would leave browse_start on the later slice, past the
  mails the other enqueued.
- browse_start and content_start only move forward, with no transaction: each value is written with
  itself as the write timestamp, so whatever the order of two racing writers, the larger value wins.
- reschedule is an UPDATE, which in Cassandra creates the row when it is gone: one that lands after the
  clean-up deleted its row leaves a row holding next_delivery alone, which every read ignores (a mail's
  row always has its enqueued_time).
- delete_slices: the deletion marks and the rows first, the counters last, so a retry after a failure
  still finds the slices to delete. Cassandra cannot reset a counter: one deleted here and incremented
  again (by a writer lagging behind browse_start, or a done() arriving after the clean-up of a removed
  mail) comes back with its old value plus the increment. Such a slice lies behind browse_start, where
  neither size nor browse reads; the pipeline's recount reports it.

Unlike the embedded view, mark_deleted takes the mail's bucket: the counters are kept per slice and
bucket, which is how the reads find the buckets that hold mails whatever bucketCount a process read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from ..records import DestinationCount, EnqueuedMail, SliceSize
from .destinations import COUNT, count_parameters
from .store import CassandraStore

_FIELDS = (
    "queue, slice_start, bucket, enqueue_id, enqueued_time, next_delivery, priority, name, sender, "
    "recipients, header_blob_id, body_blob_id, metadata"
)
# Marks read with one IN query, so a slice of thousands of mails costs tens of requests, not thousands.
_IN_CHUNK = 100
_COUNT_DELETED = (
    "UPDATE slice_counters SET deleted = deleted + 1 WHERE queue = ? AND slice_start = ? AND bucket = ?"
)
# Seconds between a recount's two looks at a slice: longer than any gap between an operation's two
# writes (the next statement of the same call), so that one in flight at the first look has landed.
RECOUNT_SETTLE = 1.0


class SliceBucket(NamedTuple):
    """A partition of enqueued_mails, and a row of the slice counters."""

    slice_start: int
    bucket: int


class SliceCounts(NamedTuple):
    enqueued: int
    deleted: int


def _chunks(items: list, size: int = _IN_CHUNK) -> Iterable[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class QueuesDAO:
    def __init__(self, store: CassandraStore) -> None:
        self.store = store

    def create(self, queue: str, slice_start: int, now: int) -> int:
        """Create the queue starting at `slice_start` unless it exists; the slice it starts at."""
        row = self.store.applied(
            "INSERT INTO queues (queue, created_at, first_slice_start) VALUES (?, ?, ?) IF NOT EXISTS",
            (queue, now, slice_start),
        )
        return slice_start if row.applied else row.first_slice_start

    def first_slice_start(self, queue: str) -> int | None:
        row = self.store.execute("SELECT first_slice_start FROM queues WHERE queue = ?", (queue,)).one()
        return None if row is None else row.first_slice_start

    def names(self) -> list[str]:
        return sorted(row.queue for row in self.store.execute("SELECT queue FROM queues"))

    def exists(self, queue: str) -> bool:
        return self.store.execute("SELECT queue FROM queues WHERE queue = ?", (queue,)).one() is not None


class EnqueuedMailsDAO:
    def __init__(self, store: CassandraStore) -> None:
        self.store = store

    def insert(self, mail: EnqueuedMail) -> None:
        self.store.execute(
            f"INSERT INTO enqueued_mails ({_FIELDS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            mail.row(),
        )

    def read(self, queue: str, slices: list[SliceBucket]) -> list[EnqueuedMail]:
        """The mails of these (slice, bucket) partitions, partition by partition in enqueue id order."""
        results = self.store.execute_all(
            f"SELECT {_FIELDS} FROM enqueued_mails WHERE queue = ? AND slice_start = ? AND bucket = ?",
            [(queue, slice_start, bucket) for slice_start, bucket in slices],
        )
        return [
            EnqueuedMail.from_row(tuple(row))
            for rows in results
            for row in rows
            if row.enqueued_time is not None
        ]

    def exists(self, mail: EnqueuedMail):
        """A future whose result has a row if the mail's row is there (complete or not)."""
        return self.store.execute_async(
            "SELECT enqueued_time FROM enqueued_mails "
            "WHERE queue = ? AND slice_start = ? AND bucket = ? AND enqueue_id = ?",
            (mail.queue, mail.slice_start, mail.bucket, mail.enqueue_id),
        )

    def set_next_delivery(self, mails: Iterable[EnqueuedMail], next_delivery: int) -> None:
        self.store.execute_all(
            "UPDATE enqueued_mails SET next_delivery = ? "
            "WHERE queue = ? AND slice_start = ? AND bucket = ? AND enqueue_id = ?",
            [(next_delivery, m.queue, m.slice_start, m.bucket, m.enqueue_id) for m in mails],
        )

    def delete(self, queue: str, slices: list[SliceBucket]) -> None:
        self.store.execute_all(
            "DELETE FROM enqueued_mails WHERE queue = ? AND slice_start = ? AND bucket = ?",
            [(queue, slice_start, bucket) for slice_start, bucket in slices],
        )


class DeletedMailsDAO:
    def __init__(self, store: CassandraStore) -> None:
        self.store = store

    def mark(self, queue: str, enqueue_id: str) -> bool:
        """True if this call marked the mail, False if it was marked already."""
        return self.store.applied(
            "INSERT INTO deleted_mails (queue, enqueue_id) VALUES (?, ?) IF NOT EXISTS", (queue, enqueue_id)
        ).applied

    def put(self, queue: str, enqueue_id: str) -> None:
        """Mark the mail, whether it was marked or not: an idempotent write."""
        self.store.execute("INSERT INTO deleted_mails (queue, enqueue_id) VALUES (?, ?)", (queue, enqueue_id))

    def is_marked(self, queue: str, enqueue_id: str):
        """A future whose result has a row if the mail is marked."""
        return self.store.execute_async(
            "SELECT enqueue_id FROM deleted_mails WHERE queue = ? AND enqueue_id = ?", (queue, enqueue_id)
        )

    def marked(self, queue: str, enqueue_ids: list[str]) -> set[str]:
        results = self.store.execute_all(
            "SELECT enqueue_id FROM deleted_mails WHERE queue = ? AND enqueue_id IN ?",
            [(queue, chunk) for chunk in _chunks(enqueue_ids)],
        )
        return {row.enqueue_id for rows in results for row in rows}

    def unmark(self, queue: str, enqueue_ids: list[str]) -> None:
        self.store.execute_all(
            "DELETE FROM deleted_mails WHERE queue = ? AND enqueue_id IN ?",
            [(queue, chunk) for chunk in _chunks(enqueue_ids)],
        )


class SliceCountersDAO:
    def __init__(self, store: CassandraStore) -> None:
        self.store = store

    def count_enqueued(self, queue: str, slice_start: int, bucket: int) -> None:
        self.store.execute(
            "UPDATE slice_counters SET enqueued = enqueued + 1 "
            "WHERE queue = ? AND slice_start = ? AND bucket = ?",
            (queue, slice_start, bucket),
        )

    def count_deleted(
        self, queue: str, slice_start: int, bucket: int, destinations: Sequence[DestinationCount] = ()
    ) -> None:
        """Count one deletion in the slice's bucket, and the destination counts' changes with it in one
        counter batch (see the module's docstring)."""
        counted = (queue, slice_start, bucket)
        if not destinations:
            self.store.execute(_COUNT_DELETED, counted)
            return
        self.store.count_all(
            [(_COUNT_DELETED, counted)]
            + [(COUNT, count_parameters(queue, change)) for change in destinations]
        )

    def correct(self, queue: str, slice_start: int, bucket: int, enqueued: int, deleted: int) -> None:
        """Add `enqueued` and `deleted` (either may be negative) to the counters of a slice's bucket."""
        self.store.execute(
            "UPDATE slice_counters SET enqueued = enqueued + ?, deleted = deleted + ? "
            "WHERE queue = ? AND slice_start = ? AND bucket = ?",
            (enqueued, deleted, queue, slice_start, bucket),
        )

    def of_slice(self, queue: str, slice_start: int) -> dict[int, SliceCounts]:
        """The counts of one slice, by bucket."""
        rows = self.store.execute(
            "SELECT bucket, enqueued, deleted FROM slice_counters WHERE queue = ? AND slice_start = ?",
            (queue, slice_start),
        )
        return {row.bucket: SliceCounts(row.enqueued or 0, row.deleted or 0) for row in rows}

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
        return [SliceBucket(row.slice_start, row.bucket) for row in rows]

    def delete(self, queue: str, start: int, end: int) -> None:
        self.store.execute(
            "DELETE FROM slice_counters WHERE queue = ? AND slice_start >= ? AND slice_start < ?",
            (queue, start, end),
        )


class SliceStartDAO:
    """browse_start or content_start: one value a queue that only moves forward (see the module's
    docstring for the write timestamp), the queue's first slice until one is written."""

    def __init__(self, store: CassandraStore, table: str, queues: QueuesDAO) -> None:
        self.store = store
        self.queues = queues
        self.read_cql = f"SELECT {table} FROM {table} WHERE queue = ?"
        self.write_cql = f"INSERT INTO {table} (queue, {table}) VALUES (?, ?) USING TIMESTAMP ?"

    def get(self, queue: str) -> int:
        return self.value(queue, self.store.execute(self.read_cql, (queue,)))

    def get_async(self, queue: str):
        return self.store.execute_async(self.read_cql, (queue,))

    def value(self, queue: str, rows) -> int:
        """The value of the rows `get_async` read."""
        row = rows.one()
        # Missing only between the queue's creation and its first write of the starts.
        return self.queues.first_slice_start(queue) if row is None else row[0]

    def set(self, queue: str, value: int) -> None:
        self.store.execute(self.write_cql, (queue, value, value))


class CassandraQueueView:
    def __init__(self, store: CassandraStore) -> None:
        self.queues = QueuesDAO(store)
        self.enqueued_mails = EnqueuedMailsDAO(store)
        self.deleted_mails = DeletedMailsDAO(store)
        self.slice_counters = SliceCountersDAO(store)
        self.browse_starts = SliceStartDAO(store, "browse_start", self.queues)
        self.content_starts = SliceStartDAO(store, "content_start", self.queues)

    # queues
    def create_queue(self, queue: str, slice_start: int, now: int) -> None:
        # Every creator writes the starts of the one creation that won, so a creator that crashed
        # before writing them leaves nothing wrong: until written, they read as that first slice.
        first = self.queues.create(queue, slice_start, now)
        self.browse_starts.set(queue, first)
        self.content_starts.set(queue, first)

    def queue_names(self) -> list[str]:
        return self.queues.names()

    def queue_exists(self, queue: str) -> bool:
        return self.queues.exists(queue)

    # enqueued_mails and deleted_mails
    def insert(self, mail: EnqueuedMail) -> None:
        self.slice_counters.count_enqueued(mail.queue, mail.slice_start, mail.bucket)
        self.enqueued_mails.insert(mail)

    def insert_many(self, mails: Sequence[EnqueuedMail]) -> None:
        for mail in mails:
            self.insert(mail)

    def mark_deleted(self, queue: str, enqueue_id: str, slice_start: int, bucket: int) -> bool:
        """Record the mail as deleted; True only the first time, so counters count each mail once."""
        if not self.deleted_mails.mark(queue, enqueue_id):
            return False
        self.slice_counters.count_deleted(queue, slice_start, bucket)
        return True

    def mark_done(
        self,
        queue: str,
        enqueue_id: str,
        slice_start: int,
        bucket: int,
        after_mark: Callable[[], None],
        destinations: Sequence[DestinationCount] = (),
    ) -> None:
        """Record a delivered mail as deleted and count it, in its slice and by `destinations`, with no
        transaction (see the module's docstring); `after_mark` runs between the two writes (the fault
        seam)."""
        self.deleted_mails.put(queue, enqueue_id)
        after_mark()
        self.slice_counters.count_deleted(queue, slice_start, bucket, destinations)

    def recount(self, queue: str, slice_start: int) -> int:
        """Correct the slice's counters from its rows and marks (see the module's docstring); returns the
        sum of the corrections' sizes, 0 when the counters were right."""
        first = self._errors(queue, slice_start)
        if not any(enqueued or deleted for enqueued, deleted in first.values()):
            return 0
        time.sleep(RECOUNT_SETTLE)
        second = self._errors(queue, slice_start)
        corrected = 0
        for bucket in first.keys() & second.keys():
            (enqueued_1, deleted_1), (enqueued_2, deleted_2) = first[bucket], second[bucket]
            # In flight, an insert makes `enqueued` count too many and a done() `deleted` too few: the
            # true error is at most the smaller `enqueued` error, at least the larger `deleted` one.
            enqueued = min(enqueued_1, enqueued_2)
            deleted = max(deleted_1, deleted_2)
            if enqueued or deleted:
                self.slice_counters.correct(queue, slice_start, bucket, -enqueued, -deleted)
                corrected += abs(enqueued) + abs(deleted)
        return corrected

    def _errors(self, queue: str, slice_start: int) -> dict[int, SliceCounts]:
        """The counts counted minus found, by bucket. `deleted` is read before the marks and
        `enqueued` after the rows, so an operation in flight errs on one side only."""
        before = self.slice_counters.of_slice(queue, slice_start)
        mails = self.enqueued_mails.read(queue, [SliceBucket(slice_start, bucket) for bucket in before])
        marked = self.deleted_mails.marked(queue, [mail.enqueue_id for mail in mails])
        after = self.slice_counters.of_slice(queue, slice_start)
        rows = dict.fromkeys(before, 0)
        marks = dict.fromkeys(before, 0)
        for mail in mails:
            rows[mail.bucket] += 1
            marks[mail.bucket] += mail.enqueue_id in marked
        return {
            bucket: SliceCounts(
                after.get(bucket, before[bucket]).enqueued - rows[bucket],
                before[bucket].deleted - marks[bucket],
            )
            for bucket in before
        }

    def is_live(self, mail: EnqueuedMail, current_slice: int | None = None) -> bool:
        """From browse_start on, a mail is live unless marked in deleted_mails. Behind browse_start, the
        clean-up drops a deleted mail's mark with its row, so there only a complete row still present
        and unmarked is live. Two reads at once, a third behind browse_start; one, the mark, for a mail
        from `current_slice` on, which browse_start cannot be past."""
        marked = self.deleted_mails.is_marked(mail.queue, mail.enqueue_id)
        if current_slice is not None and mail.slice_start >= current_slice:
            return marked.result().one() is None
        browse_start = self.browse_starts.get_async(mail.queue)
        if marked.result().one() is not None:
            return False
        if mail.slice_start >= self.browse_starts.value(mail.queue, browse_start.result()):
            return True
        row = self.enqueued_mails.exists(mail).result().one()
        return row is not None and row.enqueued_time is not None

    def slices_from(self, queue: str, start: int) -> list[int]:
        """Slice starts holding mails, from `start` on."""
        return sorted({row.slice_start for row in self.slice_counters.rows_from(queue, start)})

    def live_mails(self, queue: str, slice_start: int) -> list[EnqueuedMail]:
        """The slice's mails not in deleted_mails, in enqueue order (every bucket that holds mails)."""
        mails = self.enqueued_mails.read(
            queue, self.slice_counters.buckets(queue, slice_start, slice_start + 1)
        )
        marked = self.deleted_mails.marked(queue, [mail.enqueue_id for mail in mails])
        live = [mail for mail in mails if mail.enqueue_id not in marked]
        return sorted(live, key=lambda mail: (mail.enqueued_time, mail.enqueue_id))

    def reschedule(self, mails: Iterable[EnqueuedMail], next_delivery: int) -> None:
        """Record the time the broker will next deliver each of `mails` (a flush, a retry's delay)."""
        self.enqueued_mails.set_next_delivery(mails, next_delivery)

    def size(self, queue: str, start: int) -> int:
        return sum(
            (row.enqueued or 0) - (row.deleted or 0) for row in self.slice_counters.rows_from(queue, start)
        )

    def slice_sizes(self, queue: str, start: int) -> list[SliceSize]:
        sizes: dict[int, int] = {}
        for row in self.slice_counters.rows_from(queue, start):
            sizes[row.slice_start] = sizes.get(row.slice_start, 0) + (row.enqueued or 0) - (row.deleted or 0)
        return [SliceSize(*item) for item in sorted(sizes.items())]

    # browse_start / content_start
    def browse_start(self, queue: str) -> int:
        return self.browse_starts.get(queue)

    def content_start(self, queue: str) -> int:
        return self.content_starts.get(queue)

    def advance_browse_start(self, queue: str, new_start: int) -> bool:
        """Move browse_start forward to `new_start`; True if it was behind (a racing writer may have moved
        it as well: the larger value stays)."""
        if self.browse_starts.get(queue) >= new_start:
            return False
        self.browse_starts.set(queue, new_start)
        return True

    def mails_before(self, queue: str, start: int, end: int) -> list[str]:
        """Enqueue ids of every mail (deleted or not) in the slices [start, end)."""
        mails = self.enqueued_mails.read(queue, self.slice_counters.buckets(queue, start, end))
        return [mail.enqueue_id for mail in mails]

    def delete_slices(self, queue: str, start: int, end: int) -> int:
        """Record 32: drop the rows of slices [start, end) from enqueued_mails, deleted_mails and counters."""
        slices = self.slice_counters.buckets(queue, start, end)
        mails = self.enqueued_mails.read(queue, slices)
        self.deleted_mails.unmark(queue, [mail.enqueue_id for mail in mails])
        self.enqueued_mails.delete(queue, slices)
        self.slice_counters.delete(queue, start, end)
        return len(mails)

    def advance_content_start(self, queue: str, new_start: int) -> None:
        self.content_starts.set(queue, new_start)
