"""The floor's broker calls on RabbitMQ: what one enqueue and one dequeue + done() ask of the broker, as raw
pika calls on the deployment's node, for queue_floor.py.

  publish   basic_publish of the mail's payload (persistent, its priority, mandatory), waiting for its
            confirmation: an enqueue returns once RabbitMQ has the message
  receive   the next message of a basic_consume with manual acks and the runtime broker's prefetch
  ack       basic_ack of that delivery

Queues are declared as the broker declares its own (classic, `x-max-priority` 9, `x-queue-version` 2),
under names of the run's own, and deleted at the end, as are the mail queues' objects the run names.
Each publishing thread takes a connection of its own from a pool (as many in flight as there are
callers, as with mailq's shared stream of confirmations); the consumers share one connection, the
threads taking turns on it, as mailq's threads take turns on its one I/O thread.

Not a benchmark itself; imported by queue_floor.py and queue_throughput.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from queue import SimpleQueue
from typing import Any

import pika
import pika.exceptions
from messaging_leg import QUEUE_ARGUMENTS
from pika.adapters.blocking_connection import BlockingChannel

from mailq_runtime.brokers.rabbitmq import BrokerOptions, dead_letter_queue, queue_name
from mailq_runtime.settings import AmqpSettings
from mailq_runtime.tls import TlsFiles

# The runtime opens its broker with the default prefetch.
PREFETCH: int = BrokerOptions().prefetch
# The longest a receive waits: every message it expects was published and confirmed before.
_RECEIVE_WAIT = 30


def connection_parameters(amqp: AmqpSettings, tls: TlsFiles) -> pika.ConnectionParameters:
    """As the runtime connects (runtime.py): without a user, RabbitMQ's guest; the password from the
    environment; amqps with the URL's TLS files. No heartbeats: a blocking connection answers them only
    while called, and the floor's sit idle while mailq takes its turn."""
    password = amqp.password()
    if password is None:
        password = "guest" if amqp.user is None else ""
    return pika.ConnectionParameters(
        host=amqp.host,
        port=amqp.port,
        virtual_host=amqp.vhost,
        credentials=pika.PlainCredentials(amqp.user or "guest", password),
        heartbeat=0,
        ssl_options=pika.SSLOptions(tls.context(), server_hostname=amqp.host) if amqp.tls else None,
    )


def mail_queue_objects(queues: Iterable[str]) -> list[str]:
    """The RabbitMQ queues the runtime's broker declares for these mail queues."""
    return [name for queue in queues for name in (queue_name(queue), dead_letter_queue(queue))]


class RabbitMQFloorBroker:
    """The floor's publish, receive and ack on raw pika (see the module's text). `owned` names RabbitMQ
    queues the run will make (the mail queues' objects): refused if one exists already, deleted at the
    end with the floor's own."""

    def __init__(
        self, amqp: AmqpSettings, tls: TlsFiles, tag: str, publishers: int, owned: Iterable[str]
    ) -> None:
        self.parameters = connection_parameters(amqp, tls)
        self.tag = tag
        self.connections: list[pika.BlockingConnection] = []
        self.made: list[str] = []
        self.administration = self._connect()
        self.admin = self.administration.channel()
        for name in owned:
            self._claim(name)
        self.publishers: SimpleQueue[BlockingChannel] = SimpleQueue()
        for _ in range(publishers):
            channel = self._connect().channel()
            channel.confirm_delivery()
            self.publishers.put(channel)
        self.consuming = self._connect()
        self.consumers: dict[str, tuple[BlockingChannel, Iterator]] = {}
        self.turn = threading.Lock()

    def _connect(self) -> pika.BlockingConnection:
        connection = pika.BlockingConnection(self.parameters)
        self.connections.append(connection)
        return connection

    def _claim(self, name: str) -> None:
        """Take `name` as the run's own, refusing it when it exists (a passive declare finds it)."""
        try:
            self.admin.queue_declare(name, passive=True)
        except pika.exceptions.ChannelClosedByBroker as error:
            if error.reply_code != 404:
                raise
            self.admin = self.administration.channel()  # a 404 closes the channel
            self.made.append(name)
            return
        raise SystemExit(f"benchmark: RabbitMQ queue {name} exists: the run deletes its queues at the end")

    def name(self, queue: str) -> str:
        return f"mailq-benchmark-floor-{self.tag}-{queue}"

    def declare(self, queue: str) -> None:
        name = self.name(queue)
        if name not in self.made:
            self._claim(name)
            self.admin.queue_declare(name, durable=True, arguments=QUEUE_ARGUMENTS)

    def publish(self, queue: str, enqueue_id: str, payload: str, priority: int) -> None:
        properties = pika.BasicProperties(
            message_id=enqueue_id,
            delivery_mode=pika.DeliveryMode.Persistent,
            content_type="application/json",
            priority=priority,
        )
        channel = self.publishers.get()
        try:
            channel.basic_publish("", self.name(queue), payload.encode(), properties, mandatory=True)
        finally:
            self.publishers.put(channel)

    def receive(self, queue: str) -> tuple[str, Any]:
        """The next message's enqueue id and its handle for `ack`."""
        with self.turn:
            if queue not in self.consumers:
                channel = self.consuming.channel()
                channel.basic_qos(prefetch_count=PREFETCH)
                consumer = channel.consume(self.name(queue), inactivity_timeout=_RECEIVE_WAIT)
                self.consumers[queue] = (channel, consumer)
            channel, consumer = self.consumers[queue]
            method, properties, _body = next(consumer)
        if method is None:
            raise AssertionError("the floor's broker ran dry before every mail was dequeued")
        return properties.message_id, (channel, method.delivery_tag)

    def ack(self, handle: Any) -> None:
        channel, tag = handle
        with self.turn:
            channel.basic_ack(tag)

    def close(self) -> None:
        try:
            for channel, _ in self.consumers.values():
                channel.cancel()
            for name in self.made:
                self.admin.queue_delete(name)
        finally:
            for connection in self.connections:
                if connection.is_open:
                    connection.close()


def raw_queue(tag: str) -> str:
    """The queue of the raw pika rates (messaging_leg.compare) of run `tag`."""
    return f"mailq-benchmark-raw-{tag}"
