"""Dead letters on Cassandra (the `DeadLetters` interface of stores/dead_letters.py): one partition a queue,
its letters by enqueue id. Adding a letter again overwrites it, as the interface wants; no transaction
is needed, since a letter is only ever written whole.
"""

from __future__ import annotations

import builtins

from ..dead_letters import DeadLetter
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

    def count(self, queue: str) -> int:
        return self.store.execute("SELECT COUNT(*) FROM dead_letters WHERE queue = ?", (queue,)).one()[0]
