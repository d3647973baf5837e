"""The composition root: `build` makes a deployment's backends from its settings, `Runtime` the queues,
blobs and mailboxes on top of them. Nothing else names a backend's classes.

Opening writes nothing. A runtime opened with `create=True` (what `mailq enqueue`, `worker`, `config set`
and `schema create` do) makes what is missing: the store and its schema, the first reference generation,
and the configuration event (the URL's values registered over the stored ones). Without it, a store that
does not exist is NoStore naming the place looked at, so a mistyped URL never starts an empty store, and
the configuration is read as stored (the defaults while none is).

`group_writes` is an optimisation, never a correctness need: the core is correct when every backend call
commits on its own, and may wrap the writes of one operation in `group_writes()` so that a deployment
able to do so commits them at once. The embedded deployment's is its store's transaction (which also
holds the store's turn, see stores/embedded.py); any other's is `contextlib.nullcontext`. So is `one_turn`,
held over a whole queue operation, its reads and its own work included: the embedded store's turn, so that
the threads of a process take turns rather than hand the GIL and the connection back and forth between
their statements; nothing on any other deployment.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from types import TracebackType
from typing import TYPE_CHECKING

from .blobs.dedup import BlobTables, DeduplicatingBlobStore, Generations
from .blobs.sqlite_store import SqliteBlobStore
from .blobs.store import BlobStore
from .brokers.base import Broker
from .brokers.embedded import EmbeddedBroker
from .clock import Clock, system_clock
from .config import ConfigurationEvents, ConfigurationStore
from .errors import InvalidInput, UnknownQueue
from .faults import FaultInjector
from .mailbox import Mailboxes, MailboxTables
from .model import QueueName
from .queue import MailQueue
from .queue_view import QueueView
from .settings import CASSANDRA, Settings
from .stores.dead_letters import DeadLetters
from .stores.delayed_mails import DelayedMails
from .stores.embedded import EmbeddedStore
from .stores.embedded_blobs import EmbeddedBlobTables
from .stores.embedded_dead_letters import EmbeddedDeadLetters
from .stores.embedded_delayed_mails import EmbeddedDelayedMails
from .stores.embedded_mailboxes import EmbeddedMailboxTables
from .stores.embedded_queue_view import EmbeddedQueueView

if TYPE_CHECKING:  # the driver is imported only by a process on the distributed deployment
    from .stores.cassandra import CassandraStore

GroupWrites = Callable[[], AbstractContextManager]


@dataclass(frozen=True)
class Deployment:
    """The backends of one deployment: the metadata tables, the broker and the blob content."""

    view: QueueView
    configuration_events: ConfigurationEvents
    broker: Broker
    blob_tables: BlobTables
    content: BlobStore
    mailbox_tables: MailboxTables
    dead_letters: DeadLetters
    delayed_mails: DelayedMails
    group_writes: GroupWrites
    one_turn: GroupWrites
    created: bool  # whether this open made the store
    close: Callable[[], None]


def build(settings: Settings, clock: Clock = system_clock, *, create: bool = False) -> Deployment:
    """The backends of `settings`' deployment. With `create`, what is missing of the store and its
    schema is made; without, nothing is written and a missing store is NoStore."""
    if settings.backend == CASSANDRA:
        return _distributed(settings, clock, create)
    return _embedded(settings, clock, create)


def _embedded(settings: Settings, clock: Clock, create: bool) -> Deployment:
    store = EmbeddedStore(settings.data_dir, settings.durability, create)
    view = EmbeddedQueueView(store)
    return Deployment(
        view=view,
        configuration_events=view,
        broker=EmbeddedBroker(store, clock, settings.visibility_timeout),
        blob_tables=EmbeddedBlobTables(store),
        content=SqliteBlobStore(store),
        mailbox_tables=EmbeddedMailboxTables(store),
        dead_letters=EmbeddedDeadLetters(store),
        delayed_mails=EmbeddedDelayedMails(store),
        group_writes=store.transaction,
        one_turn=store.turn,
        created=store.created,
        close=store.close,
    )


def _rabbitmq(settings: Settings, clock: Clock) -> Broker:
    """The RabbitMQ broker of an amqp:// broker option; it connects at its first use. Without a user in
    the URL, RabbitMQ's own guest (whose password is guest); the password comes from MAILQ_AMQP_PASSWORD."""
    from .brokers.rabbitmq import RabbitMQBroker

    amqp = settings.amqp
    assert amqp is not None
    password = amqp.password()
    if password is None:
        password = "guest" if amqp.user is None else ""
    return RabbitMQBroker(
        amqp.host,
        amqp.port,
        amqp.vhost,
        amqp.user or "guest",
        password,
        more_hosts=amqp.more_hosts,
        queue_type=amqp.queues,
        clock=clock,
        visibility_timeout=settings.visibility_timeout,
    )


