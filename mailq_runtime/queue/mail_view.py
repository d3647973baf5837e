"""The queue as an operator sees it (James's MailQueueView): browse, size, remove, clear and republish."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime

from ..blobs.dedup import DeduplicatingBlobStore
from ..brokers.base import Broker
from ..clock import to_datetime
from ..errors import InvalidInput
from ..faults import REMOVE_AFTER_MARK, REMOVE_AFTER_RELEASE, FaultInjector
from ..model import (
    NULL_SENDER_SPELLINGS,
    EnqueueId,
    Mail,
    MailAddress,
    QueueName,
    address_key,
    parse_duration,
)
from ..stores.protocols import DelayedMails, Destinations, QueueView
from ..stores.records import DelayedMail, DestinationCount, EnqueuedMail
from ..unit_of_work import UnitOfWork
from .context import Delay, QueueContext, QueuePart, load


@dataclass
class BrowseItem:
    enqueue_id: EnqueueId
    name: str
    sender: str | None
    recipients: list[str]
    enqueued_time: datetime
    next_delivery: datetime
    _row: EnqueuedMail = field(repr=False)
    _blobs: DeduplicatingBlobStore = field(repr=False)

    @property
    def mail(self) -> Mail:
        return load(self._blobs, self._row)


def live_rows(view: QueueView, queue: QueueName) -> Iterator[EnqueuedMail]:
    """The rows of the mails still enqueued, in enqueue order, read from `browse_start` on."""
    browse_start = view.browse_start(queue)
    if browse_start is None:
        return  # not created yet: empty
    for slice_start in view.slices_from(queue, browse_start):
        yield from view.live_mails(queue, slice_start)


class MailQueueView(QueuePart):
    def __init__(
        self,
        context: QueueContext,
        *,
        view: QueueView,
        broker: Broker,
        blobs: DeduplicatingBlobStore,
        delayed: DelayedMails,
        destinations: Destinations,
        work: UnitOfWork,
        faults: FaultInjector,
        send: Callable[[EnqueuedMail, int, int], None],
        maybe_update_browse_start: Callable[[], None],
        leaving: Callable[..., list[DestinationCount]],
    ) -> None:
        super().__init__(context)
        self.view = view
        self.broker = broker
        self.blobs = blobs
        self.delayed = delayed
        self.destinations = destinations
        self.work = work
        self.faults = faults
        self.send = send
        self.leaving = leaving  # a leaving mail's count changes per destination domain (holds.py)
        self.maybe_update_browse_start = maybe_update_browse_start

    def browse(self) -> Iterator[BrowseItem]:
        """The mails still enqueued, in enqueue order, read from `browse_start` on."""
        for row in live_rows(self.view, self.name):
            yield BrowseItem(
                row.enqueue_id,
                row.name,
                row.sender,
                row.recipient_list,
                to_datetime(row.enqueued_time),
                to_datetime(row.next_delivery),
                row,
                self.blobs,
            )

    def size(self) -> int:
        """Read from the per-slice counts: the cost does not grow with the queue's history. A slice
        counted below zero (a mail settled twice, until the recount folds it) counts none."""
        browse_start = self.view.browse_start(self.name)
        if browse_start is None:
            return 0
        return sum(max(live, 0) for _, live in self.view.slice_sizes(self.name, browse_start))

    def remove(
        self, *, name: str | None = None, sender: str | None = None, recipient: str | None = None
    ) -> int:
        """Delete the mails matching exactly one criterion; a multi-recipient mail goes if any recipient
        matches. Addresses match as James's do: the local part exactly, the domain in any case; the
        sender "<>" (or "") is the null sender of bounces. The crash-safe order is `_delete_where`'s."""
        given = (("name", name), ("sender", sender), ("recipient", recipient))
        criteria = {k: v for k, v in given if v is not None}
        if len(criteria) != 1:
            raise InvalidInput(
                f"remove takes exactly one of name, sender or recipient, got {sorted(criteria) or 'none'}"
            )
        if name is not None:
            return self._delete_where(lambda row: row.name == name)
        if sender in NULL_SENDER_SPELLINGS:
            return self._delete_where(lambda row: row.sender is None)
        if sender is not None:
            wanted = address_key(MailAddress(sender))
            return self._delete_where(lambda row: row.sender and address_key(row.sender) == wanted)
        wanted = address_key(MailAddress(recipient))
        return self._delete_where(lambda row: any(address_key(r) == wanted for r in row.recipient_list))

    def clear(self) -> int:
        """Delete every mail; the crash-safe order is `_delete_where`'s."""
        return self._delete_where(lambda row: True)

    def _delete_where(self, matches: Callable[[EnqueuedMail], bool]) -> int:
        """Crash-safe order, mail by mail: 1. mark it deleted, then count it per destination domain (out
        of held if it was held, its held row dropped between: holds.py's `leaving`); 2. release its
        references; 3. drop its delayed row, if it waits for one. A crash after 1 leaves the references,
        which record 32's clean-up releases with the slice; after 2, a delayed row that is published when
        due and acked as not live. A mail marked is out of browse and size, so running the removal again
        finds the rest."""
        deleted = 0
        now = self.clock()
        for row in list(live_rows(self.view, self.name)):
            if not matches(row):
                continue
            with self.work.writes():
                if self.view.mark_deleted(self.name, row.enqueue_id, row.slice_start, row.bucket):
                    self.destinations.count(self.name, self.leaving(row, from_view=True))
                    self.faults.reached(REMOVE_AFTER_MARK)
                    self.blobs.release(row.enqueue_id)
                    self.faults.reached(REMOVE_AFTER_RELEASE)
                    if row.next_delivery > now:
                        self.delayed.remove(
                            DelayedMail(self.name, row.enqueue_id, row.next_delivery, row.priority, "")
                        )
                    deleted += 1
        if deleted:
            self.metrics.removed.inc(deleted)
            self.maybe_update_browse_start()
        return deleted

    def republish(self, older_than: Delay) -> int:
        """Publish again the mails older than `older_than` that the view holds but neither the broker nor
        the delayed mails do (a broker outage, a crash in the middle of an enqueue); a mail whose next
        delivery is still to come is delayed again instead. Each mail is one write, so a crash leaves
        the rest to the next run."""
        now = self.clock()
        cutoff = now - parse_duration(older_than, "older_than")
        candidates = [row for row in live_rows(self.view, self.name) if row.enqueued_time < cutoff]
        held = self.broker.published(self.name, [row.enqueue_id for row in candidates])
        held |= {mail.enqueue_id for mail in self.delayed.all(self.name)}
        republished = 0
        for row in candidates:
            if row.enqueue_id not in held:
                self.send(row, row.next_delivery, now)
                republished += 1
        return republished
