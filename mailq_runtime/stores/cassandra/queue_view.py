"""Records 31 and 32 on Cassandra: one small DAO a table as in James (`EnqueuedMailsDAO`,
`DeletedMailsDAO`, one `SliceStartDAO` for browse_start and content_start, plus the per-slice counts
and the queue list), behind `CassandraQueueView`, which has the methods of the embedded store's view.

The per-slice counts are tallies (tallies.py, slice_counts.py): each writer's share of a (slice,
bucket), written whole with a plain, idempotent INSERT, so no retry of a write whose reply was lost
counts a mail twice. A share counts the mails of one epoch (EPOCH seconds of the writer's clock): the
epoch of `counted_at`, the time the insert or the deletion took before its first write, which its row
or its mark keeps.

Every method commits on its own; the order of the writes is what keeps a crash harmless:

- insert: the share first, then the row. The counts' rows are what list a queue's slices and buckets
  (size, browse, clean-up), so no row sits in a bucket that nothing lists; a crash in between counts
  one mail too many until the recount folds its epoch. A write of the share that fails is taken back
  (the row was never written), and the share is written again with the writer's next write.
- mark_deleted (remove, clear, reject): a lightweight transaction (INSERT ... IF NOT EXISTS) marks the
  mail, and only the call whose insert applied counts the deletion, so an operator's removal racing
  another counts each mail once.
- mark_done (a consumer's done(), the hot path): a plain, idempotent INSERT marks the mail, then the
  deletion is counted, in one unlogged batch with its destination counts' changes (destinations.py): one
  request, no lightweight transaction. A crash between the mark and the count leaves it uncounted; two
  settlements of one mail at once (a lease that expired while its consumer still worked) count it twice:
  both until the recount folds their epochs.
- recount folds the settled epochs of a slice: those that ended SETTLE seconds ago or more, when every
  insert and deletion counted in them has written its row or mark (or died). For each bucket it counts
  the rows and marks whose `counted_at` lies before them and writes that as the bucket's folded row,
  in one single-partition batch (atomic and isolated: a reader sees the shares or the folded row, never
  both) with a range deletion of every share of those epochs, at a write timestamp no write reaches, so
  that a share written late (a process stalled past SETTLE) stays deleted: its mail is in the next
  fold. Facts that no longer move make every fold exact, busy or idle, and two recounts at once write
  the same rows; the folded row is written at its epoch's timestamp, so the later fold wins.
- create_queue: a lightweight transaction (INSERT ... IF NOT EXISTS) creates the queue row with the
  slice it starts at, and every creator then writes that slice as both starts. Without it, two
  processes creating one queue a slice apart would leave browse_start on the later slice, past the
  mails the other enqueued.
- browse_start and content_start only move forward, with no transaction: each value is written with
  itself as the write timestamp, so whatever the order of two racing writers, the larger value wins.
- reschedule is an UPDATE, which in Cassandra creates the row when it is gone: one that lands after the
  clean-up deleted its row leaves a row holding next_delivery alone, which every read ignores (a mail's
  row always has its enqueued_time).
- delete_slices: the deletion marks and the rows first, the counts last, so a retry after a failure
  still finds the slices to delete. A share written after it (a writer lagging behind browse_start, a
  done() arriving after the clean-up of a removed mail) comes back; such a slice lies behind
  browse_start, where neither size nor browse reads; the pipeline's recount reports it.

Unlike the embedded view, mark_deleted takes the mail's bucket: the counts are kept per slice and
bucket, which is how the reads find the buckets that hold mails whatever bucketCount a process read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from ..records import DestinationCount, EnqueuedMail, SliceSize
from .destinations import destination_changes
from .slice_counts import FOLDED, SliceBucket, SliceCountersDAO, now_micros, settled_before
from .store import CassandraStore

_FIELDS = (
    "queue, slice_start, bucket, enqueue_id, enqueued_time, next_delivery, priority, name, sender, "
    "recipients, header_blob_id, body_blob_id, metadata"
)
# Marks read with one IN query, so a slice of thousands of mails costs tens of requests, not thousands.
_IN_CHUNK = 100


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

    def insert(self, mail: EnqueuedMail, counted_at: int) -> None:
        self.store.execute(
            f"INSERT INTO enqueued_mails ({_FIELDS}, counted_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (*mail.row(), counted_at),
        )

    def counted_times(self, queue: str, slice_start: int, bucket: int) -> dict[str, int]:
        """The `counted_at` of each mail of the (slice, bucket), by enqueue id (0 for a row without)."""
        rows = self.store.execute(
            "SELECT enqueue_id, enqueued_time, counted_at FROM enqueued_mails "
            "WHERE queue = ? AND slice_start = ? AND bucket = ?",
            (queue, slice_start, bucket),
        )
        return {row.enqueue_id: row.counted_at or 0 for row in rows if row.enqueued_time is not None}

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

    def mark(self, queue: str, enqueue_id: str, counted_at: int) -> bool:
        """True if this call marked the mail, False if it was marked already."""
        return self.store.applied(
            "INSERT INTO deleted_mails (queue, enqueue_id, counted_at) VALUES (?, ?, ?) IF NOT EXISTS",
            (queue, enqueue_id, counted_at),
        ).applied

    def put(self, queue: str, enqueue_id: str, counted_at: int) -> None:
        """Mark the mail, whether it was marked or not: an idempotent write."""
        self.store.execute(
            "INSERT INTO deleted_mails (queue, enqueue_id, counted_at) VALUES (?, ?, ?)",
            (queue, enqueue_id, counted_at),
        )

    def is_marked(self, queue: str, enqueue_id: str):
        """A future whose result has a row if the mail is marked."""
        return self.store.execute_async(
            "SELECT enqueue_id FROM deleted_mails WHERE queue = ? AND enqueue_id = ?", (queue, enqueue_id)
        )

    def marked(self, queue: str, enqueue_ids: list[str]) -> set[str]:
        return set(self.counted_times(queue, enqueue_ids))

    def counted_times(self, queue: str, enqueue_ids: list[str]) -> dict[str, int]:
        """The `counted_at` of each mail marked among these, by enqueue id (0 for a mark without)."""
        results = self.store.execute_all(
            "SELECT enqueue_id, counted_at FROM deleted_mails WHERE queue = ? AND enqueue_id IN ?",
            [(queue, chunk) for chunk in _chunks(enqueue_ids)],
        )
        return {row.enqueue_id: row.counted_at or 0 for rows in results for row in rows}

    def unmark(self, queue: str, enqueue_ids: list[str]) -> None:
        self.store.execute_all(
            "DELETE FROM deleted_mails WHERE queue = ? AND enqueue_id IN ?",
            [(queue, chunk) for chunk in _chunks(enqueue_ids)],
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
        self.store = store
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
        """Count the mail, then write its row. An insert that raises has counted its mail all the same
        (a share whose write failed is written with the writer's next write, tallies.py), whether its
        row was written or not: the process withdraws the mail by a mark that counts its deletion
        (queue/enqueuer.py's FailedEnqueues), which leaves the count exact at once."""
        counted_at = now_micros()
        counted = [self.slice_counters.counting(mail.queue, mail.slice_start, mail.bucket, counted_at, 1)]
        self.slice_counters.count(counted)
        self.enqueued_mails.insert(mail, counted_at)

    def insert_many(self, mails: Sequence[EnqueuedMail]) -> None:
        for mail in mails:
            self.insert(mail)

    def mark_deleted(self, queue: str, enqueue_id: str, slice_start: int, bucket: int) -> bool:
        """Record the mail as deleted; True only the first time, so counts count each mail once."""
        counted_at = now_micros()
        if not self.deleted_mails.mark(queue, enqueue_id, counted_at):
            return False
        self.slice_counters.count(
            [self.slice_counters.counting(queue, slice_start, bucket, counted_at, deleted=1)]
        )
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
        counted_at = now_micros()
        self.deleted_mails.put(queue, enqueue_id, counted_at)
        after_mark()
        self.slice_counters.count(
            [
                self.slice_counters.counting(queue, slice_start, bucket, counted_at, deleted=1),
                *destination_changes(self.store, queue, destinations),
            ]
        )

    def recount(self, queue: str, slice_start: int) -> int:
        """Fold the slice's settled epochs (see the module's docstring); returns the sum of the
        corrections' sizes, 0 when their shares were right."""
        settled = settled_before(now_micros())
        counted = self.slice_counters.of_slice(queue, slice_start)
        corrected = 0
        for bucket in sorted({row.bucket for row in counted}):
            rows = self.enqueued_mails.counted_times(queue, slice_start, bucket)
            marks = self.deleted_mails.counted_times(queue, list(rows))
            enqueued = sum(at < settled for at in rows.values())
            deleted = sum(at < settled for at in marks.values())
            folded = [row for row in counted if row.bucket == bucket and row.epoch < settled]
            was_enqueued = sum(row.enqueued for row in folded)
            was_deleted = sum(row.deleted for row in folded)
            shares = any(row.epoch != FOLDED for row in folded)
            if not shares and (was_enqueued, was_deleted) == (enqueued, deleted):
                continue  # folded already, and right
            self.slice_counters.fold(queue, slice_start, bucket, settled, enqueued, deleted)
            corrected += abs(was_enqueued - enqueued) + abs(was_deleted - deleted)
        return corrected

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
