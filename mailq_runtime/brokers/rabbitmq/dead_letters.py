"""The messages RabbitMQ gave up on, moved into the metadata store's dead letters by the queue."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import pika

from ...clock import LATEST
from ..base import BrokerDeadLetter
from .consumer import Consumer
from .messages import DIED_AT, REASON
from .names import rabbitmq_queues
from .receiver import Receiver
from .session import Session
from .waits import START_WAIT


class DeadLetterDrain:
    def __init__(self, session: Session, receiver: Receiver) -> None:
        self.session = session
        self.receiver = receiver

    def drain(self, queue: str, keep: Callable[[list[BrokerDeadLetter]], None]) -> int:
        """Hand the messages RabbitMQ delivered past the delivery limit to `keep`, which records them in the
        metadata store's dead letters, then ack them; returns how many (at most `prefetch` a call).
        Crash-safe order: 1. receive them; 2. `keep`; 3. ack. A crash or a failing `keep` leaves them in
        the dead-letter queue, so `keep` may be handed a letter again: it must replace, not add."""
        deadline = time.monotonic() + START_WAIT
        consumer = self.receiver.consumer(
            queue, rabbitmq_queues(queue, self.session.options.queue_type)[1], deadline
        )
        if consumer is None:
            return 0
        taken = []
        with self.receiver.asking(consumer):
            with consumer.cond:
                while not consumer.live and not self.session.closed and time.monotonic() < deadline:
                    consumer.cond.wait(max(deadline - time.monotonic(), 0.001))
            if self.receiver.sync(consumer) is None:
                return 0
            with consumer.cond:
                while (one := consumer.take()) is not None:
                    consumer.outstanding[one[1]] = [one[2].message_id or "", LATEST]
                    taken.append(one)
        if not taken:
            return 0
        try:
            keep([self._dead_letter(queue, properties, body) for _, _, properties, body in taken])
        except BaseException:
            self._settle(consumer, taken, requeue=True)
            raise
        self._settle(consumer, taken, requeue=False)
        return len(taken)

    def _settle(self, consumer: Consumer, taken: list[tuple[int, int, Any, bytes]], requeue: bool) -> None:
        link = self.session.started()
        for epoch, tag, _, _ in taken:
            with consumer.cond:
                consumer.outstanding.pop(tag, None)
            link.submit(partial(consumer.settle, epoch, tag, requeue))

    def _dead_letter(self, queue: str, properties: pika.BasicProperties, body: bytes) -> BrokerDeadLetter:
        headers = properties.headers or {}
        reason = headers.get(REASON)
        died_at = headers.get(DIED_AT)
        return BrokerDeadLetter(
            queue=queue,
            enqueue_id=properties.message_id or "",
            payload=body.decode("utf-8", errors="replace"),
            reason=reason if isinstance(reason, str) else self._limit_reason(headers),
            died_at=int(died_at) if isinstance(died_at, int) else self.session.clock(),
        )

    def _limit_reason(self, headers: dict) -> str:
        """Why RabbitMQ dead-lettered a message by itself (a quorum queue's delivery limit)."""
        if headers.get("x-first-death-reason") == "delivery_limit":
            limit = self.session.options.delivery_limit
            return (
                f"delivered {limit} times without being settled, the broker's delivery limit "
                "(counted by RabbitMQ): its consumers died, lost their lease or gave it back every time"
            )
        return "RabbitMQ dead-lettered it"
