"""The composition root: `Runtime` builds the queues, blobs and mailboxes on a deployment's backends
(deployments.py makes them from its settings).

Opening writes nothing. A runtime opened with `create=True` (what `mailq enqueue`, `worker`, `config set`
and `schema create` do) makes what is missing: the store and its schema, the first reference generation,
and the configuration event (the URL's values registered over the stored ones). Without it, a store that
does not exist is NoStore naming the place looked at, so a mistyped URL never starts an empty store, and
the configuration is read as stored (the defaults while none is).

The runtime hands the deployment's unit of work once to the core, inside the collaborators it builds.
"""

from __future__ import annotations

from dataclasses import replace
from types import TracebackType

from .blobs.dedup import DeduplicatingBlobStore, Generations
from .clock import Clock, system_clock
from .config import ConfigurationStore
from .deployments import build
from .errors import UnknownQueue
from .faults import FaultInjector
from .mailboxes import Mailboxes
from .model import QueueName
from .queue import MailQueue, QueueBackends, QueueContext
from .settings import Settings
from .unit_of_work import UNGROUPED


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
        # Grouping writes is an optimisation, never a correctness need: the core orders the writes of every
        # path so that each may commit alone (as on Cassandra). The embedded store may group one step's
        # writes into one SQLite transaction, which costs one commit instead of several; tests turn it
        # off to see every write commit alone, and the threads of one process interleave their operations.
        work = deployment.work if group_writes else UNGROUPED
        # The deployment's unit of work: its `writes()` is the embedded store's transaction (a caller may
        # wrap several operations in one), nothing on Cassandra.
        self.work = work
        self.view = deployment.view
        self.broker = deployment.broker
        self.blob_tables = deployment.blob_tables
        self.content = deployment.content
        self.dead_letters = deployment.dead_letters
        self.delayed_mails = deployment.delayed_mails
        self.blobs = DeduplicatingBlobStore(self.blob_tables, self.content, clock, self.faults, work)
        self.mailboxes = Mailboxes(
            deployment.mailbox_tables, self.blobs, clock, settings.max_message_size, self.faults, work
        )
        self.queue_backends = QueueBackends(
            self.view,
            self.broker,
            self.blobs,
            self.dead_letters,
            self.delayed_mails,
            deployment.held_mails,
            deployment.destinations,
            work,
            self.faults,
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
        # (`queue.maintenance.browse_start_limit`).
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
                QueueContext(
                    name,
                    self.view_configuration,
                    self.configuration,
                    self.clock,
                    self.settings.max_message_size,
                    self.settings.clock_skew_grace,
                ),
                self.queue_backends,
            )
            self._queues[name] = queue
        return queue

    def queues(self) -> list[str]:
        return self.view.queue_names()

    def close(self) -> None:
        for queue in self._queues.values():
            queue.close()
        self.broker.close()
        self.deployment.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.close()
