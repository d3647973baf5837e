"""`MailQueue`, the queue's one face: each operation is its collaborator's (James's RabbitMQMailQueue)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from datetime import datetime

from ..model import EnqueueId, Mail
from .browse_start import BrowseStart
from .clean_up import ContentCleanUp
from .context import Delay, QueueBackends, QueueContext
from .dead_letters import DeadLetterItem, DeadLetterOffice
from .delays import DelayedMailPublisher, DueSchedule
from .dequeuer import Dequeuer, MailQueueItem
from .enqueuer import Enqueuer, FailedEnqueues
from .holds import Holds
from .mail_view import BrowseItem, MailQueueView
from .overview import Overviews
from .settlement import Settlement
from .suspensions import Suspensions


class MailQueue:
    """Assembles one queue's collaborators, each given the backends it uses, and offers their operations.
    `backends` are the deployment's, for what reaches past the queue's operations (tests, the faults)."""

    def __init__(self, context: QueueContext, backends: QueueBackends) -> None:
        self.context = context
        self.backends = backends
        self.name = context.name
        self.clock = context.clock
        self.configuration = context.configuration
        self.configurations = context.configurations
        self.max_message_size = context.max_message_size
        b = backends
        self.clean_up = ContentCleanUp(
            context, view=b.view, blobs=b.blobs, dead_letters=b.dead_letters, faults=b.faults
        )
        self.maintenance = BrowseStart(context, view=b.view, faults=b.faults, clean_up=self.clean_up)
        schedule = DueSchedule()
        failed = FailedEnqueues(context, view=b.view, blobs=b.blobs, destinations=b.destinations, work=b.work)
        self.enqueuer = Enqueuer(
            context,
            view=b.view,
            broker=b.broker,
            blobs=b.blobs,
            delayed=b.delayed,
            destinations=b.destinations,
            work=b.work,
            faults=b.faults,
            schedule=schedule,
            browse_start_limit=self.maintenance.browse_start_limit,
            failed=failed,
        )
        self.holds = Holds(
            context,
            view=b.view,
            held=b.held,
            delayed=b.delayed,
            destinations=b.destinations,
            faults=b.faults,
            schedule=schedule,
        )
        self.letters = DeadLetterOffice(
            context,
            records=b.dead_letters,
            view=b.view,
            broker=b.broker,
            blobs=b.blobs,
            destinations=b.destinations,
            work=b.work,
            faults=b.faults,
            enqueue=self.enqueuer.enqueue,
            leaving=self.holds.leaving,
        )
        self.publisher = DelayedMailPublisher(
            context,
            view=b.view,
            broker=b.broker,
            delayed=b.delayed,
            destinations=b.destinations,
            work=b.work,
            faults=b.faults,
            schedule=schedule,
            drain_dead_letters=self.letters.drain,
        )
        update = self.maintenance.maybe_update
        self.mails = MailQueueView(
            context,
            view=b.view,
            broker=b.broker,
            blobs=b.blobs,
            delayed=b.delayed,
            destinations=b.destinations,
            work=b.work,
            faults=b.faults,
            send=self.enqueuer.send,
            maybe_update_browse_start=update,
            leaving=self.holds.leaving,
        )
        settlement = Settlement(
            context,
            view=b.view,
            broker=b.broker,
            blobs=b.blobs,
            delayed=b.delayed,
            destinations=b.destinations,
            work=b.work,
            faults=b.faults,
            schedule=schedule,
            letters=self.letters,
            holds=self.holds,
            maybe_update_browse_start=update,
        )
        self.suspensions = Suspensions(
            context, destinations=b.destinations, flush_domain=self.publisher.flush_domain
        )
        self.overviews = Overviews(
            context,
            view=b.view,
            broker=b.broker,
            delayed=b.delayed,
            dead_letters=b.dead_letters,
            destinations=b.destinations,
            held_counts=self.holds.counts,
        )
        self.dequeuer = Dequeuer(
            context,
            view=b.view,
            broker=b.broker,
            blobs=b.blobs,
            work=b.work,
            publisher=self.publisher,
            settlement=settlement,
            recount=self.overviews.recount,
            holds=self.holds,
            failed=failed,
        )

    def __repr__(self) -> str:
        return f"MailQueue({self.name!r})"

    def writes(self) -> AbstractContextManager[None]:
        """The queue's unit of work: what a caller groups several of its operations in (the worker, its
        settlements), one commit on a store that groups writes (unit_of_work.py)."""
        return self.backends.work.writes()

    def close(self) -> None:
        """Hand over what this process holds of the queue across the deployment: the looks for due
        delayed mails (publisher_lease.py). The runtime calls it as it closes."""
        self.publisher.lease.release()

    # enqueue / dequeue
    def enqueue(self, mail: Mail, delay: Delay = None, priority: int | None = None) -> EnqueueId:
        return self.enqueuer.enqueue(mail, delay, priority)

    def dequeue(self, timeout: Delay = None) -> MailQueueItem | None:
        return self.dequeuer.dequeue(timeout)

    def dequeue_ready(self, limit: int) -> list[MailQueueItem]:
        return self.dequeuer.dequeue_ready(limit)

    # the view
    def browse(self) -> Iterator[BrowseItem]:
        return self.mails.browse()

    def size(self) -> int:
        return self.mails.size()

    def remove(
        self, *, name: str | None = None, sender: str | None = None, recipient: str | None = None
    ) -> int:
        return self.mails.remove(name=name, sender=sender, recipient=recipient)

    def clear(self) -> int:
        return self.mails.clear()

    def republish(self, older_than: Delay) -> int:
        return self.mails.republish(older_than)

    # dead letters
    def dead_letters(self) -> list[DeadLetterItem]:
        return self.letters.list()

    def dead_letter_reasons(self) -> list[tuple[str, datetime]]:
        return self.letters.reasons()

    def dead_letter(self, enqueue_id: str) -> DeadLetterItem:
        return self.letters.get(enqueue_id)

    def requeue_dead_letters(self, enqueue_id: str | None = None, *, every: bool = False) -> list[EnqueueId]:
        return self.letters.requeue(enqueue_id, every=every)

    def purge_dead_letters(self, enqueue_id: str | None = None, *, older_than: Delay = None) -> int:
        return self.letters.purge(enqueue_id, older_than=older_than)

    def drain_dead_letters(self) -> int:
        return self.letters.drain()

    def flush(self) -> int:
        return self.publisher.flush()
