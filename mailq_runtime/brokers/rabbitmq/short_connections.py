"""What the broker asks RabbitMQ on a short connection of the caller's own, so that the I/O thread never
waits: declaring a mail queue's objects, counting their messages, browsing the ready ones."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import pika
import pika.exceptions

from ...errors import BrokerRefused, BrokerUnavailable
from .messages import describe, kept, redelivery
from .names import MAX_PRIORITY, QUORUM, dead_letter_queue, queue_name, rabbitmq_queues
from .session import Session
from .waits import BACKOFF_FIRST, BACKOFF_MAX

T = TypeVar("T")


class ShortConnections:
    def __init__(self, session: Session) -> None:
        self.session = session
        self.target = session.target
        self.queue_type = session.options.queue_type
        self._declared: set[str] = set()
        self._declare_lock = threading.Lock()

    def declare(self, queue: str, deadline: float, force: bool = False) -> None:
        """Declare the queue's objects (idempotent)."""
        if queue in self._declared and not force:
            return
        with self._declare_lock:
            if queue in self._declared and not force:
                return
            self.blocking(partial(self._declare_on, queue), deadline, f"declare the queues of {queue}")
            self._declared.add(queue)

    def forget(self, queue: str) -> None:
        """The queue was deleted behind our back: the next use declares it again."""
        self._declared.discard(queue)

    def _declare_on(self, queue: str, channel: Any) -> None:
        if self.queue_type == QUORUM:
            names, dead_letters = rabbitmq_queues(queue, QUORUM)
            channel.queue_declare(dead_letters, durable=True, arguments={"x-queue-type": QUORUM})
            for name in names:
                channel.queue_declare(
                    name,
                    durable=True,
                    arguments={
                        "x-queue-type": QUORUM,
                        # RabbitMQ counts returns; a message handed out `delivery_limit` times and
                        # returned once more moves to the dead letters, no copy of it lost on the way.
                        "x-delivery-limit": self.session.options.delivery_limit - 1,
                        "x-dead-letter-exchange": "",
                        "x-dead-letter-routing-key": dead_letters,
                        "x-dead-letter-strategy": "at-least-once",
                        "x-overflow": "reject-publish",  # what at-least-once dead-lettering requires
                    },
                )
            return
        channel.queue_declare(
            queue_name(queue),
            durable=True,
            arguments={"x-queue-version": 2, "x-max-priority": MAX_PRIORITY},
        )
        channel.queue_declare(dead_letter_queue(queue), durable=True, arguments={"x-queue-version": 2})

    def browse(self, queue: str, channel: Any) -> set[str]:
        """The enqueue ids of the messages ready in the queue, each taken, published again as it was (its
        count kept, its priority too), then acked."""
        names, dead_letters = rabbitmq_queues(queue, self.queue_type)
        channel.confirm_delivery()
        seen = set()
        for name in names:
            ready = channel.queue_declare(name, passive=True).method.message_count
            # At most the messages ready at the start: the copies go to the queue's end and must not be
            # taken again.
            for _ in range(ready):
                method, properties, body = channel.basic_get(name)
                if method is None:
                    break
                seen.add(properties.message_id or "")
                routing_key = name
                if self.queue_type == QUORUM:
                    properties = kept(properties)  # RabbitMQ counted; the copy keeps the count
                elif method.redelivered:
                    routing_key, properties = redelivery(
                        properties,
                        name,
                        dead_letters,
                        self.session.options.delivery_limit,
                        self.session.clock,
                    )
                channel.basic_publish("", routing_key, body, properties=properties)  # returns once confirmed
                channel.basic_ack(method.delivery_tag)
        return seen

    def ready_counts(self, queue: str, channel: Any) -> tuple[int, int]:
        """The messages ready in the queue's queues and in its dead-letter queue."""
        names, dead_letters = rabbitmq_queues(queue, self.queue_type)
        counts = []
        for name in (*names, dead_letters):
            try:
                counts.append(channel.queue_declare(name, passive=True).method.message_count)
            except pika.exceptions.ChannelClosedByBroker as error:
                if error.reply_code != 404:
                    raise
                # Not declared yet (no mail of the queue was ever published): it holds nothing. The
                # broker closed the channel, so the next declare takes a new one.
                counts.append(0)
                channel = channel.connection.channel()
        return sum(counts[:-1]), counts[-1]

    def blocking(self, action: Callable[[Any], T], deadline: float, what: str) -> T:
        """Run `action` on a channel of a connection of its own, retrying a lost or refused connection with
        backoff until the deadline."""
        delay = BACKOFF_FIRST
        while True:
            self.session.usable()
            try:
                connection = blocking_connection(self.session.parameters)
                try:
                    return action(connection.channel())
                finally:
                    if connection.is_open:
                        connection.close()
            except (
                pika.exceptions.ProbableAuthenticationError,
                pika.exceptions.ProbableAccessDeniedError,
                pika.exceptions.ChannelClosedByBroker,
            ) as error:
                refused = describe(error)
                raise BrokerRefused(f"RabbitMQ at {self.target} refused to {what}: {refused}") from error
            except pika.exceptions.AMQPError as error:
                last = error  # unreachable, or restarting: try again
            if time.monotonic() + delay > deadline:
                raise BrokerUnavailable(
                    f"RabbitMQ at {self.target}: could not {what} ({describe(last)})"
                ) from last
            time.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX)


def blocking_connection(parameters: list[pika.ConnectionParameters]) -> pika.BlockingConnection:
    """A connection of pika's, failing as pika's connection errors do. pika 1.3 raises ValueError ("Expected
    connected socket") when the server resets the connection right after accepting it, as a server going
    down or a cut link does; it is as unreachable as a refused one."""
    try:
        return pika.BlockingConnection(parameters)
    except ValueError as error:
        raise pika.exceptions.AMQPConnectionError(error) from error
