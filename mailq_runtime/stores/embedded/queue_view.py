"""Records 31 and 32 on the embedded store: enqueued_mails, deleted_mails, browse_start, content_start and
the per-slice counters. Each method is one transaction; the queue may
group one operation's calls into one (the unit of work's `writes()`), which nests them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from ..records import DestinationCount, EnqueuedMail, SliceSize
from .destinations import EmbeddedDestinations
from .store import EmbeddedStore

_COLUMNS = (
    "queue, slice_start, bucket, enqueue_id, enqueued_time, next_delivery, priority, name, sender, "
    "recipients, header_blob_id, body_blob_id, metadata"
)


class EmbeddedQueueView:
    def __init__(self, store: EmbeddedStore) -> None:
        self.store = store
        self.destinations = EmbeddedDestinations(store)  # a delivered mail's counts, in its transaction

    # queues
    def queue_names(self) -> list[str]:
        return [name for (name,) in self.store.read("SELECT queue FROM queues ORDER BY queue")]

    def queue_exists(self, queue: str) -> bool:
        return self.store.read_one("SELECT 1 FROM queues WHERE queue = ?", (queue,)) is not None

    def create_queue(self, queue: str, browse_start: int, now: int) -> None:
        """The queue's row, and its browse_start and content_start at `browse_start`, unless it exists."""
        with self.store.transaction() as db:
            if db.execute("INSERT OR IGNORE INTO queues VALUES (?, ?)", (queue, now)).rowcount:
                db.execute("INSERT INTO browse_start VALUES (?, ?)", (queue, browse_start))
                db.execute("INSERT INTO content_start VALUES (?, ?)", (queue, browse_start))

    # enqueued_mails and deleted_mails
    def insert(self, mail: EnqueuedMail) -> None:
        """Add the mail's row and count it in its slice; inserting it again changes nothing."""
        with self.store.transaction() as db:
            inserted = db.execute(
                f"INSERT OR IGNORE INTO enqueued_mails ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                mail.row(),
            ).rowcount
            if not inserted:
                return
            db.execute(
                "INSERT INTO slice_counters (queue, slice_start, enqueued) VALUES (?, ?, 1) "
                "ON CONFLICT (queue, slice_start) DO UPDATE SET enqueued = enqueued + 1",
                (mail.queue, mail.slice_start),
            )

    def insert_many(self, mails: Sequence[EnqueuedMail]) -> None:
        """`insert` each mail, with one count a slice."""
        with self.store.transaction() as db:
            inserted = Counter(
                (mail.queue, mail.slice_start)
                for mail in mails
                if db.execute(
                    f"INSERT OR IGNORE INTO enqueued_mails ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    mail.row(),
                ).rowcount
            )
            db.executemany(
                "INSERT INTO slice_counters (queue, slice_start, enqueued) VALUES (?, ?, ?) "
                "ON CONFLICT (queue, slice_start) DO UPDATE SET enqueued = enqueued + excluded.enqueued",
                [(*key, count) for key, count in inserted.items()],
            )

    def mark_deleted(self, queue: str, enqueue_id: str, slice_start: int, bucket: int) -> bool:
        """Record the mail as deleted; True only the first time, so counters count each mail once. (The
        counters are per slice here; a store may keep them per slice and `bucket`.)"""
        with self.store.transaction() as db:
            marked = db.execute("INSERT OR IGNORE INTO deleted_mails VALUES (?, ?)", (queue, enqueue_id))
            if not marked.rowcount:
                return False
            db.execute(
                "UPDATE slice_counters SET deleted = deleted + 1 WHERE queue = ? AND slice_start = ?",
                (queue, slice_start),
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
        """Record a delivered mail as deleted, counted once in its slice and by `destinations`: the mark
        and the counts are one transaction, so `after_mark`, run between them (the fault seam), rolls
        them back if it raises."""
        with self.store.transaction() as db:
            marked = db.execute("INSERT OR IGNORE INTO deleted_mails VALUES (?, ?)", (queue, enqueue_id))
            after_mark()
            if marked.rowcount:
                db.execute(
                    "UPDATE slice_counters SET deleted = deleted + 1 WHERE queue = ? AND slice_start = ?",
                    (queue, slice_start),
                )
                self.destinations.count(queue, destinations)

    def recount(self, queue: str, slice_start: int) -> int:
        """Set the slice's counters to its rows and marks, in one transaction; returns the sum of the
        corrections' sizes. Here every write that counts is in the transaction of its row or mark, so
        the counters are always right and this finds nothing to correct."""
        with self.store.transaction() as db:
            counted = db.execute(
                "SELECT enqueued, deleted FROM slice_counters WHERE queue = ? AND slice_start = ?",
                (queue, slice_start),
            ).fetchone()
            if counted is None:
                return 0
            rows, marks = db.execute(
                "SELECT COUNT(*), COUNT(d.enqueue_id) FROM enqueued_mails e LEFT JOIN deleted_mails d "
                "ON d.queue = e.queue AND d.enqueue_id = e.enqueue_id "
                "WHERE e.queue = ? AND e.slice_start = ?",
                (queue, slice_start),
            ).fetchone()
            corrected = abs(counted[0] - rows) + abs(counted[1] - marks)
            if corrected:
                db.execute(
                    "UPDATE slice_counters SET enqueued = ?, deleted = ? WHERE queue = ? AND slice_start = ?",
                    (rows, marks, queue, slice_start),
                )
            return corrected

    def is_live(self, mail: EnqueuedMail, current_slice: int | None = None) -> bool:
        """From browse_start on, a mail is live unless marked in deleted_mails. Behind browse_start,
        record 32's clean-up drops a deleted mail's mark together with its row, so there only a row still
        present and unmarked is live (a writer lagging behind browse_start adds such a row). One read,
        whatever `current_slice` says."""
        unmarked = (
            "NOT EXISTS (SELECT 1 FROM deleted_mails d WHERE d.queue = :queue AND d.enqueue_id = :enqueue_id)"
        )
        (live,) = self.store.read_one(
            f"SELECT CASE WHEN :slice_start >= (SELECT browse_start FROM browse_start WHERE queue = :queue) "
            f"THEN {unmarked} "
            "ELSE EXISTS (SELECT 1 FROM enqueued_mails WHERE queue = :queue AND slice_start = :slice_start "
            f"AND bucket = :bucket AND enqueue_id = :enqueue_id) AND {unmarked} END",
            {
                "queue": mail.queue,
                "slice_start": mail.slice_start,
                "bucket": mail.bucket,
                "enqueue_id": mail.enqueue_id,
            },
        )
        return bool(live)

    def slices_from(self, queue: str, start: int) -> list[int]:
        """Slice starts holding mails, from `start` on. (Cassandra steps through every slice instead.)"""
        return [
            s
            for (s,) in self.store.read(
                "SELECT slice_start FROM slice_counters WHERE queue = ? AND slice_start >= ? "
                "ORDER BY slice_start",
                (queue, start),
            )
        ]

    def live_mails(self, queue: str, slice_start: int) -> list[EnqueuedMail]:
        """The slice's mails not in deleted_mails, in enqueue order (all buckets)."""
        rows = self.store.read(
            f"SELECT {', '.join('e.' + c.strip() for c in _COLUMNS.split(','))} FROM enqueued_mails e "
            "WHERE e.queue = ? AND e.slice_start = ? AND NOT EXISTS "
            "(SELECT 1 FROM deleted_mails d WHERE d.queue = e.queue AND d.enqueue_id = e.enqueue_id) "
            "ORDER BY e.enqueued_time, e.enqueue_id",
            (queue, slice_start),
        )
        return [EnqueuedMail.from_row(row) for row in rows]

    def reschedule(self, mails: Iterable[EnqueuedMail], next_delivery: int) -> None:
        """Record the time the broker will next deliver each of `mails` (a flush, a retry's delay)."""
        with self.store.transaction() as db:
            db.executemany(
                "UPDATE enqueued_mails SET next_delivery = ? "
                "WHERE queue = ? AND slice_start = ? AND bucket = ? AND enqueue_id = ?",
                [(next_delivery, m.queue, m.slice_start, m.bucket, m.enqueue_id) for m in mails],
            )

    def size(self, queue: str, start: int) -> int:
        row = self.store.read_one(
            "SELECT COALESCE(SUM(enqueued - deleted), 0) FROM slice_counters "
            "WHERE queue = ? AND slice_start >= ?",
            (queue, start),
        )
        return row[0]

    def slice_sizes(self, queue: str, start: int) -> list[SliceSize]:
        rows = self.store.read(
            "SELECT slice_start, enqueued - deleted FROM slice_counters "
            "WHERE queue = ? AND slice_start >= ? ORDER BY slice_start",
            (queue, start),
        )
        return [SliceSize(*row) for row in rows]

    # browse_start / content_start
    def browse_start(self, queue: str) -> int | None:
        row = self.store.read_one("SELECT browse_start FROM browse_start WHERE queue = ?", (queue,))
        return None if row is None else row[0]

    def content_start(self, queue: str) -> int | None:
        row = self.store.read_one("SELECT content_start FROM content_start WHERE queue = ?", (queue,))
        return None if row is None else row[0]

    def advance_browse_start(self, queue: str, new_start: int) -> bool:
        with self.store.transaction() as db:
            return bool(
                db.execute(
                    "UPDATE browse_start SET browse_start = ? WHERE queue = ? AND browse_start < ?",
                    (new_start, queue, new_start),
                ).rowcount
            )

    def mails_before(self, queue: str, start: int, end: int) -> list[str]:
        """Enqueue ids of every mail (deleted or not) in the slices [start, end)."""
        return [
            e
            for (e,) in self.store.read(
                "SELECT enqueue_id FROM enqueued_mails "
                "WHERE queue = ? AND slice_start >= ? AND slice_start < ?",
                (queue, start, end),
            )
        ]

    def delete_slices(self, queue: str, start: int, end: int) -> int:
        """Record 32: drop the rows of slices [start, end) from enqueued_mails, deleted_mails and counters."""
        with self.store.transaction() as db:
            db.execute(
                "DELETE FROM deleted_mails WHERE queue = ? AND enqueue_id IN "
                "(SELECT enqueue_id FROM enqueued_mails "
                "WHERE queue = ? AND slice_start >= ? AND slice_start < ?)",
                (queue, queue, start, end),
            )
            removed = db.execute(
                "DELETE FROM enqueued_mails WHERE queue = ? AND slice_start >= ? AND slice_start < ?",
                (queue, start, end),
            ).rowcount
            db.execute(
                "DELETE FROM slice_counters WHERE queue = ? AND slice_start >= ? AND slice_start < ?",
                (queue, start, end),
            )
            return removed

    def advance_content_start(self, queue: str, new_start: int) -> None:
        with self.store.transaction() as db:
            db.execute(
                "UPDATE content_start SET content_start = ? WHERE queue = ? AND content_start < ?",
                (new_start, queue, new_start),
            )