def open_cassandra(settings: Settings, *, create: bool = False) -> CassandraStore:
    """The Cassandra store of a distributed deployment's settings, the password from the environment of
    the process that connects (the runtime's, or a Spark task's)."""
    from .stores.cassandra import CassandraStore

    cassandra = settings.cassandra
    if cassandra is None:
        raise InvalidInput(f"{settings.shown()} names no Cassandra store")
    (host, port), *others = cassandra.contact_points
    if any(other_port != port for _, other_port in others):
        raise InvalidInput(
            f"the Cassandra hosts of {settings.shown()} name different ports: the driver takes one port"
        )
    return CassandraStore(
        [host for host, _ in cassandra.contact_points],
        cassandra.keyspace,
        port=port,
        username=cassandra.user,
        password=cassandra.password(),
        consistency=cassandra.consistency,
        replication={"class": "SimpleStrategy", "replication_factor": cassandra.replication},
        create=create,
    )


def _distributed(settings: Settings, clock: Clock, create: bool) -> Deployment:
    """Cassandra for the metadata, S3 for the content, RabbitMQ or the embedded broker in its own
    directory. The drivers are imported here, so that a process on the embedded deployment never loads
    them."""
    from .blobs.s3_store import S3BlobStore
    from .stores.cassandra import (
        CassandraBlobTables,
        CassandraDeadLetters,
        CassandraDelayedMails,
        CassandraMailboxTables,
        CassandraQueueView,
    )

    s3 = settings.s3
    assert s3 is not None
    opened: list[Callable[[], None]] = []
    try:
        # The keyspace first: it is what a mistyped URL most likely names wrong.
        metadata = open_cassandra(settings, create=create)
        opened.append(metadata.close)
        content = S3BlobStore(s3.bucket, endpoint_url=s3.endpoint, region=s3.region, prefix=s3.prefix)
        opened.append(content.close)
        content.open_bucket(create)
        broker: Broker
        if settings.amqp is not None:
            broker = _rabbitmq(settings, clock)
            opened.append(broker.close)
        else:
            assert settings.data_dir is not None
            broker_store = EmbeddedStore(settings.data_dir, settings.durability, create)
            opened.append(broker_store.close)
            broker = EmbeddedBroker(broker_store, clock, settings.visibility_timeout)
    except BaseException:
        for close in reversed(opened):
            close()
        raise
    view = CassandraQueueView(metadata)

    def close() -> None:
        for close_one in reversed(opened):
            close_one()

    return Deployment(
        view=view,
        configuration_events=view,
        broker=broker,
        blob_tables=CassandraBlobTables(metadata),
        content=content,
        mailbox_tables=CassandraMailboxTables(metadata),
        dead_letters=CassandraDeadLetters(metadata),
        delayed_mails=CassandraDelayedMails(metadata, settings.clock_skew_grace),
        group_writes=nullcontext,
        # The broker's store is not held over operations that spend their time waiting on Cassandra and S3.
        one_turn=nullcontext,
        created=metadata.created,
        close=close,
    )


