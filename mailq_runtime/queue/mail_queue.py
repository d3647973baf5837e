"""`MailQueue`, the queue's one face (James's RabbitMQMailQueue): its own contract as methods, and the
collaborators that do the rest as sub-facades."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager

from ..model import EnqueueId, Mail
from .browse_start import BrowseStart
from .clean_up import ContentCleanUp
from .context import Delay, QueueBackends, QueueContext
from .dead_letters import DeadLetterOffice
from .delays import DelayedMailPublisher, DueSchedule
from .dequeuer import Dequeuer, MailQueueItem
from .enqueuer import Enqueuer, FailedEnqueues
from .holds import Holds
from .mail_view import BrowseItem, MailQueueView
from .overview import Overviews
from .settlement import Settlement
from .suspensions import Suspensions


class MailQueue:
    """Assembles one queue's collaborators, each given the backends it uses. Its methods are the queue's
    own contract, James's MailQueue and ManageableMailQueue: enqueue, dequeue, browse, size, remove,
    clear, flush, republish. The rest is the collaborators' own, reached by name (no forwards):

    - `holds`: hold, release, list the held mails (Postfix's postsuper -h and -H);
    - `dead_letters`: list, reasons, get, requeue, purge, drain;
    - `suspensions`: suspend, resume, retry, bounce a destination domain, and what is suspended or bounced
      (KumoMTA's suspend and bounce, Postfix's postqueue -s);
    - `overviews`: the overview, its counts, the mails by destination domain (qshape) with remote
      delivery's notes, and the recount of the counters they read;
    - `maintenance`: records 31 and 32, browse_start, content_start, whether an update is due, the
      update (with the content clean-up) and browse_start's limit;
    - `publisher`: the delayed-mail publisher, `publish_due` one round of it.

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
        self.dead_letters = DeadLetterOffice(
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
            drain_dead_letters=self.dead_letters.drain,
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
            letters=self.dead_letters,
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

    def enqueue(self, mail: Mail, delay: Delay = None, priority: int | None = None) -> EnqueueId:
        return self.enqueuer.enqueue(mail, delay, priority)

    def dequeue(self, timeout: Delay = None) -> MailQueueItem | None:
        return self.dequeuer.dequeue(timeout)

    def dequeue_ready(self, limit: int) -> list[MailQueueItem]:
        """Up to `limit` mails ready now, without waiting: the worker's batch after its `dequeue`."""
        return self.dequeuer.dequeue_ready(limit)

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

    def flush(self) -> int:
        return self.publisher.flush()

    def republish(self, older_than: Delay) -> int:
        return self.mails.republish(older_than)
