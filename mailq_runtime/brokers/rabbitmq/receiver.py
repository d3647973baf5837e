"""The receiving side of the RabbitMQ broker: a consumer per RabbitMQ queue in this process, and the receive
that hands out the best message it holds under a lease."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from ...errors import BrokerRefused, BrokerUnavailable
from ..base import Delivery
from .consumer import Consumer, Handle
from .messages import deliveries
from .names import QUORUM, band_queue, queue_name, rabbitmq_queues
from .publishes import Waiter
from .session import Session
from .short_connections import ShortConnections
from .waits import SETTLE_WAIT, START_WAIT, SYNC_WAIT

_MISSING = object()  # what a waiting receive finds when its queue vanished


class Receiver:
    def __init__(self, session: Session, declarations: ShortConnections) -> None:
        self.session = session
        self.options = session.options
        self.declarations = declarations
        self.consumers: dict[str, Consumer] = {}
        self._consumers_lock = threading.Lock()

    def stir(self, name: str) -> None:
        """This process changed what RabbitMQ queue `name` holds: its consumer's next receive catches up
        with what RabbitMQ sent it since, so that it hands out the best message, not the best received."""
        consumer = self.consumers.get(name)
        if consumer is not None:
            with consumer.cond:
                consumer.dirty = True

    def wake_all(self) -> None:
        for consumer in self.consumers.values():
            with consumer.cond:
                consumer.cond.notify_all()

    def receive(self, queue: str, timeout: float | None) -> Delivery | None:
        """The next message (highest priority, then oldest); None once `timeout` seconds pass with
        nothing deliverable, also while RabbitMQ cannot be reached (the broker reconnects meanwhile)."""
        started = time.monotonic()
        deadline = None if timeout is None else started + max(timeout, 0.0)
        while True:
            consumer = self.consumer(queue, queue_name(queue), deadline)
            if consumer is None:
                return None
            self._expire(consumer)
            with self.asking(consumer):
                taken = self._take(consumer, started, deadline)
            if taken is None:
                return None
            if taken is not _MISSING:
                break
        epoch, tag, properties, body = taken
        return Delivery(
            queue=queue,
            enqueue_id=properties.message_id or "",
            # Undecodable bytes (a message published by something else) still reach the core, which
            # dead-letters an unreadable payload instead of failing every receive.
            payload=body.decode("utf-8", errors="replace"),
            attempts=deliveries(properties) + 1,
            handle=Handle(consumer, epoch, tag, properties, body),
        )

    @contextmanager
    def asking(self, consumer: Consumer) -> Iterator[None]:
        """A caller waits for the consumer's messages meanwhile: an idle consumer consumes again."""
        with consumer.cond:
            consumer.asking(+1)
            paused = consumer.paused
        if paused:
            link = self.session.started()
            link.submit(partial(link.consuming.resume, consumer))
        try:
            yield
        finally:
            with consumer.cond:
                consumer.asking(-1)

    def _expire(self, consumer: Consumer) -> None:
        """Give back the deliveries of this process whose lease has ended, so that a receive may take them."""
        now = self.session.clock()
        with consumer.cond:
            ended = [tag for tag, (_, until) in consumer.outstanding.items() if until <= now]
            for tag in ended:
                del consumer.outstanding[tag]
            if consumer.counted:
                consumer.returning += len(ended)
            epoch = consumer.epoch
        if not ended:
            return
        link = self.session.started()
        with consumer.cond:
            consumer.dirty = True
        for tag in ended:
            link.submit(partial(consumer.settle, epoch, tag, True))

    def _take(self, consumer: Consumer, started: float, deadline: float | None) -> Any:
        """The consumer's next message (epoch, tag, properties, body), handed out under a lease; None at the
        deadline with nothing on its way, or once closed; _MISSING when its queue must be declared again."""
        settle_until = None
        while True:
            if consumer.dirty or consumer.republishing:
                self._catch_up(consumer)
            with consumer.cond:
                while True:
                    self.session.not_refused()
                    if consumer.missing:
                        return _MISSING
                    taken = consumer.take()
                    if taken is not None:
                        properties = taken[2]
                        lease = [
                            properties.message_id or "",
                            self.session.clock() + self.options.visibility_timeout,
                        ]
                        consumer.outstanding[taken[1]] = lease
                        return taken
                    now = time.monotonic()
                    if self.session.closed:
                        return None
                    end = deadline
                    if not consumer.live and not consumer.ever_live and end is not None:
                        end = max(end, started + START_WAIT)
                    if end is not None and now >= end:
                        if not consumer.live:
                            return None
                        break
                    consumer.cond.wait(None if end is None else end - now)
            # Nothing received by the deadline: unless RabbitMQ says something is on its way here.
            now = time.monotonic()
            if settle_until is None:
                settle_until = now + SETTLE_WAIT
            elif now >= settle_until:
                with consumer.cond:
                    consumer.returning = 0  # taken by another consumer, or RabbitMQ dead-lettered them
                return None
            ready = self.sync(consumer)
            with consumer.cond:
                if consumer.buffer or consumer.missing:
                    continue
                room = len(consumer.outstanding) + len(consumer.buffer) < self.options.prefetch
                on_the_way = consumer.republishing or consumer.returning or (ready and room)
                if ready is None or not on_the_way:
                    return None
                consumer.cond.wait(min(0.05, max(settle_until - now, 0.001)))

    def _catch_up(self, consumer: Consumer) -> None:
        """Wait until the copies of this process's redelivered messages are confirmed and every message
        RabbitMQ sent the consumer has arrived (bounded: under load this is a best effort)."""
        end = time.monotonic() + SETTLE_WAIT
        while True:
            with consumer.cond:
                while time.monotonic() < end and (
                    ((consumer.republishing or consumer.returning) and consumer.live)
                    or (consumer.started and not consumer.ever_live)
                ):
                    consumer.cond.wait(max(end - time.monotonic(), 0.001))
                if time.monotonic() >= end:
                    consumer.returning = 0  # taken by another consumer, or RabbitMQ dead-lettered them
                consumer.dirty = False
            if not consumer.live or self.sync(consumer) is None or time.monotonic() >= end:
                return
            with consumer.cond:
                if not consumer.dirty and not consumer.republishing:
                    return

    def sync(self, consumer: Consumer) -> int | None:
        """The messages ready in the consumer's queue, once every message RabbitMQ sent it before has
        arrived; None without a live channel."""
        link = self.session.started()
        waiter = Waiter()
        link.submit(partial(consumer.sync, waiter))
        return waiter.outcome if waiter.wait(SYNC_WAIT) else None  # type: ignore[return-value]

    def consumer(self, queue: str, name: str, deadline: float | None) -> Consumer | None:
        """The consumer of RabbitMQ queue `name` (of mail queue `queue`), started (its queues declared) when
        new or after its queue vanished; None when RabbitMQ could not be reached before the deadline."""
        with self._consumers_lock:
            consumer = self.consumers.get(name)
            if consumer is None:
                consumer = self.consumers[name] = self._new_consumer(queue, name)
        if consumer.started and not consumer.missing:
            return consumer
        link = self.session.started()
        with consumer.start_lock:
            if consumer.started and not consumer.missing:
                return consumer
            try:
                self.declarations.declare(queue, float("inf") if deadline is None else deadline, force=True)
            except BrokerRefused:
                raise
            except BrokerUnavailable:
                return None
            with consumer.cond:
                consumer.missing = False
                # RabbitMQ sends what the queue holds one message after another: the first receive waits
                # for all of them, or it would hand out whichever arrived first.
                consumer.dirty = True
            consumer.started = True
            link.submit(partial(link.consuming.consume, consumer))
        return consumer

    def _new_consumer(self, queue: str, name: str) -> Consumer:
        """The consumer of mail queue `queue`'s messages (`name` its queue_name), or of its dead letters."""
        names, dead_letters = rabbitmq_queues(queue, self.options.queue_type)
        if name != queue_name(queue):
            return Consumer(name, None)
        if self.options.queue_type == QUORUM:
            route = partial(band_queue, queue)
            return Consumer(name, dead_letters, queues=names, route=route, counted=True)
        return Consumer(name, dead_letters)

    def held(self, queue: str) -> list[tuple[str, int | None]]:
        """The messages of `queue` this broker holds unsettled, once those RabbitMQ sent it have arrived:
        enqueue id and lease end (microseconds), or None for those received and not handed out yet."""
        consumer = self.consumers.get(queue_name(queue))
        if consumer is None:
            return []
        if consumer.live and not self.session.closed:
            self.sync(consumer)
        with consumer.cond:
            leased = [(enqueue_id, until) for enqueue_id, until in consumer.outstanding.values()]
            return leased + [(entry[1], None) for entry in consumer.buffer]
