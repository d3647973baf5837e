"""Builds the whole runtime (store, broker, blob stores, queues, mailboxes) from one settings URL."""

from __future__ import annotations

from dataclasses import replace
from types import TracebackType

from .blobs.dedup import DeduplicatingBlobStore, Generations
from .blobs.sqlite_store import SqliteBlobStore
from .brokers.embedded import EmbeddedBroker
from .clock import Clock, system_clock
from .config import ConfigurationStore
from .errors import UnknownQueue
from .faults import FaultInjector
from .mailbox import Mailboxes
from .model import QueueName
from .queue import MailQueue
from .settings import Settings
from .stores.embedded import EmbeddedStore
from .stores.embedded_blobs import EmbeddedBlobTables
from .stores.embedded_dead_letters import EmbeddedDeadLetters
from .stores.embedded_delayed_mails import EmbeddedDelayedMails
from .stores.embedded_mailboxes import EmbeddedMailboxTables
from .stores.embedded_queue_view import EmbeddedQueueView


class Runtime:
    def __init__(self, settings: Settings, clock: Clock = system_clock, create: bool = True) -> None:
        self.settings = settings
        self.clock = clock
        self.store = EmbeddedStore(settings.data_dir, settings.durability, create)
        try:
            self._build(settings, clock)
        except BaseException:
            self.store.close()
            raise

    def _build(self, settings: Settings, clock: Clock) -> None:
        self.view = EmbeddedQueueView(self.store)
        self.dead_letters = EmbeddedDeadLetters(self.store)
        self.delayed_mails = EmbeddedDelayedMails(self.store)
        # Tests arm it to make an operation die between two of its writes (faults.py).
        self.faults = FaultInjector()
        # An optimisation, never a correctness need: the core is correct with every call committing on
        # its own (contextlib.nullcontext), as on a store without transactions. The embedded store groups
        # one operation's writes into one SQLite transaction, which also holds the store's turn, so a
        # mail costs one commit instead of one per table.
        self.group_writes = self.store.transaction
        self.broker = EmbeddedBroker(self.store, clock, settings.visibility_timeout)
        self.blob_tables = EmbeddedBlobTables(self.store)
        self.content = SqliteBlobStore(self.store)
        self.blobs = DeduplicatingBlobStore(self.blob_tables, self.content, clock)
        self.mailboxes = Mailboxes(
            EmbeddedMailboxTables(self.store), self.blobs, clock, settings.max_message_size
        )
        self.configuration = ConfigurationStore(self.view, clock)
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
    def open(cls, url: str | None = None, *, clock: Clock = system_clock, create: bool = True) -> Runtime:
        """Open the runtime of `url`, or of $MAILQ_URL, or the embedded default `embedded://.mailq`.
        With `create=False` a store that does not exist yet raises NoStore instead of being created."""
        return cls(Settings.from_url(url), clock, create)

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
                faults=self.faults,
            )
            self._queues[name] = queue
        return queue

    def queues(self) -> list[str]:
        return self.view.queue_names()

    def close(self) -> None:
        self.broker.close()
        self.store.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.close()
