"""A publish on its way to RabbitMQ until confirmed, and a caller waiting for the I/O thread's answer."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pika


class Waiter:
    """A caller waiting for the I/O thread's answer: a lock held until the answer is known."""

    __slots__ = ("_lock", "outcome")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self.outcome: object = None

    def settle(self, outcome: object) -> None:
        self.outcome = outcome
        self._lock.release()

    def wait(self, timeout: float) -> bool:
        return self._lock.acquire(timeout=max(timeout, 0.0))


class Publish:
    """One message on its way until confirmed; owned by the I/O thread once submitted. A caller's publish
    has a waiter; the I/O thread's own (a redelivered message's copy) has `confirmed` instead, and is
    dropped rather than sent again when the connection is lost, as RabbitMQ then delivers the original
    once more."""

    __slots__ = ("routing_key", "enqueue_id", "body", "properties", "waiter", "confirmed", "abandoned")

    def __init__(
        self,
        routing_key: str,
        enqueue_id: str,
        body: bytes,
        properties: pika.BasicProperties,
        confirmed: Callable[[], None] | None = None,
    ) -> None:
        self.routing_key = routing_key
        self.enqueue_id = enqueue_id
        self.body = body
        self.properties = properties
        self.confirmed = confirmed
        self.waiter: Waiter | None = Waiter() if confirmed is None else None
        self.abandoned = False  # its caller gave up waiting: never sent again

    def finish(self, outcome: object) -> None:
        if self.confirmed is not None:
            confirmed, self.confirmed = self.confirmed, None
            confirmed()
            return
        waiter, self.waiter = self.waiter, None
        if waiter is not None:
            waiter.settle(outcome)
