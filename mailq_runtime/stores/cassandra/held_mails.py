"""Held mails on Cassandra (the `HeldMails` protocol of stores/protocols.py): one partition a queue, its
held mails by enqueue id. Every write is a lightweight transaction, as the compare-and-sets on `parks`
need, and a row that Paxos writes is never also written without it."""

from __future__ import annotations

import builtins

from ..records import HeldMail
from .store import CassandraStore

_FIELDS = "queue, enqueue_id, held_at, parks, payload"


class CassandraHeldMails:
    def __init__(self, store: CassandraStore) -> None:
        self.store = store

    def hold(self, queue: str, enqueue_id: str, now: int) -> bool:
        return self.store.applied(
            "INSERT INTO held_mails (queue, enqueue_id, held_at, parks) VALUES (?, ?, ?, 0) IF NOT EXISTS",
            (queue, enqueue_id, now),
        ).applied

    def get(self, queue: str, enqueue_id: str) -> HeldMail | None:
        row = self.store.execute(
            f"SELECT {_FIELDS} FROM held_mails WHERE queue = ? AND enqueue_id = ?", (queue, enqueue_id)
        ).one()
        return None if row is None else HeldMail(*row)

    def any_held(self, queue: str) -> bool:
        return (
            self.store.execute("SELECT enqueue_id FROM held_mails WHERE queue = ? LIMIT 1", (queue,)).one()
            is not None
        )

    def park(self, held: HeldMail, payload: str) -> bool:
        return self.store.applied(
            "UPDATE held_mails SET payload = ?, parks = ? WHERE queue = ? AND enqueue_id = ? IF parks = ?",
            (payload, held.parks + 1, held.queue, held.enqueue_id, held.parks),
        ).applied

    def release(self, held: HeldMail) -> bool:
        return self.store.applied(
            "DELETE FROM held_mails WHERE queue = ? AND enqueue_id = ? IF parks = ?",
            (held.queue, held.enqueue_id, held.parks),
        ).applied

    def list(self, queue: str) -> builtins.list[HeldMail]:
        rows = self.store.execute(f"SELECT {_FIELDS} FROM held_mails WHERE queue = ?", (queue,))
        return [HeldMail(*row) for row in rows]
