"""The deployments' assembly: `build` makes a deployment's backends from its settings (the embedded store,
or Cassandra, S3 and a broker), `table_reader` the store's tables as the pipeline reads them (tables.py).
Nothing else names a backend's classes; runtime.py builds the queues, blobs and mailboxes on top.

Each deployment supplies its unit of work (unit_of_work.py), which may group the writes of one operation
and hold the store over a whole queue operation, for speed only: the embedded store's transaction and
turn; nothing on any other deployment.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .blobs.sqlite_store import SqliteBlobStore
from .blobs.store import BlobStore
from .brokers.base import Broker
from .brokers.embedded import EmbeddedBroker
from .clock import Clock, system_clock
from .errors import InvalidInput, NoStore
from .metrics import count_calls
from .settings import CASSANDRA, Settings
from .stores.embedded import (
    EmbeddedBlobTables,
    EmbeddedConfigurationEvents,
    EmbeddedDeadLetters,
    EmbeddedDelayedMails,
    EmbeddedDestinations,
    EmbeddedHeldMails,
    EmbeddedMailboxTables,
    EmbeddedQueueView,
    EmbeddedStore,
)
from .stores.embedded.files import DATABASE_FILE, check_data_dir
from .stores.protocols import (
    BlobTables,
    ConfigurationEvents,
    DeadLetters,
    DelayedMails,
    Destinations,
    HeldMails,
    MailboxTables,
    QueueView,
)
from .tables import TableReader
from .unit_of_work import UNGROUPED, GroupedWork, UnitOfWork

if TYPE_CHECKING:  # the drivers are imported only by a process on the distributed deployment
    from .blobs.s3_store import S3BlobStore
    from .stores.cassandra import CassandraStore


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
    held_mails: HeldMails
    destinations: Destinations
    work: UnitOfWork
    created: bool  # whether this open made the store
    close: Callable[[], None]


def build(settings: Settings, clock: Clock = system_clock, *, create: bool = False) -> Deployment:
    """The backends of `settings`' deployment. With `create`, what is missing of the store and its
    schema is made; without, nothing is written and a missing store is NoStore."""
    if settings.backend == CASSANDRA:
        deployment = _distributed(settings, clock, create)
    else:
        deployment = _embedded(settings, clock, create)
    _count_calls(deployment)
    return deployment


def _count_calls(deployment: Deployment) -> None:
    """Each backend call counted in `mailq_backend_calls_total` by backend and kind (`view.insert` ...)."""
    for attribute, protocol in (
        ("view", QueueView),
        ("broker", Broker),
        ("blob_tables", BlobTables),
        ("content", BlobStore),
        ("mailbox_tables", MailboxTables),
        ("dead_letters", DeadLetters),
        ("delayed_mails", DelayedMails),
    ):
        count_calls(getattr(deployment, attribute), protocol, attribute)


def _embedded(settings: Settings, clock: Clock, create: bool) -> Deployment:
    store = EmbeddedStore(settings.data_dir, settings.durability, create)
    return Deployment(
        view=EmbeddedQueueView(store),
        configuration_events=EmbeddedConfigurationEvents(store),
        broker=EmbeddedBroker(store, clock, settings.visibility_timeout),
        blob_tables=EmbeddedBlobTables(store),
        content=SqliteBlobStore(store),
        mailbox_tables=EmbeddedMailboxTables(store),
        dead_letters=EmbeddedDeadLetters(store),
        delayed_mails=EmbeddedDelayedMails(store),
        held_mails=EmbeddedHeldMails(store),
        destinations=EmbeddedDestinations(store),
        work=GroupedWork(store.transaction, store.turn, store.in_turn, store.in_group),
        created=store.created,
        close=store.close,
    )


def _rabbitmq(settings: Settings, clock: Clock) -> Broker:
    """The RabbitMQ broker of an amqp:// broker option; it connects at its first use. Without a user in
    the URL, RabbitMQ's own guest (whose password is guest); the password comes from MAILQ_AMQP_PASSWORD."""
    from .brokers.rabbitmq import BrokerOptions, RabbitMQBroker

    amqp = settings.amqp
    assert amqp is not None
    password = amqp.password()
    if password is None:
        password = "guest" if amqp.user is None else ""
    options = BrokerOptions(
        amqp.host,
        amqp.port,
        amqp.vhost,
        amqp.user or "guest",
        password,
        more_hosts=amqp.more_hosts,
        queue_type=amqp.queues,
        clock=clock,
        visibility_timeout=settings.visibility_timeout,
        ssl_context=settings.tls_files.context() if amqp.tls else None,
    )
    return RabbitMQBroker(options)


def open_cassandra(settings: Settings, *, create: bool = False) -> CassandraStore:
    """The Cassandra store of a distributed deployment's settings, the password from the environment of
    the process that connects (the runtime's, or a Spark task's)."""
    from .stores.cassandra import CassandraOptions, CassandraStore

    cassandra = settings.cassandra
    if cassandra is None:
        raise InvalidInput(f"{settings.shown()} names no Cassandra store")
    (host, port), *others = cassandra.contact_points
    if any(other_port != port for _, other_port in others):
        raise InvalidInput(
            f"the Cassandra hosts of {settings.shown()} name different ports: the driver takes one port"
        )
    options = CassandraOptions(
        [host for host, _ in cassandra.contact_points],
        cassandra.keyspace,
        port=port,
        username=cassandra.user,
        password=cassandra.password(),
        consistency=cassandra.consistency,
        replication={"class": "SimpleStrategy", "replication_factor": cassandra.replication},
        ssl_context=settings.tls_files.context() if cassandra.tls else None,
    )
    return CassandraStore(options, create=create)


