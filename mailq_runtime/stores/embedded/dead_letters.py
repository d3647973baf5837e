"""Dead letters on the embedded store (the `DeadLetters` protocol of stores/protocols.py), in the
`dead_letters` table."""

from __future__ import annotations

import builtins

from ..records import DeadLetter, DeadLetterReason, DeadLetterSummary
from .store import EmbeddedStore

_FIELDS = "queue, enqueue_id, reason, died_at, payload"


class EmbeddedDeadLetters:
    def __init__(self, store: EmbeddedStore) -> None:
        self.store = store

    def add(self, letter: DeadLetter) -> None:
        with self.store.transaction() as db:
            db.execute(
                "DELETE FROM dead_letters WHERE queue = ? AND enqueue_id = ?",
                (letter.queue, letter.enqueue_id),
            )
            db.execute(
                f"INSERT INTO dead_letters ({_FIELDS}) VALUES (?, ?, ?, ?, ?)",
                (letter.queue, letter.enqueue_id, letter.reason, letter.died_at, letter.payload),
            )

    def list(self, queue: str) -> builtins.list[DeadLetter]:
        rows = self.store.read(
            f"SELECT {_FIELDS} FROM dead_letters WHERE queue = ? ORDER BY enqueue_id", (queue,)
        )
        return [DeadLetter(*row) for row in rows]

    def get(self, queue: str, enqueue_id: str) -> DeadLetter | None:
        row = self.store.read_one(
            f"SELECT {_FIELDS} FROM dead_letters WHERE queue = ? AND enqueue_id = ?", (queue, enqueue_id)
        )
        return None if row is None else DeadLetter(*row)

    def remove(self, queue: str, enqueue_id: str) -> None:
        with self.store.transaction() as db:
            db.execute("DELETE FROM dead_letters WHERE queue = ? AND enqueue_id = ?", (queue, enqueue_id))

    def summary(self, queue: str) -> DeadLetterSummary:
        count, oldest = self.store.read_one(
            "SELECT COUNT(*), MIN(died_at) FROM dead_letters WHERE queue = ?", (queue,)
        )
        return DeadLetterSummary(count, oldest)

    def reasons(self, queue: str) -> builtins.list[DeadLetterReason]:
        rows = self.store.read("SELECT reason, died_at FROM dead_letters WHERE queue = ?", (queue,))
        return [DeadLetterReason(*row) for row in rows]
