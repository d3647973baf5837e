"""The I/O side of the RabbitMQ broker (rabbitmq.py): one thread owning the AMQP connection and every
channel on it, the publishes it carries until confirmed, and the consumers it feeds.

Only this thread touches pika's connection and channels (pika is not thread-safe). Callers hand it work
through `Link.submit` (one `add_callback_threadsafe` wake-up for however many commands are waiting) and
wait on a `Waiter`, or, for deliveries, on their consumer's condition.
"""

from __future__ import annotations

import heapq
import logging
import random
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import pika
import pika.exceptions
from pika.adapters.select_connection import IOLoop
from pika.spec import Basic

from ..clock import Clock
from ..errors import BrokerRefused, BrokerUnavailable

log = logging.getLogger("mailq_runtime.brokers.rabbitmq")

BACKOFF_FIRST, BACKOFF_MAX = 0.25, 5.0
# A consumer nobody has asked for a message for this long (seconds) stops consuming and gives back what
# it holds, so that a process busy with a long delivery, or done receiving, starves no other consumer.
IDLE = 1.0
ROUTE_LOST = object()  # the outcome of a publish that RabbitMQ confirmed but could not route
# Message headers of mailq's own: deliveries before this copy of the message was published, and for a
# dead letter, why and when (microseconds since the epoch) the broker gave up on it.
DELIVERIES = "x-mailq-deliveries"
REASON = "x-mailq-reason"
DIED_AT = "x-mailq-died-at"


def describe(error: BaseException) -> str:
    """One line for an error of pika's (which never holds the password)."""
    if isinstance(error, pika.exceptions.ProbableAuthenticationError):
        return "the login was refused (ACCESS_REFUSED): check the user and MAILQ_AMQP_PASSWORD"
    if isinstance(error, pika.exceptions.ProbableAccessDeniedError):
        return "the virtual host was refused: it does not exist, or the user may not use it"
    if isinstance(error, pika.exceptions.ConnectionClosedByBroker | pika.exceptions.ChannelClosedByBroker):
        return f"({error.reply_code}) {error.reply_text}"
    text = str(error)
    # A failed connection workflow nests its causes; the last one is the reason.
    if "last exception - " in text:
        text = text.split("last exception - ", 1)[1].split("; first exception", 1)[0]
    return (text or type(error).__name__)[:300]


def deliveries(properties: pika.BasicProperties) -> int:
    """How many times the message was delivered before this copy of it was published."""
    count = (properties.headers or {}).get(DELIVERIES, 0)
    return int(count) if isinstance(count, int) and count > 0 else 0


def redelivery(
    properties: pika.BasicProperties, queue: str, dead_letters: str, limit: int, clock: Clock
) -> tuple[str, pika.BasicProperties]:
    """Where the copy of a message RabbitMQ delivers again goes, and its properties: back to `queue` with
    one more delivery counted, or, once `limit` deliveries are reached, to `dead_letters` with the reason."""
    count = deliveries(properties) + 1
    headers = {**(properties.headers or {}), DELIVERIES: count}
    routing_key = queue
    if count >= limit:
        routing_key = dead_letters
        headers[REASON] = (
            f"delivered {count} times without being settled, the broker's delivery limit: its consumers "
            "died, lost their lease or gave it back every time"
        )
        headers[DIED_AT] = clock()
    copy = pika.BasicProperties(
        message_id=properties.message_id,
        delivery_mode=pika.DeliveryMode.Persistent,
        content_type=properties.content_type,
        priority=properties.priority,
        headers=headers,
    )
    return routing_key, copy


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


@dataclass(frozen=True, eq=False)
class Handle:
    """What a Delivery of this broker holds: its consumer, the channel's epoch and the delivery tag."""

    consumer: Consumer
    epoch: int
    tag: int


