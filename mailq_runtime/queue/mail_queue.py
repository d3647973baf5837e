"""`MailQueue`, the queue's one face: each operation is its collaborator's (James's RabbitMQMailQueue)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

from ..model import EnqueueId, Mail
from ..stores.records import DestinationNote, DomainBounce
from .browse_start import BrowseStart
from .clean_up import ContentCleanUp
from .context import Delay, QueueContext, QueuePart
from .dead_letters import DeadLetterItem, DeadLetterOffice
from .delays import DelayedMailPublisher, DueSchedule
from .dequeuer import Dequeuer, MailQueueItem
from .destinations import DomainShape, by_domain
from .enqueuer import Enqueuer, FailedEnqueues
from .holds import HeldItem, Holds
from .mail_view import BrowseItem, MailQueueView
from .overview import QueueOverview, overview
from .settlement import Settlement
from .suspensions import Suspensions


class MailQueue(QueuePart):
    def __init__(self, context: QueueContext) -> None:
        super().__init__(context)
        self.configuration = context.configuration
        self.configurations = context.configurations
        self.max_message_size = context.max_message_size
        self.clean_up = ContentCleanUp(context)
        self.browse_starts = BrowseStart(context, self.clean_up)
        schedule = DueSchedule()
        failed = FailedEnqueues(context)
        self.enqueuer = Enqueuer(context, schedule, self.browse_starts.limit, failed)
        self.holds = Holds(context, schedule)
        self.letters = DeadLetterOffice(context, self.enqueuer.enqueue, self.holds.leaving)
        self.publisher = DelayedMailPublisher(context, schedule, self.letters.drain)
        update = self.browse_starts.maybe_update
        self.mails = MailQueueView(context, self.enqueuer.send, update, self.holds.leaving)
        settlement = Settlement(context, schedule, self.letters, self.holds, update)
        self.suspensions = Suspensions(context, self.publisher.flush_domain)
        self.dequeuer = Dequeuer(context, self.publisher, settlement, self.mails.recount, self.holds, failed)

    def __repr__(self) -> str:
        return f"MailQueue({self.name!r})"

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

    def by_domain(self) -> list[DomainShape]:
        """Per destination domain, the mails by state in qshape's age buckets, from counters kept as
        mail moves (destinations.py)."""
        return by_domain(self.context, self.clock())

    def note_destination(self, note: DestinationNote) -> None:
        """Record remote delivery's last failure at a domain and its next attempt there."""
        self.destinations.note(self.name, note)

    # destination domains: suspend, resume, retry now (KumoMTA's suspend, Postfix's postqueue -s)
    def suspend(self, domain: str, until: datetime | timedelta | str) -> datetime:
        return self.suspensions.suspend(domain, until)

    def resume(self, domain: str) -> int:
        return self.suspensions.resume(domain)

    def retry_domain(self, domain: str) -> int:
        return self.suspensions.retry(domain)

    def suspended(self) -> dict[str, datetime]:
        return self.suspensions.suspended()

    def bounce_domain(self, domain: str, reason: str, window: timedelta | str | None = None) -> int:
        return self.suspensions.bounce(domain, reason, window)

    def bounced_domains(self) -> dict[str, DomainBounce]:
        return self.suspensions.bounced()

    def overview(self) -> QueueOverview:
        """Ready, in-flight, delayed and dead-lettered mails and the oldest of each, without a browse
        (overview.py says how exact each figure is on each broker)."""
        return overview(self.context, *self.holds.counts())

    def counts(self) -> QueueOverview:
        """The overview's counts, reading no mail (its oldest ready and in-flight mails `unknown`): what
        a metrics scrape reads."""
        return overview(self.context, *self.holds.counts(), read_oldest=False)

    # the view
    def browse(self) -> Iterator[BrowseItem]:
        return self.mails.browse()

    def size(self) -> int:
        return self.mails.size()

    def recount(self) -> int:
        return self.mails.recount()

    def remove(
        self, *, name: str | None = None, sender: str | None = None, recipient: str | None = None
    ) -> int:
        return self.mails.remove(name=name, sender=sender, recipient=recipient)

    def clear(self) -> int:
        return self.mails.clear()

    def republish(self, older_than: Delay) -> int:
        return self.mails.republish(older_than)

    # hold and release (Postfix's postsuper -h and -H)
    def hold(
        self,
        enqueue_id: str | None = None,
        *,
        sender: str | None = None,
        recipient: str | None = None,
        domain: str | None = None,
    ) -> int:
        return self.holds.hold(enqueue_id, sender=sender, recipient=recipient, domain=domain)

    def release(
        self,
        enqueue_id: str | None = None,
        *,
        sender: str | None = None,
        recipient: str | None = None,
        domain: str | None = None,
    ) -> int:
        return self.holds.release(enqueue_id, sender=sender, recipient=recipient, domain=domain)

    def held_mails(self) -> list[HeldItem]:
        return self.holds.held_mails()

    # dead letters
    def dead_letters(self) -> list[DeadLetterItem]:
        return self.letters.dead_letters()

    def dead_letter_reasons(self) -> list[tuple[str, datetime]]:
        return self.letters.dead_letter_reasons()

    def dead_letter(self, enqueue_id: str) -> DeadLetterItem:
        return self.letters.dead_letter(enqueue_id)

    def requeue_dead_letters(self, enqueue_id: str | None = None, *, every: bool = False) -> list[EnqueueId]:
        return self.letters.requeue(enqueue_id, every=every)

    def purge_dead_letters(self, enqueue_id: str | None = None, *, older_than: Delay = None) -> int:
        return self.letters.purge(enqueue_id, older_than=older_than)

    def drain_dead_letters(self) -> int:
        return self.letters.drain()

    # delays
    def publish_due(self) -> int:
        return self.publisher.publish_due()

    def flush(self) -> int:
        return self.publisher.flush()

    # record 31's browse_start and record 32's content clean-up
    def browse_start(self) -> int:
        return self.browse_starts.browse_start()

    def content_start(self) -> int:
        return self.browse_starts.content_start()

    def maintenance_due(self) -> bool:
        return self.browse_starts.maintenance_due()

    def browse_start_limit(self) -> int:
        return self.browse_starts.limit()

    def update_browse_start(self) -> int:
        return self.browse_starts.update()

    def clean_content(self) -> int:
        return self.clean_up.clean_content()
