"""Dead letters on Cassandra (the `DeadLetters` protocol of stores/protocols.py): one partition a queue,
its letters by enqueue id. Adding a letter again overwrites it, as the interface wants; no transaction
is needed, since a letter is only ever written whole.
"""

from __future__ import annotations

import builtins

from ..records import DeadLetter, DeadLetterReason, DeadLetterSummary
from .store import CassandraStore

_FIELDS = "queue, enqueue_id, reason, died_at, payload"


class CassandraDeadLetters:
    def __init__(self, store: CassandraStore) -> None:
        self.store = store

    def add(self, letter: DeadLetter) -> None:
        self.store.execute(
            f"INSERT INTO dead_letters ({_FIELDS}) VALUES (?, ?, ?, ?, ?)",
            (letter.queue, letter.enqueue_id, letter.reason, letter.died_at, letter.payload),
        )

    def list(self, queue: str) -> builtins.list[DeadLetter]:
        rows = self.store.execute(f"SELECT {_FIELDS} FROM dead_letters WHERE queue = ?", (queue,))
        return [DeadLetter(*row) for row in rows]

    def get(self, queue: str, enqueue_id: str) -> DeadLetter | None:
        row = self.store.execute(
            f"SELECT {_FIELDS} FROM dead_letters WHERE queue = ? AND enqueue_id = ?", (queue, enqueue_id)
        ).one()
        return None if row is None else DeadLetter(*row)

    def remove(self, queue: str, enqueue_id: str) -> None:
        self.store.execute("DELETE FROM dead_letters WHERE queue = ? AND enqueue_id = ?", (queue, enqueue_id))

    def summary(self, queue: str) -> DeadLetterSummary:
        # An aggregate over one partition: Cassandra counts its rows without shipping them.
        count, oldest = self.store.execute(
            "SELECT COUNT(*), MIN(died_at) FROM dead_letters WHERE queue = ?", (queue,)
        ).one()
        return DeadLetterSummary(count, oldest if count else None)

    def reasons(self, queue: str) -> builtins.list[DeadLetterReason]:
        rows = self.store.execute("SELECT reason, died_at FROM dead_letters WHERE queue = ?", (queue,))
        return [DeadLetterReason(row.reason, row.died_at) for row in rows]
