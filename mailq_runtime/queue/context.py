"""What the queue's collaborators share: the deployment's backends, and one queue's name, clock and
configuration."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from ..blobs.dedup import DeduplicatingBlobStore
from ..brokers.base import Broker
from ..clock import Clock
from ..config import ConfigurationStore, QueueViewConfiguration
from ..errors import UnknownQueue
from ..faults import FaultInjector
from ..metrics import queue_metrics
from ..model import Mail, QueueName
from ..stores.protocols import DeadLetters, DelayedMails, Destinations, HeldMails, QueueView
from ..stores.records import EnqueuedMail
from ..unit_of_work import UnitOfWork

Delay = timedelta | int | float | str | None


@dataclass(frozen=True)
class QueueBackends:
    """The backends every queue of a runtime writes to, with the deployment's grouping of writes and the
    runtime's fault injector."""

    view: QueueView
    broker: Broker
    blobs: DeduplicatingBlobStore
    dead_letters: DeadLetters
    delayed: DelayedMails
    held: HeldMails
    destinations: Destinations
    work: UnitOfWork
    faults: FaultInjector


@dataclass(frozen=True)
class QueueContext:
    """One queue: its name, the clock, and the configuration this process writes with (read once at open,
    as James does); readers of the view ask `configurations` for what other processes may be writing
    with. The backends are not here: each collaborator takes those it uses, by name."""

    name: QueueName
    configuration: QueueViewConfiguration
    configurations: ConfigurationStore
    clock: Clock
    max_message_size: int
    clock_skew_grace: int

    def created(self, start: int | None) -> int:
        """A start (browse_start, content_start) read from the view, which has none before the queue
        exists."""
        if start is None:
            raise UnknownQueue(
                f"queue {self.name!r} does not exist yet: a queue is created by its first enqueue"
            )
        return start


class QueuePart:
    """A collaborator of one queue: its context, name, clock and metrics."""

    def __init__(self, context: QueueContext) -> None:
        self.context = context
        self.name = context.name
        self.clock = context.clock
        self.metrics = queue_metrics(context.name)


def load(blobs: DeduplicatingBlobStore, row: EnqueuedMail) -> Mail:
    """The mail of a view row, its header and body read from the blob store."""
    return row.to_mail(blobs.read(row.header_blob_id) + blobs.read(row.body_blob_id))


def slice_of(moment: int, window: int) -> int:
    return moment - moment % window
