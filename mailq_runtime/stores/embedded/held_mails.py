"""Held mails on the embedded store (the `HeldMails` protocol of stores/protocols.py), in `held_mails`;
each compare-and-set is one transaction's conditional statement."""

from __future__ import annotations

import builtins

from ..records import HeldMail
from .store import EmbeddedStore

_FIELDS = "queue, enqueue_id, held_at, parks, payload"


class EmbeddedHeldMails:
    def __init__(self, store: EmbeddedStore) -> None:
        self.store = store

    def hold(self, queue: str, enqueue_id: str, now: int) -> bool:
        with self.store.transaction() as db:
            return bool(
                db.execute(
                    "INSERT OR IGNORE INTO held_mails (queue, enqueue_id, held_at, parks) "
                    "VALUES (?, ?, ?, 0)",
                    (queue, enqueue_id, now),
                ).rowcount
            )

    def get(self, queue: str, enqueue_id: str) -> HeldMail | None:
        row = self.store.read_one(
            f"SELECT {_FIELDS} FROM held_mails WHERE queue = ? AND enqueue_id = ?", (queue, enqueue_id)
        )
        return None if row is None else HeldMail(*row)

    def any_held(self, queue: str) -> bool:
        return self.store.read_one("SELECT 1 FROM held_mails WHERE queue = ? LIMIT 1", (queue,)) is not None

    def park(self, held: HeldMail, payload: str) -> bool:
        with self.store.transaction() as db:
            return bool(
                db.execute(
                    "UPDATE held_mails SET payload = ?, parks = parks + 1 "
                    "WHERE queue = ? AND enqueue_id = ? AND parks = ?",
                    (payload, held.queue, held.enqueue_id, held.parks),
                ).rowcount
            )

    def release(self, held: HeldMail) -> bool:
        with self.store.transaction() as db:
            return bool(
                db.execute(
                    "DELETE FROM held_mails WHERE queue = ? AND enqueue_id = ? AND parks = ?",
                    (held.queue, held.enqueue_id, held.parks),
                ).rowcount
            )

    def list(self, queue: str) -> builtins.list[HeldMail]:
        rows = self.store.read(
            f"SELECT {_FIELDS} FROM held_mails WHERE queue = ? ORDER BY enqueue_id", (queue,)
        )
        return [HeldMail(*row) for row in rows]
