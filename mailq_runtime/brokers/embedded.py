"""The embedded broker: a durable, cross-process message table in the store's SQLite file.

A consumer leases a message by pushing its `available_at` past a visibility timeout; if the consumer dies
the lease simply expires and the message is delivered again (at-least-once). Messages go out by priority,
then in enqueue order (enqueue ids sort by creation time), so a flushed mail takes its place among the
mails enqueued after it. Waiting consumers sleep on a condition that local publishers signal, and
re-check at a bounded interval for other processes' work, so an idle consumer costs a couple of indexed
reads per interval rather than a spinning core.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence

from ..clock import MICROS_PER_SECOND, Clock
from ..stores.embedded import EmbeddedStore
from .base import BrokerCounts, BrokerDeadLetter, Delivery

_POLL_SECONDS = 0.2


class EmbeddedBroker:
    def __init__(self, store: EmbeddedStore, clock: Clock, visibility_timeout: int) -> None:
        self.store = store
        self.clock = clock
        self.visibility_timeout = visibility_timeout
        self._signal = threading.Condition()
        self._version = 0

    def _notify(self) -> None:
        with self._signal:
            self._version += 1
            self._signal.notify_all()

    def publish(self, queue: str, enqueue_id: str, payload: str, priority: int) -> None:
        # available_at 0: deliverable at once (a message is only ever held back by a lease).
        with self.store.transaction() as db:
            db.execute(
                "INSERT INTO broker_messages (queue, enqueue_id, priority, available_at, payload) "
                "VALUES (?,?,?,0,?)",
                (queue, enqueue_id, priority, payload),
            )
        self._notify()

    def publish_many(self, queue: str, messages: Sequence[tuple[str, str, int]]) -> None:
        with self.store.transaction() as db:
            db.executemany(
                "INSERT INTO broker_messages (queue, enqueue_id, priority, available_at, payload) "
                "VALUES (?,?,?,0,?)",
                [(queue, enqueue_id, priority, payload) for enqueue_id, payload, priority in messages],
            )
        self._notify()

    def _claim(self, queue: str, limit: int) -> list[Delivery]:
        now = self.clock()
        lease = os.urandom(8).hex()  # the claim's: with its id, it names each delivery
        # Unsynced: a claim a power loss takes back leaves the mail to claim again, as an expired lease;
        # the consumer's next synced commit (its delivery, its done()) makes the claim durable with it.
        with self.store.transaction(synced=False) as db:
            rows = db.execute(
                "UPDATE broker_messages SET lease = ?, available_at = ?, attempts = attempts + 1 "
                "WHERE id IN (SELECT id FROM broker_messages INDEXED BY broker_order "
                "WHERE queue = ? AND available_at <= ? ORDER BY priority DESC, enqueue_id LIMIT ?) "
                "RETURNING id, enqueue_id, payload, attempts, priority",
                (lease, now + self.visibility_timeout, queue, now, limit),
            ).fetchall()
        # RETURNING's order is SQLite's: the claim's own is restored.
        rows.sort(key=lambda row: (-row[4], row[1]))
        return [Delivery(queue, row[1], row[2], row[3], (row[0], lease)) for row in rows]

    def _seconds_until_next(self, queue: str) -> float | None:
        (next_at,) = self.store.read_one(
            "SELECT MIN(available_at) FROM broker_messages WHERE queue = ?", (queue,)
        )
        return None if next_at is None else max(0.0, (next_at - self.clock()) / MICROS_PER_SECOND)

    def receive(self, queue: str, timeout: float | None) -> Delivery | None:
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        while True:
            seen = self._version
            claimed = self._claim(queue, 1)
            if claimed:
                return claimed[0]
            wait = _POLL_SECONDS
            until_next = self._seconds_until_next(queue)
            if until_next is not None:
                wait = min(wait, until_next)
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                wait = min(wait, remaining)
            with self._signal:
                self._signal.wait_for(lambda seen=seen: self._version != seen, timeout=max(wait, 0.001))

    def receive_ready(self, queue: str, limit: int) -> list[Delivery]:
        return self._claim(queue, limit)

    def ack(self, delivery: Delivery) -> bool:
        with self.store.transaction() as db:
            return bool(
                db.execute("DELETE FROM broker_messages WHERE id = ? AND lease = ?", delivery.handle).rowcount
            )

    def requeue(self, delivery: Delivery) -> bool:
        with self.store.transaction() as db:
            returned = db.execute(
                "UPDATE broker_messages SET lease = NULL, available_at = 0 WHERE id = ? AND lease = ?",
                delivery.handle,
            ).rowcount
        self._notify()
        return bool(returned)

    def release(self, delivery: Delivery) -> bool:
        with self.store.transaction() as db:
            returned = db.execute(
                "UPDATE broker_messages SET lease = NULL, available_at = 0, attempts = MAX(attempts - 1, 0) "
                "WHERE id = ? AND lease = ?",
                delivery.handle,
            ).rowcount
        self._notify()
        return bool(returned)

    def extend(self, delivery: Delivery, until: int) -> bool:
        # A lease that expired but that no consumer has taken yet is still this one's: the claim and the
        # extension are transactions, and whichever commits first wins.
        with self.store.transaction() as db:
            return bool(
                db.execute(
                    "UPDATE broker_messages SET available_at = ? WHERE id = ? AND lease = ?",
                    (until, *delivery.handle),
                ).rowcount
            )

    def published(self, queue: str, enqueue_ids: list[str]) -> set[str]:
        # One scan of the queue's messages: republishing is rare and an index would tax every publish.
        rows = self.store.read("SELECT enqueue_id FROM broker_messages WHERE queue = ?", (queue,))
        held = {e for (e,) in rows}
        return held & set(enqueue_ids)

    def counts(self, queue: str) -> BrokerCounts:
        # Its leases, exactly: a lease that ended is a message deliverable again, as `_claim` sees it. How
        # many wait it leaves to the queue, which counts the live mails (a message of a removed mail
        # waits here until a consumer discards it).
        rows = self.store.read(
            "SELECT enqueue_id FROM broker_messages "
            "WHERE queue = ? AND lease IS NOT NULL AND available_at > ?",
            (queue, self.clock()),
        )
        return BrokerCounts(ready=None, leased=frozenset(e for (e,) in rows), dead_letters=0)

    def drain_dead_letters(self, queue: str, keep: Callable[[list[BrokerDeadLetter]], None]) -> int:
        return 0  # it never gives up on a message: only the queue dead-letters

    def close(self) -> None:
        self._notify()
