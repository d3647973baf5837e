"""`MailQueue`, the queue's one face: each operation is its collaborator's (James's RabbitMQMailQueue)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from ..model import EnqueueId, Mail
from .browse_start import BrowseStart
from .clean_up import ContentCleanUp
from .context import Delay, QueueContext, QueuePart
from .dead_letters import DeadLetterItem, DeadLetterOffice
from .delays import DelayedMailPublisher, DueSchedule
from .dequeuer import Dequeuer, MailQueueItem
from .enqueuer import Enqueuer, FailedEnqueues
from .mail_view import BrowseItem, MailQueueView
from .overview import QueueOverview, overview
from .settlement import Settlement


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
        self.letters = DeadLetterOffice(context, self.enqueuer.enqueue)
        self.publisher = DelayedMailPublisher(context, schedule, self.letters.drain)
        self.mails = MailQueueView(context, self.enqueuer.send, self.browse_starts.maybe_update)
        settlement = Settlement(context, schedule, self.letters, self.browse_starts.maybe_update)
        self.dequeuer = Dequeuer(context, self.publisher, settlement, self.mails.recount, failed)

    def __repr__(self) -> str:
        return f"MailQueue({self.name!r})"

    # enqueue / dequeue
    def enqueue(self, mail: Mail, delay: Delay = None, priority: int | None = None) -> EnqueueId:
        return self.enqueuer.enqueue(mail, delay, priority)

    def dequeue(self, timeout: Delay = None) -> MailQueueItem | None:
        return self.dequeuer.dequeue(timeout)

    def overview(self) -> QueueOverview:
        """Ready, in-flight, delayed and dead-lettered mails and the oldest of each, without a browse
        (overview.py says how exact each figure is on each broker)."""
        return overview(self.context)

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
