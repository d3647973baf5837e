"""The RabbitMQ broker, the Broker of the distributed deployment: its parts composed (see the package)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial

import pika

from ...errors import BrokerRefused, BrokerUnavailable
from ...tls import certificate_refused
from ..base import BrokerCounts, BrokerDeadLetter, Delivery
from .dead_letters import DeadLetterDrain
from .leases import Leases
from .messages import describe
from .names import QUORUM, band_queue, queue_name
from .options import BrokerOptions
from .publish_channel import ROUTE_LOST
from .publishes import Publish
from .receiver import Receiver
from .session import Session
from .short_connections import ShortConnections, blocking_connection
from .waits import COUNT_WAIT

# pika's words for a connection the server took and then lost (reset or closed), and how many times the
# certificate check asks a node that did that: on a loaded machine a refusal's alert was lost three times
# in a row, and each ask is one short connection.
_LOST_STREAM = "Stream connection lost"
_CHECKS_OF_A_LOST_STREAM = 10


class RabbitMQBroker:
    """The Broker of the distributed deployment (see the package's text). The password comes from the
    caller, which reads it from the environment; no error or log line shows it."""

    def __init__(self, options: BrokerOptions) -> None:
        self.queue_type = options.queue_type
        self.clock = options.clock
        self.visibility_timeout = options.visibility_timeout
        self.prefetch = options.prefetch
        self.delivery_limit = options.delivery_limit
        self.publish_timeout = options.publish_timeout
        nodes = ",".join(f"{one}:{its_port}" for one, its_port in options.hosts)
        self.target = f"{nodes} (vhost {options.vhost!r}, user {options.user!r})"
        # Any node of a cluster serves: the I/O thread tries the next one each time it connects, and a
        # short connection tries them in turn.
        parameters = [
            pika.ConnectionParameters(
                host=one,
                port=its_port,
                virtual_host=options.vhost,
                credentials=pika.PlainCredentials(options.user, options.password),
                heartbeat=options.heartbeat,
                ssl_options=None
                if options.ssl_context is None
                else pika.SSLOptions(options.ssl_context, server_hostname=one),
                connection_attempts=1,
                socket_timeout=10,
                stack_timeout=15,
            )
            for one, its_port in options.hosts
        ]
        self._session = Session(parameters, self.target, options)
        self._declarations = ShortConnections(self._session)
        self._receiver = Receiver(self._session, self._declarations)
        self._leases = Leases(self._session)
        self._dead_letters = DeadLetterDrain(self._session, self._receiver)

    def __repr__(self) -> str:
        return f"RabbitMQBroker({self.target})"

    def check_certificates(self) -> None:
        """For amqps, one short connection to the first node that answers: a certificate that fails
        verification, the server's or this client's, is BrokerRefused now, at open, naming the node and
        the reason (waiting does not cure it). A broker that does not answer passes: the queue rides out
        its outage as it does on amqp."""
        if self._session.options.ssl_context is None:
            return
        for parameters in self._session.parameters:
            # In TLS 1.3 the server judges a client certificate after the client's side of the handshake:
            # its alert may be lost to the reset of a connection closed with the client's first bytes
            # unread, which looks like a broker going away. A node that took the connection and then
            # lost it is asked again, so that a refusal is not mistaken for an outage.
            for _ in range(_CHECKS_OF_A_LOST_STREAM):
                try:
                    blocking_connection([parameters]).close()
                    return
                except pika.exceptions.AMQPError as error:
                    if certificate_refused(error):
                        node = f"{parameters.host}:{parameters.port}"
                        raise BrokerRefused(f"RabbitMQ at {node} (amqps): {describe(error)}") from None
                    if _LOST_STREAM not in str(error):
                        break

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
            link = self._session.started()
            if link.down:
                raise BrokerUnavailable(
                    f"RabbitMQ at {self.target} is unreachable ({link.error})"
                ) from link.failure
            self._declarations.declare(queue, deadline)
            publish = Publish(self._route(queue, priority), enqueue_id, body, properties)
            waiter = publish.waiter
            assert waiter is not None
            link.submit(partial(link.publishing.send, publish))
            if not waiter.wait(deadline - time.monotonic()):
                link.submit(partial(link.publishing.abandon, publish))
                if self.queue_type == QUORUM:
                    link.submit(link.publishing.reconnect)
                raise BrokerUnavailable(
                    f"RabbitMQ at {self.target} confirmed no publish of mail {enqueue_id} within "
                    f"{self.publish_timeout:g} s ({link.error or 'no answer'})"
                ) from link.failure
            if waiter.outcome is ROUTE_LOST:
                self._declarations.forget(queue)  # deleted behind our back: declared again, sent again
                continue
            if isinstance(waiter.outcome, BaseException):
                raise waiter.outcome
            self._receiver.stir(queue_name(queue))
            return

    def publish_many(self, queue: str, messages: Sequence[tuple[str, str, int]]) -> None:
        for enqueue_id, payload, priority in messages:
            self.publish(queue, enqueue_id, payload, priority)

    def _route(self, queue: str, priority: int) -> str:
        """The RabbitMQ queue a message of mail queue `queue` and `priority` goes to."""
        return band_queue(queue, priority) if self.queue_type == QUORUM else queue_name(queue)

    def published(self, queue: str, enqueue_ids: list[str]) -> set[str]:
        """Which of these mails RabbitMQ holds: those this broker's consumer holds, and those ready in the
        queue, which AMQP shows only by taking them, so each is taken and published again as it was (its
        count kept, its priority too), then acked. Messages other processes hold unacknowledged are not
        seen: republish sends those again, and the view's deletion marks absorb the duplicate."""
        wanted = set(enqueue_ids)
        if not wanted:
            return set()
        deadline = time.monotonic() + self.publish_timeout
        held = {enqueue_id for enqueue_id, _ in self._receiver.held(queue)}
        self._session.started()
        self._declarations.declare(queue, deadline)
        seen = self._declarations.blocking(
            partial(self._declarations.browse, queue), deadline, f"browse the messages of {queue}"
        )
        # Again afterwards: a message pushed to this consumer meanwhile was neither ready nor held before.
        held |= {enqueue_id for enqueue_id, _ in self._receiver.held(queue)}
        return (held | seen) & wanted

    def counts(self, queue: str) -> BrokerCounts:
        """The messages ready in the queue and in its dead-letter queue, from passive declares, which
        create nothing. AMQP does not tell how many a queue's consumers hold unacknowledged, nor which."""
        deadline = time.monotonic() + COUNT_WAIT
        ready, dead = self._declarations.blocking(
            partial(self._declarations.ready_counts, queue), deadline, f"count the messages of {queue}"
        )
        return BrokerCounts(ready=ready, leased=None, dead_letters=dead)

    # Consuming.

    def receive(self, queue: str, timeout: float | None) -> Delivery | None:
        return self._receiver.receive(queue, timeout)

    def receive_ready(self, queue: str, limit: int) -> list[Delivery]:
        deliveries: list[Delivery] = []
        while len(deliveries) < limit and (delivery := self.receive(queue, 0)) is not None:
            deliveries.append(delivery)
        return deliveries

    def held(self, queue: str) -> list[tuple[str, int | None]]:
        return self._receiver.held(queue)

    def ack(self, delivery: Delivery) -> bool:
        return self._leases.ack(delivery)

    def requeue(self, delivery: Delivery) -> bool:
        return self._leases.requeue(delivery)

    def release(self, delivery: Delivery) -> bool:
        return self._leases.release(delivery)

    def extend(self, delivery: Delivery, until: int) -> bool:
        return self._leases.extend(delivery, until)

    def drain_dead_letters(self, queue: str, keep: Callable[[list[BrokerDeadLetter]], None]) -> int:
        return self._dead_letters.drain(queue, keep)

    def close(self) -> None:
        """Stop the I/O thread. Messages received and not settled go back to RabbitMQ; publishes still
        waiting for their confirmation fail."""
        self._session.close()
        self._receiver.wake_all()