class Consumer:
    """The deliveries of one RabbitMQ queue in this process: a channel consuming it, the messages
    received that no caller took yet (by priority, then enqueue id), and those handed out and not
    settled, with their leases. The I/O thread fills the buffer and the callers empty it, under `cond`.

    A mail queue's consumer counts deliveries: a message RabbitMQ delivers again is replaced by a copy
    that counts one more, or goes to `dead_letters` past the limit. The dead-letter queue's does not."""

    def __init__(self, name: str, dead_letters: str | None) -> None:
        self.name = name
        self.dead_letters = dead_letters
        self.cond = threading.Condition(threading.Lock())
        # (-priority, enqueue id, delivery tag, properties, body)
        self.buffer: list[tuple[int, str, int, pika.BasicProperties, bytes]] = []
        # Bumped whenever the channel changes or is lost: a delivery of an older epoch is no longer ours.
        self.epoch = 0
        self.live = False  # consuming on an open channel
        self.ever_live = False
        self.outstanding: dict[int, list] = {}  # delivery tag -> [enqueue id, lease end], handed out
        self.republishing = 0  # redelivered messages whose copy RabbitMQ has not confirmed yet
        # This process published to the queue or gave a message back since the last sync: messages may
        # be on their way here that should go out before those the buffer holds.
        self.dirty = False
        self.waiting = 0  # callers in receive
        self.last_asked = 0.0  # when a caller last was (time.monotonic())
        self.paused = False  # stopped consuming while idle; the next receive resumes it
        self.start_lock = threading.Lock()
        self.started = False  # its queues declared and its start handed to the I/O thread
        self.missing = False  # its queue vanished: the next receive declares it again
        # The I/O thread's own.
        self.wanted = False
        self.channel: Any = None
        self.opening = False
        self.tag: str | None = None  # the consumer tag while consuming
        self.syncs: list[Waiter] = []

    def asking(self, more: int) -> None:
        """A caller starts (+1) or ends (-1) asking for a message. Under `cond`."""
        self.waiting += more
        self.last_asked = time.monotonic()

    def take(self) -> tuple[int, int, pika.BasicProperties, bytes] | None:
        """The best message received (epoch, tag, properties, body), or None. Under `cond`."""
        if not self.buffer:
            return None
        _, _, tag, properties, body = heapq.heappop(self.buffer)
        return self.epoch, tag, properties, body

    def holds(self, handle: Handle) -> bool:
        """Whether the delivery is still this consumer's to settle. Under `cond`."""
        return handle.epoch == self.epoch and self.live and handle.tag in self.outstanding

    def lose(self) -> None:
        """The channel is gone: RabbitMQ gives its unacknowledged messages to other consumers."""
        with self.cond:
            self.epoch += 1
            self.live = False
            self.buffer.clear()
            self.outstanding.clear()
            self.republishing = 0
            self.cond.notify_all()


