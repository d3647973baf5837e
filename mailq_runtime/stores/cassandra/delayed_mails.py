"""Delayed mails on Cassandra (the `DelayedMails` protocol of stores/protocols.py), keyed by due time.

A queue's delayed mails are spread over one partition per hour of their due time (`delayed_mails`,
clustered by due time then enqueue id), and `delayed_buckets` lists the hours that may hold some. A
single partition a queue would be the queue anti-pattern record 31 warns of: every read of what is due
would first step over the tombstones of every mail already published. Here a read of what is due steps
over at most one hour's.

`due` drops the listing of an hour it found empty once that hour lies wholly before `now` minus the
clock-skew grace: a mail is added with a due time after its writer's clock, so no later add lands in
such an hour unless that writer's clock lags by more than the grace, the assumption browse_start
makes too. An add lists its hour before writing the mail, so a listed hour is never missed.
"""

from __future__ import annotations

from ..records import DelayedMail, DelayedSummary
from .store import CassandraStore

BUCKET = 3600 * 1_000_000  # microseconds: an hour of due times a partition
_FIELDS = "queue, enqueue_id, due, priority, payload"


def bucket_of(due: int) -> int:
    return due - due % BUCKET


class CassandraDelayedMails:
    def __init__(self, store: CassandraStore, clock_skew_grace: int) -> None:
        self.store = store
        self.clock_skew_grace = clock_skew_grace

    def add(self, mail: DelayedMail) -> None:
        bucket = bucket_of(mail.due)
        self.store.execute(
            "INSERT INTO delayed_buckets (queue, due_bucket) VALUES (?, ?)", (mail.queue, bucket)
        )
        self.store.execute(
            "INSERT INTO delayed_mails (queue, due_bucket, due, enqueue_id, priority, payload) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (mail.queue, bucket, mail.due, mail.enqueue_id, mail.priority, mail.payload),
        )

    def due(self, queue: str, now: int, limit: int) -> list[DelayedMail]:
        found: list[DelayedMail] = []
        for bucket in self._buckets(queue, bucket_of(now)):
            if len(found) >= limit:
                break
            rows = self.store.execute(
                f"SELECT {_FIELDS} FROM delayed_mails "
                "WHERE queue = ? AND due_bucket = ? AND due <= ? LIMIT ?",
                (queue, bucket, now, limit - len(found)),
            )
            mails = [DelayedMail(*row) for row in rows]
            if not mails and bucket + BUCKET <= now - self.clock_skew_grace:
                self.store.execute(
                    "DELETE FROM delayed_buckets WHERE queue = ? AND due_bucket = ?", (queue, bucket)
                )
            found += mails
        return found

    def remove(self, mail: DelayedMail) -> None:
        self.store.execute(
            "DELETE FROM delayed_mails WHERE queue = ? AND due_bucket = ? AND due = ? AND enqueue_id = ?",
            (mail.queue, bucket_of(mail.due), mail.due, mail.enqueue_id),
        )

    def get(self, queue: str, due: int, enqueue_id: str) -> DelayedMail | None:
        row = self.store.execute(
            f"SELECT {_FIELDS} FROM delayed_mails WHERE queue = ? AND due_bucket = ? AND due = ? "
            "AND enqueue_id = ?",
            (queue, bucket_of(due), due, enqueue_id),
        ).one()
        return None if row is None else DelayedMail(*row)

    def all(self, queue: str) -> list[DelayedMail]:
        results = self.store.execute_all(
            f"SELECT {_FIELDS} FROM delayed_mails WHERE queue = ? AND due_bucket = ?",
            [(queue, bucket) for bucket in self._buckets(queue, None)],
        )
        return [DelayedMail(*row) for rows in results for row in rows]

    def summary(self, queue: str, now: int) -> DelayedSummary:
        # Aggregates over each listed hour's partition, split at `now` within its hour: Cassandra counts
        # the rows without shipping them (so the payloads never travel).
        aggregate = (
            "SELECT COUNT(*), MIN(enqueue_id), MIN(due) FROM delayed_mails WHERE queue = ? AND due_bucket = ?"
        )
        buckets = self._buckets(queue, None)
        fallen = self.store.execute_all(
            "SELECT COUNT(*) FROM delayed_mails WHERE queue = ? AND due_bucket = ? AND due <= ?",
            [(queue, b, now) for b in buckets if b <= now],
        )
        waiting = self.store.execute_all(
            f"{aggregate} AND due > ?", [(queue, b, now) for b in buckets if b + BUCKET > now]
        )
        fallen_rows = [row for rows in fallen for row in rows if row[0]]
        waiting_rows = [row for rows in waiting for row in rows if row[0]]
        return DelayedSummary(
            sum(row[0] for row in waiting_rows),
            min((row[1] for row in waiting_rows), default=None),
            min((row[2] for row in waiting_rows), default=None),
            sum(row[0] for row in fallen_rows),
        )

    def _buckets(self, queue: str, last: int | None) -> list[int]:
        """The listed hours of the queue, in order, up to `last` (every one when None)."""
        if last is None:
            rows = self.store.execute("SELECT due_bucket FROM delayed_buckets WHERE queue = ?", (queue,))
        else:
            rows = self.store.execute(
                "SELECT due_bucket FROM delayed_buckets WHERE queue = ? AND due_bucket <= ?", (queue, last)
            )
        return [row.due_bucket for row in rows]