# This process's table readers, by the store they read: a Spark worker runs many tasks and keeps its
# Cassandra session for the next ones.
_table_readers: dict[tuple, TableReader] = {}
_table_readers_lock = threading.Lock()


def table_reader(settings: Settings) -> TableReader:
    """The tables of `settings`' store as the pipeline reads them (tables.py), made at the first call in
    this process and kept until it exits; it connects (never creating) at its first read. The other store's
    driver is never imported."""
    key = (settings.backend, settings.data_dir, settings.cassandra)
    with _table_readers_lock:
        reader = _table_readers.get(key)
        if reader is None:
            reader = _table_readers[key] = _open_table_reader(settings)
    return reader


def _open_table_reader(settings: Settings) -> TableReader:
    if settings.backend == CASSANDRA:
        from .stores.cassandra.table_reader import CassandraTableReader

        return CassandraTableReader(lambda: open_cassandra(settings))
    from .stores.embedded.table_reader import EmbeddedTableReader

    assert settings.data_dir is not None
    return EmbeddedTableReader.of(settings.data_dir, settings.shown())


def _s3_store(settings: Settings) -> S3BlobStore:
    from .blobs.s3_store import S3BlobStore

    s3 = settings.s3
    if s3 is None:
        raise InvalidInput(f"{settings.shown()} names no S3 bucket")
    return S3BlobStore(
        s3.bucket, endpoint_url=s3.endpoint, region=s3.region, prefix=s3.prefix, tls=settings.tls_files
    )


def _distributed(settings: Settings, clock: Clock, create: bool) -> Deployment:
    """Cassandra for the metadata, S3 for the content, RabbitMQ or the embedded broker in its own
    directory. The drivers are imported here, so that a process on the embedded deployment never loads
    them.

    Each link is reached before anything is made: RabbitMQ's certificates checked and the bucket looked
    at, then the keyspace opened (made, with `create`), then the bucket and the embedded broker's store
    made where missing. So a link that fails (a certificate refused, an endpoint away) leaves nothing made
    on the others, and a mistyped URL's missing keyspace is named before its missing bucket."""
    from .stores.cassandra import (
        CassandraBlobTables,
        CassandraConfigurationEvents,
        CassandraDeadLetters,
        CassandraDelayedMails,
        CassandraDestinations,
        CassandraHeldMails,
        CassandraMailboxTables,
        CassandraQueueView,
    )

    opened: list[Callable[[], None]] = []
    try:
        broker: Broker | None = None
        if settings.amqp is not None:
            rabbitmq = _rabbitmq(settings, clock)
            opened.append(rabbitmq.close)
            rabbitmq.check_certificates()
            broker = rabbitmq
        content = _s3_store(settings)
        opened.append(content.close)
        try:
            content.open_bucket(create=False)
            missing_bucket = None
        except NoStore as missing:
            missing_bucket = missing
        metadata = open_cassandra(settings, create=create)
        opened.append(metadata.close)
        if missing_bucket is not None:
            if not create:
                raise missing_bucket
            content.open_bucket(create=True)
        if broker is None:
            assert settings.data_dir is not None
            broker_store = EmbeddedStore(settings.data_dir, settings.durability, create)
            opened.append(broker_store.close)
            broker = EmbeddedBroker(broker_store, clock, settings.visibility_timeout)
    except BaseException:
        for close in reversed(opened):
            close()
        raise

    def close() -> None:
        for close_one in reversed(opened):
            close_one()

    return Deployment(
        view=CassandraQueueView(metadata),
        configuration_events=CassandraConfigurationEvents(metadata),
        broker=broker,
        blob_tables=CassandraBlobTables(metadata),
        content=content,
        mailbox_tables=CassandraMailboxTables(metadata),
        dead_letters=CassandraDeadLetters(metadata),
        delayed_mails=CassandraDelayedMails(metadata, settings.clock_skew_grace),
        held_mails=CassandraHeldMails(metadata),
        destinations=CassandraDestinations(metadata),
        # The broker's store is not held over operations that spend their time waiting on Cassandra and S3.
        work=UNGROUPED,
        created=metadata.created,
        close=close,
    )


def data_dir_holds_store(data_dir: Path) -> bool:
    """Whether `data_dir` holds an embedded store (the embedded deployment's, or the embedded broker's of a
    distributed one): False when it does not exist or holds none; StoreUnusable when it is not a directory
    the running user owns and may write."""
    return check_data_dir(data_dir) and (data_dir / DATABASE_FILE).exists()


def s3_content_sample(settings: Settings) -> str | None:
    """One blob id whose content the S3 bucket of `settings` holds under its prefix, or None: looked at
    without the metadata store (a deployment opens its keyspace first), and None when the bucket does
    not exist yet."""
    content = _s3_store(settings)
    try:
        content.open_bucket(create=False)
        return next(iter(content.list_ids()), None)
    except NoStore:
        return None
    finally:
        content.close()
