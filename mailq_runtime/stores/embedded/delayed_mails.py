"""Delayed mails on the embedded store (the `DelayedMails` protocol of stores/protocols.py), in the
`delayed_mails` table, whose key (queue, due, enqueue id) is the order they come due in."""

from __future__ import annotations

from ..records import DelayedMail, DelayedSummary
from .store import EmbeddedStore

_FIELDS = "queue, enqueue_id, due, priority, payload"


class EmbeddedDelayedMails:
    def __init__(self, store: EmbeddedStore) -> None:
        self.store = store

    def add(self, mail: DelayedMail) -> None:
        with self.store.transaction() as db:
            db.execute(
                f"INSERT OR REPLACE INTO delayed_mails ({_FIELDS}) VALUES (?, ?, ?, ?, ?)",
                (mail.queue, mail.enqueue_id, mail.due, mail.priority, mail.payload),
            )

    def due(self, queue: str, now: int, limit: int) -> list[DelayedMail]:
        rows = self.store.read(
            f"SELECT {_FIELDS} FROM delayed_mails WHERE queue = ? AND due <= ? "
            "ORDER BY due, enqueue_id LIMIT ?",
            (queue, now, max(limit, 0)),
        )
        return [DelayedMail(*row) for row in rows]

    def remove(self, mail: DelayedMail) -> None:
        with self.store.transaction() as db:
            db.execute(
                "DELETE FROM delayed_mails WHERE queue = ? AND due = ? AND enqueue_id = ?",
                (mail.queue, mail.due, mail.enqueue_id),
            )

    def get(self, queue: str, due: int, enqueue_id: str) -> DelayedMail | None:
        row = self.store.read_one(
            f"SELECT {_FIELDS} FROM delayed_mails WHERE queue = ? AND due = ? AND enqueue_id = ?",
            (queue, due, enqueue_id),
        )
        return None if row is None else DelayedMail(*row)

    def all(self, queue: str) -> list[DelayedMail]:
        rows = self.store.read(
            f"SELECT {_FIELDS} FROM delayed_mails WHERE queue = ? ORDER BY due, enqueue_id", (queue,)
        )
        return [DelayedMail(*row) for row in rows]

    def summary(self, queue: str, now: int) -> DelayedSummary:
        counts = {0: (0, None, None), 1: (0, None, None)}
        for waiting, count, oldest, first_due in self.store.read(
            "SELECT due > ?, COUNT(*), MIN(enqueue_id), MIN(due) FROM delayed_mails WHERE queue = ? "
            "GROUP BY due > ?",
            (now, queue, now),
        ):
            counts[waiting] = (count, oldest, first_due)
        (waiting, oldest_waiting, next_due), (fallen, _, _) = counts[1], counts[0]
        return DelayedSummary(waiting, oldest_waiting, next_due, fallen)