class Runtime:
    def __init__(
        self, settings: Settings, clock: Clock = system_clock, create: bool = False, group_writes: bool = True
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.deployment = build(settings, clock, create=create)
        try:
            self._build(settings, clock, create, group_writes)
        except BaseException:
            self.deployment.close()
            raise

    def _build(self, settings: Settings, clock: Clock, create: bool, group_writes: bool) -> None:
        deployment = self.deployment
        # One injector for the whole runtime (off unless a test arms it: see faults.py).
        self.faults = FaultInjector()
        # `group_writes` is an optimisation, never a correctness need: the core orders the writes of every
        # path so that each may commit alone (as on Cassandra). The embedded store may group one step's
        # writes into one SQLite transaction, which costs one commit instead of several; tests turn it
        # off to see every write commit alone, and the threads of one process interleave their operations.
        group = deployment.group_writes if group_writes else nullcontext
        self.group_writes = group
        self.one_turn = deployment.one_turn if group_writes else nullcontext
        self.view = deployment.view
        self.broker = deployment.broker
        self.blob_tables = deployment.blob_tables
        self.content = deployment.content
        self.dead_letters = deployment.dead_letters
        self.delayed_mails = deployment.delayed_mails
        self.blobs = DeduplicatingBlobStore(self.blob_tables, self.content, clock, self.faults, group)
        self.mailboxes = Mailboxes(
            deployment.mailbox_tables, self.blobs, clock, settings.max_message_size, self.faults, group
        )
        self.configuration = ConfigurationStore(deployment.configuration_events, clock)
        if create:
            # Registered even when nothing is asked, so the configuration in effect is an event that every
            # later change is checked against.
            self.configuration.register(
                replace(self.configuration.current(), **(settings.view_configuration or {}))
            )
        # Read once, as James does at start-up, to write with: the rules on changes keep what a process
        # holding a stale value writes findable (old slices are multiples of new ones, old buckets a subset
        # of new ones), and browse_start stays behind the slices such a process may still fill
        # (`MailQueue.browse_start_limit`).
        self.view_configuration = self.configuration.current()
        self._queues: dict[str, MailQueue] = {}

    @classmethod
    def open(
        cls,
        url: str | None = None,
        *,
        clock: Clock = system_clock,
        create: bool = False,
        group_writes: bool = True,
    ) -> Runtime:
        """Open the runtime of `url`, or of $MAILQ_URL, or the embedded default `embedded://.mailq`.
        Writes nothing, and raises NoStore where there is no store, unless `create` (see the module)."""
        return cls(Settings.from_url(url), clock, create, group_writes)

    @property
    def generations(self) -> Generations:
        return self.blobs.generations

    def queue(self, name: str, *, create: bool = True) -> MailQueue:
        """The named queue. It writes nothing: a queue is created by its first enqueue, once that mail is
        accepted, so bad input never leaves an empty queue behind. With `create=False` a name no enqueue
        has created yet raises UnknownQueue."""
        name = QueueName(name)
        if not create and not self.view.queue_exists(name):
            raise UnknownQueue(f"unknown queue {name!r}: known queues are {self.queues()}")
        queue = self._queues.get(name)
        if queue is None:
            queue = MailQueue(
                name,
                self.view,
                self.broker,
                self.blobs,
                self.dead_letters,
                self.delayed_mails,
                self.view_configuration,
                self.configuration,
                self.clock,
                self.settings.max_message_size,
                self.settings.clock_skew_grace,
                group_writes=self.group_writes,
                one_turn=self.one_turn,
                faults=self.faults,
            )
            self._queues[name] = queue
        return queue

    def queues(self) -> list[str]:
        return self.view.queue_names()

    def close(self) -> None:
        self.broker.close()
        self.deployment.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.close()