class Link(threading.Thread):
    """The I/O thread: the connection, the confirming publish channel and the consumers' channels. Every
    method but `submit` runs on this thread."""

    def __init__(
        self,
        parameters: pika.ConnectionParameters,
        target: str,
        prefetch: int,
        delivery_limit: int,
        clock: Clock,
    ) -> None:
        super().__init__(name=f"mailq-rabbitmq {target}", daemon=True)
        self.parameters = parameters
        self.target = target
        self.prefetch = prefetch
        self.delivery_limit = delivery_limit
        self.clock = clock
        self.ioloop = IOLoop()
        self.commands: deque[Callable[[], None]] = deque()
        self.wake_lock = threading.Lock()
        self.wake_pending = False
        self.connection: Any = None
        self.channel: Any = None  # the publish channel, once in confirm mode
        self.seq = 0
        self.pending: dict[int, Publish] = {}  # sent, by delivery tag, unconfirmed
        self.unsent: deque[Publish] = deque()
        self.returned: Counter[tuple[str, str]] = Counter()  # (routing key, enqueue id) RabbitMQ returned
        self.consumers: dict[str, Consumer] = {}
        self.closing = False
        self.stopped = False
        self.failures = 0
        self.reconnect_timer: Any = None
        self.idle_timer: Any = None
        # Read by callers: why the last connection failed (and pika's error, which callers' errors are
        # chained to), and whether RabbitMQ refused the login or the virtual host (waiting for it is of no
        # use then).
        self.error: str | None = None
        self.failure: BaseException | None = None
        self.refused: str | None = None

    # Callers' side.

    def submit(self, command: Callable[[], None]) -> None:
        self.commands.append(command)
        with self.wake_lock:
            if self.wake_pending:
                return
            self.wake_pending = True
        self.ioloop.add_callback_threadsafe(self._run_commands)

    def run(self) -> None:
        self.ioloop.add_callback_threadsafe(self._connect)
        while not self.stopped:
            try:
                self.ioloop.start()
            except Exception:
                # A bug in one callback must not end the thread every publisher and consumer depends on.
                log.exception("RabbitMQ at %s: error in the I/O thread", self.target)
        self.ioloop.close()

    # The I/O thread's side.

    def _run_commands(self) -> None:
        with self.wake_lock:
            self.wake_pending = False
        while self.commands:
            command = self.commands.popleft()
            try:
                command()
            except Exception:
                log.exception("RabbitMQ at %s: error in the I/O thread", self.target)

    def _connect(self) -> None:
        self.reconnect_timer = None
        if self.closing:
            return
        self.connection = pika.SelectConnection(
            self.parameters,
            on_open_callback=self._on_open,
            on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_closed,
            custom_ioloop=self.ioloop,
        )

    def _retry_later(self) -> None:
        delay = min(BACKOFF_FIRST * 2**self.failures, BACKOFF_MAX)
        self.failures += 1
        # Jittered, so that the processes a broker restart disconnected do not all come back at once.
        self.reconnect_timer = self.ioloop.call_later(delay * random.uniform(0.5, 1.0), self._connect)

    def _on_open(self, connection: Any) -> None:
        if self.failures:
            log.warning("RabbitMQ at %s: connected again", self.target)
        self.failures = 0
        self.error = self.refused = self.failure = None
        if self.idle_timer is None:
            self.idle_timer = self.ioloop.call_later(IDLE / 2, self._check_idle)
        connection.channel(on_open_callback=self._on_publish_channel)
        for consumer in self.consumers.values():
            if consumer.wanted:
                self._open_consumer(consumer)

    def _on_open_error(self, connection: Any, error: BaseException) -> None:
        self.connection = None
        if self.closing:
            self._stop_loop()
            return
        self.error, self.failure = describe(error), error
        if self.failures == 0:
            log.warning("RabbitMQ at %s: cannot connect (%s), retrying", self.target, self.error)
        if isinstance(
            error, pika.exceptions.ProbableAuthenticationError | pika.exceptions.ProbableAccessDeniedError
        ):
            self.refused = self.error
            self._fail_waiting(BrokerRefused(f"RabbitMQ at {self.target}: {self.refused}"))
            for consumer in self.consumers.values():
                with consumer.cond:
                    consumer.cond.notify_all()
        self._retry_later()

    def _on_closed(self, connection: Any, reason: BaseException) -> None:
        self.connection = None
        self.channel = None
        self._requeue_pending()
        for consumer in self.consumers.values():
            consumer.channel = None
            consumer.tag = None
            consumer.opening = False
            self._end_syncs(consumer)
            consumer.lose()
        if self.closing:
            self._stop_loop()
            return
        self.error, self.failure = describe(reason), reason
        log.warning("RabbitMQ at %s: connection lost (%s), reconnecting", self.target, self.error)
        self._retry_later()

    def _connected(self) -> bool:
        return self.connection is not None and self.connection.is_open and not self.closing

    # Publishing.

    def _on_publish_channel(self, channel: Any) -> None:
        channel.add_on_close_callback(self._on_publish_channel_closed)
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(self._on_confirm, callback=lambda _frame: self._confirming(channel))

    def _confirming(self, channel: Any) -> None:
        self.channel = channel
        self.seq = 0
        self._flush()

    def _on_publish_channel_closed(self, channel: Any, reason: BaseException) -> None:
        if self.channel is not None and channel is not self.channel:
            return
        self.channel = None
        self._requeue_pending()
        if self._connected():
            log.warning(
                "RabbitMQ at %s: publish channel closed (%s), reopening", self.target, describe(reason)
            )
            self.ioloop.call_later(BACKOFF_MAX / 5, self._reopen_publish_channel)

    def _reopen_publish_channel(self) -> None:
        if self._connected() and self.channel is None:
            self.connection.channel(on_open_callback=self._on_publish_channel)

    def send(self, publish: Publish) -> None:
        if self.closing:
            publish.finish(BrokerUnavailable(f"the broker of RabbitMQ at {self.target} is closed"))
        elif self.refused is not None:
            publish.finish(BrokerRefused(f"RabbitMQ at {self.target}: {self.refused}"))
        elif self.channel is not None:
            self._basic_publish(publish)
        else:
            self.unsent.append(publish)

    def abandon(self, publish: Publish) -> None:
        publish.abandoned = True

    def _flush(self) -> None:
        while self.unsent and self.channel is not None and self.channel.is_open:
            publish = self.unsent.popleft()
            if not publish.abandoned:
                self._basic_publish(publish)

    def _basic_publish(self, publish: Publish) -> None:
        if not self.channel.is_open:
            self.unsent.appendleft(publish)  # closing: its close callback reopens one and sends again
            return
        # Mandatory: a message no queue takes (a queue deleted behind our back) comes back instead of
        # being confirmed and dropped.
        self.channel.basic_publish(
            "", publish.routing_key, publish.body, properties=publish.properties, mandatory=True
        )
        self.seq += 1
        self.pending[self.seq] = publish

    def _on_return(self, channel: Any, method: Any, properties: pika.BasicProperties, body: bytes) -> None:
        self.returned[(method.routing_key, properties.message_id)] += 1

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        confirmed = isinstance(method, Basic.Ack)
        if method.multiple:
            tags = []
            for tag in self.pending:  # in the order sent
                if tag > method.delivery_tag:
                    break
                tags.append(tag)
        else:
            tags = [method.delivery_tag]
        for tag in tags:
            publish = self.pending.pop(tag, None)
            if publish is None:
                continue
            key = (publish.routing_key, publish.enqueue_id)
            if confirmed and self.returned[key]:
                self.returned[key] -= 1
                publish.finish(ROUTE_LOST)
            elif confirmed:
                publish.finish(None)
            elif not publish.abandoned:
                self.unsent.append(publish)  # nacked: RabbitMQ could not take it, send it again
        self._flush()

    def _requeue_pending(self) -> None:
        """Publishes sent on a lost channel may or may not have arrived: send the callers' again, first.
        The I/O thread's own copies are dropped: RabbitMQ delivers their originals again."""
        again = [p for p in self.pending.values() if not p.abandoned and p.confirmed is None]
        self.unsent = deque(p for p in self.unsent if p.confirmed is None)
        self.pending.clear()
        self.returned.clear()
        self.unsent.extendleft(reversed(again))

    def _fail_waiting(self, error: BrokerUnavailable) -> None:
        for publish in [*self.pending.values(), *self.unsent]:
            if publish.confirmed is None:
                publish.finish(error)
        self.pending.clear()
        self.unsent.clear()

    # Consuming.

    def consume(self, consumer: Consumer) -> None:
        consumer.wanted = True
        self.consumers[consumer.name] = consumer
        if self._connected() and consumer.channel is None and not consumer.opening:
            self._open_consumer(consumer)

    def _open_consumer(self, consumer: Consumer) -> None:
        consumer.opening = True
        self.connection.channel(on_open_callback=partial(self._on_consumer_channel, consumer))

    def _on_consumer_channel(self, consumer: Consumer, channel: Any) -> None:
        consumer.opening = False
        if not consumer.wanted or self.closing:
            channel.close()
            return
        consumer.channel = channel
        channel.add_on_close_callback(partial(self._on_consumer_channel_closed, consumer))
        # RabbitMQ cancels a consumer whose queue was deleted: closing the channel restarts it.
        channel.add_on_cancel_callback(lambda _frame: channel.close())
        channel.basic_qos(prefetch_count=self.prefetch, callback=partial(self._on_qos, consumer, channel))

    def _on_qos(self, consumer: Consumer, channel: Any, _frame: Any) -> None:
        if channel is not consumer.channel:
            return
        with consumer.cond:
            consumer.epoch += 1
            consumer.paused = False
        self._start_consuming(consumer)

    def _start_consuming(self, consumer: Consumer) -> None:
        epoch = consumer.epoch
        consumer.tag = consumer.channel.basic_consume(
            consumer.name,
            partial(self._on_message, consumer, epoch),
            callback=partial(self._on_consuming, consumer, epoch),
        )

    def _on_consuming(self, consumer: Consumer, epoch: int, _frame: Any) -> None:
        with consumer.cond:
            if epoch == consumer.epoch:
                consumer.live = consumer.ever_live = True
                consumer.cond.notify_all()

    def resume(self, consumer: Consumer) -> None:
        """Consume again after an idle pause."""
        channel = consumer.channel
        with consumer.cond:
            if not consumer.paused or channel is None or not channel.is_open:
                return
            consumer.paused = False
        self._start_consuming(consumer)

    def _check_idle(self) -> None:
        self.idle_timer = None
        if self.closing:
            return
        now = time.monotonic()
        for consumer in self.consumers.values():
            channel = consumer.channel
            with consumer.cond:
                idle = consumer.waiting == 0 and now - consumer.last_asked > IDLE
                if not idle or consumer.paused or not consumer.live or consumer.tag is None:
                    continue
                consumer.paused = True
                held, consumer.buffer = consumer.buffer, []
                epoch = consumer.epoch
            channel.basic_cancel(consumer.tag)
            consumer.tag = None
            for _, _, tag, properties, body in held:
                self._send_copy(consumer, epoch, tag, consumer.name, properties, body)
        self.idle_timer = self.ioloop.call_later(IDLE / 2, self._check_idle)

    def _on_message(
        self,
        consumer: Consumer,
        epoch: int,
        channel: Any,
        method: Any,
        properties: pika.BasicProperties,
        body: bytes,
    ) -> None:
        tag = method.delivery_tag
        if method.redelivered and consumer.dead_letters is not None:
            # Its consumer died, lost its lease, gave it back, or RabbitMQ restarted: RabbitMQ does not
            # count deliveries of a classic queue, so the copy that replaces it carries the count.
            routing_key, copy = redelivery(
                properties, consumer.name, consumer.dead_letters, self.delivery_limit, self.clock
            )
            self._send_copy(consumer, epoch, tag, routing_key, copy, body)
            return
        with consumer.cond:
            if epoch != consumer.epoch:
                return  # from a channel given up on: RabbitMQ delivers it again
            if not consumer.paused:
                entry = (-(properties.priority or 0), properties.message_id or "", tag)
                heapq.heappush(consumer.buffer, (*entry, properties, body))
                consumer.cond.notify()
                return
        self._send_copy(consumer, epoch, tag, consumer.name, properties, body)  # sent before the pause

    def _send_copy(
        self,
        consumer: Consumer,
        epoch: int,
        tag: int,
        routing_key: str,
        copy: pika.BasicProperties,
        body: bytes,
    ) -> None:
        """Replace a message this consumer received by a copy, then ack the original once the copy is
        confirmed: how a delivery is counted, and how an idle consumer gives back what it holds (the count
        kept), without RabbitMQ marking it delivered again."""
        with consumer.cond:
            if epoch != consumer.epoch:
                return
            consumer.republishing += 1

        def confirmed() -> None:
            with consumer.cond:
                if epoch != consumer.epoch:
                    return  # the channel was lost: RabbitMQ delivers the original again
                consumer.republishing -= 1
                consumer.dirty = True
                consumer.cond.notify_all()
            self.settle(consumer, epoch, tag, requeue=False)

        self.send(Publish(routing_key, copy.message_id or "", body, copy, confirmed))

    def _on_consumer_channel_closed(self, consumer: Consumer, channel: Any, reason: BaseException) -> None:
        if channel is not consumer.channel:
            return
        consumer.channel = None
        consumer.tag = None
        self._end_syncs(consumer)
        consumer.lose()
        if isinstance(reason, pika.exceptions.ChannelClosedByBroker) and reason.reply_code == 404:
            # Its queue is gone: the next receive declares it again and restarts the consumer.
            consumer.wanted = False
            with consumer.cond:
                consumer.missing = True
                consumer.cond.notify_all()
        elif consumer.wanted and self._connected():
            log.warning(
                "RabbitMQ at %s: consumer channel of %s closed (%s), reopening",
                self.target,
                consumer.name,
                describe(reason),
            )
            self.ioloop.call_later(BACKOFF_MAX / 5, partial(self._reopen_consumer, consumer))

    def _reopen_consumer(self, consumer: Consumer) -> None:
        if consumer.wanted and consumer.channel is None and not consumer.opening and self._connected():
            self._open_consumer(consumer)

    def settle(self, consumer: Consumer, epoch: int, tag: int, requeue: bool) -> None:
        channel = consumer.channel
        if consumer.epoch != epoch or channel is None or not channel.is_open:
            return  # the channel is gone, and RabbitMQ gives the message to a consumer again anyway
        if requeue:
            channel.basic_nack(tag, requeue=True)
        else:
            channel.basic_ack(tag)

    def sync(self, consumer: Consumer, waiter: Waiter) -> None:
        """Answer the number of messages ready in the consumer's queue, asked on its own channel: the
        answer comes after every message RabbitMQ sent this consumer before it, so a message that is
        neither received nor ready is on its way to another consumer. None without a live channel."""
        channel = consumer.channel
        if channel is None or not channel.is_open or not consumer.live:
            waiter.settle(None)
            return
        consumer.syncs.append(waiter)

        def answered(frame: Any) -> None:
            if waiter in consumer.syncs:
                consumer.syncs.remove(waiter)
                waiter.settle(frame.method.message_count)

        channel.queue_declare(consumer.name, passive=True, callback=answered)

    def _end_syncs(self, consumer: Consumer) -> None:
        syncs, consumer.syncs = consumer.syncs, []
        for waiter in syncs:
            waiter.settle(None)

    # Closing.

    def stop(self) -> None:
        self.closing = True
        self._fail_waiting(BrokerUnavailable(f"the broker of RabbitMQ at {self.target} is closed"))
        for consumer in self.consumers.values():
            consumer.wanted = False
            self._end_syncs(consumer)
            consumer.lose()
        for timer in (self.reconnect_timer, self.idle_timer):
            if timer is not None:
                self.ioloop.remove_timeout(timer)
        if self.connection is None or self.connection.is_closed:
            self._stop_loop()
            return
        # The close callback stops the loop; this bounds the wait for a broker that does not answer.
        self.ioloop.call_later(5.0, self._stop_loop)
        try:
            self.connection.close()
        except pika.exceptions.ConnectionWrongStateError:
            pass  # already closing: its close callback comes

    def _stop_loop(self) -> None:
        self.stopped = True
        self.ioloop.stop()
