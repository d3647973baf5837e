"""The RabbitMQ broker (pika): record 31's messaging leg for the distributed deployment.

Objects, per mail queue Q, durable, in the URL's virtual host and declared on first use: `mailq:Q`, a
classic queue (`x-queue-version` 2) with priorities (`x-max-priority` 9, so mailq's 0..9 are RabbitMQ's
own), and `mailq-dead-letters:Q`, where the messages RabbitMQ delivered too often wait for the queue to
move them into the metadata store's dead letters (`drain_dead_letters`). No queue name holds ':', so two
mail queues' objects never meet. Messages are persistent and every publish is confirmed.

Why classic queues and not quorum queues: on RabbitMQ 3.10 (Debian's, the harness's), a single-node
quorum queue declared shortly before the node is killed (SIGKILL) comes back as an empty Raft follower
of term 0 that never elects itself: every publish to it is nacked and every consume times out, for good,
and the messages it had confirmed are gone. Killing the node 0.2 s after declaring six quorum queues and
publishing 20 confirmed messages to each broke the last one declared in 4 runs of 4 (at 2 s or more, none),
and the restart test of the quorum design stayed stuck on an unconfirmed publish for the same reason: the
node's log says "ra system 'quorum_queues' running pre init for 3 registered servers" against 4 queues
(Ra's registry of servers lost its newest entry) and "leader not known" for ever. Six classic priority
queues killed the same way came back whole in 3 runs of 3. Quorum queues have no priorities on 3.10
either, and 3.10 crashes its Raft segment writer when one is deleted right after heavy writes. What
classic queues lack, mailq does itself:

- Delivery counting and the delivery limit: RabbitMQ marks a message delivered again (its consumer died,
  lost its lease or gave it back; and, after a crash, every message it recovers) but does not count. The
  consumer that receives such a message publishes a copy carrying the count (`x-mailq-deliveries`), then
  acks the original; past `delivery_limit` the copy goes to the dead-letter queue with its reason
  instead. Publish-then-ack is at-least-once: a crash in between leaves a duplicate, never a loss.
- Dead letters: the dead-letter queue is drained into the metadata store by the queue (`MailQueue`), which
  records each letter before it is acked here.

Replication is what classic queues give up: on a cluster a classic queue lives on one node, and is
unavailable (not lost: its messages are on disk) while that node is down.

Delivery order: RabbitMQ delivers by priority, in publish order within one; a consumer keeps up to
`prefetch` messages and hands out what it holds by priority, then enqueue id (creation time), as the
embedded broker does, so a message given back or republished takes its place again among those. After
this process published to a queue or gave a message back, its next receive first catches up with what
RabbitMQ sent it since (a passive declare on the consumer's channel, answered after those messages), so
a mail this process just enqueued is found by a receive(timeout=0). A consumer nobody asked for a message
for a second (its process busy with a long delivery, or done receiving) stops consuming and gives back
what it holds, as copies keeping their count, so it starves no other consumer; the next receive resumes.

Threads: each broker object has one I/O thread (rabbitmq_link.py) owning its AMQP connection (pika's
SelectConnection) and every channel on it, started by the first publish or receive; callers hand it work
with `add_callback_threadsafe`, so no two threads ever touch a channel (pika is not thread-safe),
heartbeats are answered while callers spend minutes on a mail, and all publishers share one confirm
stream with many messages in flight. Queues are declared from the caller's thread on a short connection
of its own, so the I/O thread never waits.

Recovery: when the connection or a channel is lost, the I/O thread reconnects with growing, jittered
delays and resumes: publishes that were unconfirmed or nacked are sent again (consumers see duplicates,
which the view's deletion marks absorb), and every consumer starts again. Nothing needs a restart. A
publish still unconfirmed after `publish_timeout` raises BrokerUnavailable; the queue then keeps the mail
as a delayed mail due at once, which the next publisher of due mails hands over.

Leases: RabbitMQ gives a delivery back when its consumer's channel dies. Besides, a delivery is leased to
its receiver for the visibility timeout on the broker's clock, and `extend` pushes the end; a receive in
the same process gives back the leases that have ended (as the embedded broker's claim takes them), so
until then a lease past its end still settles. RabbitMQ closes a channel whose delivery stays
unacknowledged past its `consumer_timeout` (30 minutes by default on 3.10), which bounds every lease.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any, TypeVar

import pika
import pika.exceptions

from ..clock import LATEST, MICROS_PER_SECOND, Clock, system_clock
from ..errors import BrokerRefused, BrokerUnavailable, InvalidInput, shown
from .base import BrokerCounts, BrokerDeadLetter, Delivery
from .rabbitmq_link import (
    BACKOFF_FIRST,
    BACKOFF_MAX,
    DIED_AT,
    REASON,
    ROUTE_LOST,
    Consumer,
    Handle,
    Link,
    Publish,
    Waiter,
    deliveries,
    describe,
    redelivery,
)

MAX_PRIORITY = 9
# The first receive on a queue waits this long for its consumer to start, whatever its timeout: the
# start is a few round trips, and a receive(timeout=0) on a queue holding mails should find them.
_START_WAIT = 5.0
# How long a receive that found nothing waits, past its timeout, for messages it knows are on their way
# (ready in the queue while it has room, or being counted again): a bound, reached only under load.
_SETTLE_WAIT = 5.0
_SYNC_WAIT = 10.0
# How long counting a queue's messages retries an unreachable RabbitMQ: an operator's look, not a mail.
_COUNT_WAIT = 5.0
_MISSING = object()  # what a waiting receive finds when its queue vanished

T = TypeVar("T")


def queue_name(queue: str) -> str:
    return f"mailq:{queue}"


def dead_letter_queue(queue: str) -> str:
    return f"mailq-dead-letters:{queue}"


class RabbitMQBroker:
    """The Broker of the distributed deployment (see the module's text). The password comes from the
    caller, which reads it from the environment; no error or log line shows it."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 5672,
        vhost: str = "/",
        user: str = "guest",
        password: str = "guest",
        *,
        clock: Clock = system_clock,
        visibility_timeout: int = 300 * MICROS_PER_SECOND,
        prefetch: int = 50,
        delivery_limit: int = 20,
        publish_timeout: float = 30.0,
        heartbeat: int = 30,
    ) -> None:
        for name, value in (("prefetch", prefetch), ("delivery_limit", delivery_limit)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
                raise InvalidInput(f"invalid {name} {shown(value)}: expected an integer 1..65535")
        self.clock = clock
        self.visibility_timeout = visibility_timeout
        self.prefetch = prefetch
        self.delivery_limit = delivery_limit
        self.publish_timeout = publish_timeout
        self.target = f"{host}:{port} (vhost {vhost!r}, user {user!r})"
        self._parameters = pika.ConnectionParameters(
            host=host,
            port=port,
            virtual_host=vhost,
            credentials=pika.PlainCredentials(user, password),
            heartbeat=heartbeat,
            connection_attempts=1,
            socket_timeout=10,
            stack_timeout=15,
        )
        self._declared: set[str] = set()
        self._declare_lock = threading.Lock()
        self._consumers: dict[str, Consumer] = {}
        self._consumers_lock = threading.Lock()
        self._closed = False
        self._link: Link | None = None
        self._link_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RabbitMQBroker({self.target})"

    def _started(self) -> Link:
        """The I/O thread, started by the first use: opening a runtime to read it connects nowhere."""
        link = self._link
        if link is None:
            with self._link_lock:
                self._usable()
                if self._link is None:
                    self._link = Link(
                        self._parameters, self.target, self.prefetch, self.delivery_limit, self.clock
                    )
                    self._link.start()
                link = self._link
        return link

    # Publishing.

    def publish(self, queue: str, enqueue_id: str, payload: str, priority: int) -> None:
        """Returns once RabbitMQ confirmed the message. Across a lost connection it is sent again until
        confirmed; BrokerUnavailable after `publish_timeout` seconds without a confirmation (the message
        may still arrive later: a caller that publishes it again may deliver it twice)."""
        deadline = time.monotonic() + self.publish_timeout
        properties = pika.BasicProperties(
            message_id=enqueue_id,
            delivery_mode=pika.DeliveryMode.Persistent,
            content_type="application/json",
            priority=priority,
        )
        body = payload.encode()
        while True:
            link = self._started()
            self._declare(queue, deadline)
            publish = Publish(queue_name(queue), enqueue_id, body, properties)
            waiter = publish.waiter
            assert waiter is not None
            link.submit(partial(link.send, publish))
            if not waiter.wait(deadline - time.monotonic()):
                link.submit(partial(link.abandon, publish))
                raise BrokerUnavailable(
                    f"RabbitMQ at {self.target} confirmed no publish of mail {enqueue_id} within "
                    f"{self.publish_timeout:g} s ({link.error or 'no answer'})"
                ) from link.failure
            if waiter.outcome is ROUTE_LOST:
                self._declared.discard(queue)  # deleted behind our back: declared again, sent again
                continue
            if isinstance(waiter.outcome, BaseException):
                raise waiter.outcome
            self._stir(queue_name(queue))
            return

    def _stir(self, name: str) -> None:
        """This process changed what RabbitMQ queue `name` holds: its consumer's next receive catches up
        with what RabbitMQ sent it since, so that it hands out the best message, not the best received."""
        consumer = self._consumers.get(name)
        if consumer is not None:
            with consumer.cond:
                consumer.dirty = True

    def published(self, queue: str, enqueue_ids: list[str]) -> set[str]:
        """Which of these mails RabbitMQ holds: those this broker's consumer holds, and those ready in the
        queue, which AMQP shows only by taking them, so each is taken and published again as it was (its
        count kept, its priority too), then acked. Messages other processes hold unacknowledged are not
        seen: republish sends those again, and the view's deletion marks absorb the duplicate."""
        wanted = set(enqueue_ids)
        if not wanted:
            return set()
        deadline = time.monotonic() + self.publish_timeout
        held = {enqueue_id for enqueue_id, _ in self.held(queue)}
        self._started()
        self._declare(queue, deadline)
        seen = self._blocking(partial(self._browse, queue), deadline, f"browse the messages of {queue}")
        # Again afterwards: a message pushed to this consumer meanwhile was neither ready nor held before.
        held |= {enqueue_id for enqueue_id, _ in self.held(queue)}
        return (held | seen) & wanted

    def _browse(self, queue: str, channel: Any) -> set[str]:
        name = queue_name(queue)
        ready = channel.queue_declare(name, passive=True).method.message_count
        channel.confirm_delivery()
        seen = set()
        # At most the messages ready at the start: the copies go to the queue's end and must not be
        # taken again.
        for _ in range(ready):
            method, properties, body = channel.basic_get(name)
            if method is None:
                break
            seen.add(properties.message_id or "")
            routing_key = name
            if method.redelivered:
                routing_key, properties = redelivery(
                    properties, name, dead_letter_queue(queue), self.delivery_limit, self.clock
                )
            channel.basic_publish("", routing_key, body, properties=properties)  # returns once confirmed
            channel.basic_ack(method.delivery_tag)
        return seen

    def counts(self, queue: str) -> BrokerCounts:
        """The messages ready in the queue and in its dead-letter queue, from passive declares, which
        create nothing. AMQP does not tell how many a queue's consumers hold unacknowledged, nor which."""
        deadline = time.monotonic() + _COUNT_WAIT
        ready, dead = self._blocking(
            partial(self._ready_counts, queue), deadline, f"count the messages of {queue}"
        )
        return BrokerCounts(ready=ready, leased=None, dead_letters=dead)

    def _ready_counts(self, queue: str, channel: Any) -> tuple[int, int]:
        counts = []
        for name in (queue_name(queue), dead_letter_queue(queue)):
            try:
                counts.append(channel.queue_declare(name, passive=True).method.message_count)
            except pika.exceptions.ChannelClosedByBroker as error:
                if error.reply_code != 404:
                    raise
                # Not declared yet (no mail of the queue was ever published): it holds nothing. The
                # broker closed the channel, so the next declare takes a new one.
                counts.append(0)
                channel = channel.connection.channel()
        return counts[0], counts[1]

    # Consuming.

    def receive(self, queue: str, timeout: float | None) -> Delivery | None:
        """The next message (highest priority, then oldest); None once `timeout` seconds pass with
        nothing deliverable, also while RabbitMQ cannot be reached (the broker reconnects meanwhile)."""
        started = time.monotonic()
        deadline = None if timeout is None else started + max(timeout, 0.0)
        while True:
            consumer = self._consumer(queue, queue_name(queue), deadline)
            if consumer is None:
                return None
            self._expire(consumer)
            with self._asking(consumer):
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
            handle=Handle(consumer, epoch, tag),
        )

    @contextmanager
    def _asking(self, consumer: Consumer) -> Iterator[None]:
        """A caller waits for the consumer's messages meanwhile: an idle consumer consumes again."""
        with consumer.cond:
            consumer.asking(+1)
            paused = consumer.paused
        if paused:
            link = self._started()
            link.submit(partial(link.resume, consumer))
        try:
            yield
        finally:
            with consumer.cond:
                consumer.asking(-1)

    def _expire(self, consumer: Consumer) -> None:
        """Give back the deliveries of this process whose lease has ended, so that a receive may take them."""
        now = self.clock()
        with consumer.cond:
            ended = [tag for tag, (_, until) in consumer.outstanding.items() if until <= now]
            for tag in ended:
                del consumer.outstanding[tag]
            epoch = consumer.epoch
        if not ended:
            return
        link = self._started()
        with consumer.cond:
            consumer.dirty = True
        for tag in ended:
            link.submit(partial(link.settle, consumer, epoch, tag, True))

    def _take(self, consumer: Consumer, started: float, deadline: float | None) -> Any:
        """The consumer's next message (epoch, tag, properties, body), handed out under a lease; None at the
        deadline with nothing on its way, or once closed; _MISSING when its queue must be declared again."""
        settle_until = None
        while True:
            if consumer.dirty or consumer.republishing:
                self._catch_up(consumer)
            with consumer.cond:
                while True:
                    self._not_refused()
                    if consumer.missing:
                        return _MISSING
                    taken = consumer.take()
                    if taken is not None:
                        properties = taken[2]
                        lease = [properties.message_id or "", self.clock() + self.visibility_timeout]
                        consumer.outstanding[taken[1]] = lease
                        return taken
                    now = time.monotonic()
                    if self._closed:
                        return None
                    end = deadline
                    if not consumer.live and not consumer.ever_live and end is not None:
                        end = max(end, started + _START_WAIT)
                    if end is not None and now >= end:
                        if not consumer.live:
                            return None
                        break
                    consumer.cond.wait(None if end is None else end - now)
            # Nothing received by the deadline: unless RabbitMQ says something is on its way here.
            now = time.monotonic()
            if settle_until is None:
                settle_until = now + _SETTLE_WAIT
            elif now >= settle_until:
                return None
            ready = self._sync(consumer)
            with consumer.cond:
                if consumer.buffer or consumer.missing:
                    continue
                room = len(consumer.outstanding) + len(consumer.buffer) < self.prefetch
                if ready is None or not (consumer.republishing or (ready and room)):
                    return None
                consumer.cond.wait(min(0.05, max(settle_until - now, 0.001)))

    def _catch_up(self, consumer: Consumer) -> None:
        """Wait until the copies of this process's redelivered messages are confirmed and every message
        RabbitMQ sent the consumer has arrived (bounded: under load this is a best effort)."""
        end = time.monotonic() + _SETTLE_WAIT
        while True:
            with consumer.cond:
                while time.monotonic() < end and (
                    (consumer.republishing and consumer.live) or (consumer.started and not consumer.ever_live)
                ):
                    consumer.cond.wait(max(end - time.monotonic(), 0.001))
                consumer.dirty = False
            if not consumer.live or self._sync(consumer) is None or time.monotonic() >= end:
                return
            with consumer.cond:
                if not consumer.dirty and not consumer.republishing:
                    return

    def _sync(self, consumer: Consumer) -> int | None:
        """The messages ready in the consumer's queue, once every message RabbitMQ sent it before has
        arrived; None without a live channel."""
        link = self._started()
        waiter = Waiter()
        link.submit(partial(link.sync, consumer, waiter))
        return waiter.outcome if waiter.wait(_SYNC_WAIT) else None  # type: ignore[return-value]

    def _consumer(self, queue: str, name: str, deadline: float | None) -> Consumer | None:
        """The consumer of RabbitMQ queue `name` (of mail queue `queue`), started (its queues declared) when
        new or after its queue vanished; None when RabbitMQ could not be reached before the deadline."""
        with self._consumers_lock:
            consumer = self._consumers.get(name)
            if consumer is None:
                counting = dead_letter_queue(queue) if name == queue_name(queue) else None
                consumer = self._consumers[name] = Consumer(name, counting)
        if consumer.started and not consumer.missing:
            return consumer
        link = self._started()
        with consumer.start_lock:
            if consumer.started and not consumer.missing:
                return consumer
            try:
                self._declare(queue, float("inf") if deadline is None else deadline, force=True)
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
            link.submit(partial(link.consume, consumer))
        return consumer

    def held(self, queue: str) -> list[tuple[str, int | None]]:
        """The messages of `queue` this broker holds unsettled, once those RabbitMQ sent it have arrived:
        enqueue id and lease end (microseconds), or None for those received and not handed out yet."""
        consumer = self._consumers.get(queue_name(queue))
        if consumer is None:
            return []
        if consumer.live and not self._closed:
            self._sync(consumer)
        with consumer.cond:
            leased = [(enqueue_id, until) for enqueue_id, until in consumer.outstanding.values()]
            return leased + [(entry[1], None) for entry in consumer.buffer]

    def ack(self, delivery: Delivery) -> bool:
        return self._settle(delivery, requeue=False)

    def requeue(self, delivery: Delivery) -> bool:
        """Give the message back, deliverable again at once; each return counts towards the delivery limit."""
        return self._settle(delivery, requeue=True)

    def extend(self, delivery: Delivery, until: int) -> bool:
        handle: Handle = delivery.handle
        consumer = handle.consumer
        with consumer.cond:
            if not consumer.holds(handle):
                return False
            consumer.outstanding[handle.tag][1] = until
            return True

    def _settle(self, delivery: Delivery, requeue: bool) -> bool:
        handle: Handle = delivery.handle
        consumer = handle.consumer
        with consumer.cond:
            if not consumer.holds(handle):
                return False
            del consumer.outstanding[handle.tag]
            consumer.dirty = consumer.dirty or requeue
        # Not waited for: AMQP answers no ack, and one sent just before a connection dies is lost all the
        # same, the message then being delivered again (at-least-once).
        link = self._started()
        link.submit(partial(link.settle, consumer, handle.epoch, handle.tag, requeue))
        return True

    # Dead letters.

    def drain_dead_letters(self, queue: str, keep: Callable[[list[BrokerDeadLetter]], None]) -> int:
        """Hand the messages RabbitMQ delivered past the delivery limit to `keep`, which records them in the
        metadata store's dead letters, then ack them; returns how many (at most `prefetch` a call).
        Crash-safe order: 1. receive them; 2. `keep`; 3. ack. A crash or a failing `keep` leaves them in
        the dead-letter queue, so `keep` may be handed a letter again: it must replace, not add."""
        deadline = time.monotonic() + _START_WAIT
        consumer = self._consumer(queue, dead_letter_queue(queue), deadline)
        if consumer is None:
            return 0
        taken = []
        with self._asking(consumer):
            with consumer.cond:
                while not consumer.live and not self._closed and time.monotonic() < deadline:
                    consumer.cond.wait(max(deadline - time.monotonic(), 0.001))
            if self._sync(consumer) is None:
                return 0
            with consumer.cond:
                while (one := consumer.take()) is not None:
                    consumer.outstanding[one[1]] = [one[2].message_id or "", LATEST]
                    taken.append(one)
        if not taken:
            return 0
        link = self._started()
        try:
            keep([self._dead_letter(queue, properties, body) for _, _, properties, body in taken])
        except BaseException:
            for epoch, tag, _, _ in taken:
                with consumer.cond:
                    consumer.outstanding.pop(tag, None)
                link.submit(partial(link.settle, consumer, epoch, tag, True))
            raise
        for epoch, tag, _, _ in taken:
            with consumer.cond:
                consumer.outstanding.pop(tag, None)
            link.submit(partial(link.settle, consumer, epoch, tag, False))
        return len(taken)

    def _dead_letter(self, queue: str, properties: pika.BasicProperties, body: bytes) -> BrokerDeadLetter:
        headers = properties.headers or {}
        reason = headers.get(REASON)
        died_at = headers.get(DIED_AT)
        return BrokerDeadLetter(
            queue=queue,
            enqueue_id=properties.message_id or "",
            payload=body.decode("utf-8", errors="replace"),
            reason=reason if isinstance(reason, str) else "RabbitMQ dead-lettered it",
            died_at=int(died_at) if isinstance(died_at, int) else self.clock(),
        )

    # Declaring, on a short connection of the caller's own.

    def _declare(self, queue: str, deadline: float, force: bool = False) -> None:
        """Declare the queue's objects (idempotent)."""
        if queue in self._declared and not force:
            return
        with self._declare_lock:
            if queue in self._declared and not force:
                return
            self._blocking(partial(self._declare_on, queue), deadline, f"declare the queues of {queue}")
            self._declared.add(queue)

    def _declare_on(self, queue: str, channel: Any) -> None:
        channel.queue_declare(
            queue_name(queue),
            durable=True,
            arguments={"x-queue-version": 2, "x-max-priority": MAX_PRIORITY},
        )
        channel.queue_declare(dead_letter_queue(queue), durable=True, arguments={"x-queue-version": 2})

    def _blocking(self, action: Callable[[Any], T], deadline: float, what: str) -> T:
        """Run `action` on a channel of a connection of its own, retrying a lost or refused connection with
        backoff until the deadline."""
        delay = BACKOFF_FIRST
        while True:
            self._usable()
            try:
                connection = _blocking_connection(self._parameters)
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

    def _usable(self) -> None:
        if self._closed:
            raise BrokerUnavailable(f"the broker of RabbitMQ at {self.target} is closed")
        self._not_refused()

    def _not_refused(self) -> None:
        link = self._link
        if link is not None and link.refused is not None:
            raise BrokerRefused(f"RabbitMQ at {self.target}: {link.refused}")

    def close(self) -> None:
        """Stop the I/O thread. Messages received and not settled go back to RabbitMQ; publishes still
        waiting for their confirmation fail."""
        with self._link_lock:
            if self._closed:
                return
            self._closed = True
            link = self._link
        if link is not None:
            link.submit(link.stop)
            link.join(timeout=15)
        for consumer in self._consumers.values():
            with consumer.cond:
                consumer.cond.notify_all()


def _blocking_connection(parameters: pika.ConnectionParameters) -> pika.BlockingConnection:
    """A connection of pika's, failing as pika's connection errors do. pika 1.3 raises ValueError ("Expected
    connected socket") when the server resets the connection right after accepting it, as a server going
    down or a cut link does; it is as unreachable as a refused one."""
    try:
        return pika.BlockingConnection(parameters)
    except ValueError as error:
        raise pika.exceptions.AMQPConnectionError(error) from error
