"""Dequeue: a broker delivery, checked against the view's deletion marks, handed out as a leased
`MailQueueItem`; while a consumer waits it publishes the delayed mails that fall due."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from types import TracebackType

from ..blobs.dedup import DeduplicatingBlobStore
from ..brokers.base import Broker, Delivery
from ..clock import MICROS_PER_SECOND
from ..errors import BACKEND_FAILURES, BlobNotFound, InvalidInput, LeaseExpired, shown
from ..metrics import seconds_since
from ..model import Mail, MailAddress, delivery_time, parse_duration
from ..stores.protocols import QueueView
from ..stores.records import EnqueuedMail
from ..unit_of_work import UnitOfWork
from .context import Delay, QueueContext, QueuePart, load, slice_of
from .delays import DelayedMailPublisher
from .enqueuer import FailedEnqueues
from .holds import Holds
from .settlement import Settlement

log = logging.getLogger(__name__)

# Seconds between a process's recounts of a queue, busy or idle (`_recount_when_due`): with the store's
# settling of counts (stores/cassandra/queue_view.py), the bound on how long a count a crash left wrong
# stays wrong.
RECOUNT_INTERVAL = 30.0


class MailQueueItem:
    """A dequeued mail, leased to this consumer until `done()`, `retry()` or `reject()`.

    The lease lasts the visibility timeout, and `extend_lease()` pushes it out. Once it has expired,
    the broker may give the mail to another consumer; then `done()`, `retry()` and `reject()` raise
    LeaseExpired (the item still counts as settled)."""

    def __init__(
        self, settlement: Settlement, delivery: Delivery, row: EnqueuedMail, mail: Mail, attempts: int
    ) -> None:
        self._settlement = settlement
        self._delivery = delivery
        self._row = row
        self.mail = mail
        self.enqueue_id = row.enqueue_id
        self.attempts = attempts  # deliveries of this mail so far, this one included
        self.settled = False

    def _settle(self) -> None:
        if self.settled:
            raise InvalidInput(f"mail {self.enqueue_id} was already acknowledged")
        self.settled = True

    def done(self) -> None:
        """Delivered: mark it deleted, release its content, acknowledge it. With the lease lost, the
        mail is still marked deleted and its content released, then LeaseExpired is raised."""
        self._settle()
        self._settlement.done(self._delivery, self._row)

    def retry(
        self, delay: Delay = None, *, recipients: Sequence[str] | None = None, counted: bool = True
    ) -> None:
        """Not delivered this time: deliver it again, after `delay` if given; with `recipients`, to those
        only (the others are done: remote delivery's partial success). Not `counted`, this delivery is
        not one of the mail's attempts (remote delivery's limits let it try none). With the lease lost it
        changes nothing and raises LeaseExpired."""
        # A malformed delay or recipient leaves the item unsettled.
        deliver_at = delivery_time(self._settlement.clock(), delay)
        remaining = None if recipients is None else [MailAddress(r) for r in recipients]
        if remaining == []:
            raise InvalidInput(f"mail {self.enqueue_id} retried to no recipient: it is done")
        self._settle()
        attempts = self.attempts if counted else self.attempts - 1
        self._settlement.retry(self._delivery, self._row, deliver_at, attempts, remaining)

    def release(self) -> None:
        """Not tried: a backend the delivery needs is away. Give the mail back, deliverable again at once,
        without counting this delivery towards any limit. With the lease lost it changes nothing and
        raises LeaseExpired."""
        self._settle()
        self._settlement.release(self._delivery, self._row)

    def reject(self, reason: str = "rejected") -> None:
        """Never deliverable: move it to the dead letters, which keep its content. With the lease lost
        it changes nothing and raises LeaseExpired."""
        self._settle()
        self._settlement.reject(self._delivery, self._row, reason)

    def extend_lease(self, duration: Delay = None) -> None:
        """Keep the mail leased to this consumer for `duration` from now (default: the visibility
        timeout), so that a long delivery is not given to another consumer meanwhile. Raises
        LeaseExpired if another consumer already has it."""
        length = self._settlement.broker.visibility_timeout
        if duration is not None:
            length = parse_duration(duration, "lease extension")
            if not length:
                raise InvalidInput(f"invalid lease extension {shown(duration)}: must be longer than zero")
        if self.settled:
            raise InvalidInput(f"mail {self.enqueue_id} was already acknowledged: it holds no lease")
        if not self._settlement.extend(self._delivery, length):
            raise LeaseExpired(
                f"the lease on mail {self.enqueue_id} was lost: it expired and another consumer took the "
                "mail, which delivers it now"
            )

    def __enter__(self) -> MailQueueItem:
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, trace: TracebackType | None) -> None:
        if self.settled:
            return
        if error is None:
            self.done()
        else:
            self.retry()


class Dequeuer(QueuePart):
    def __init__(
        self,
        context: QueueContext,
        *,
        view: QueueView,
        broker: Broker,
        blobs: DeduplicatingBlobStore,
        work: UnitOfWork,
        publisher: DelayedMailPublisher,
        settlement: Settlement,
        recount: Callable[[Callable[[], bool]], int],
        holds: Holds,
        failed: FailedEnqueues,
    ) -> None:
        super().__init__(context)
        self.view = view
        self.broker = broker
        self.blobs = blobs
        self.work = work
        self.holds = holds
        self.publisher = publisher
        self.settlement = settlement
        self.recount = recount
        self.failed = failed
        self._recount_at = 0.0  # time.monotonic() of the next recount
        self._widest_window: int | None = None  # see `_current_slice`

    def dequeue(self, timeout: Delay = None) -> MailQueueItem | None:
        """The next deliverable mail; blocks while there is none, or returns None after `timeout` (seconds,
        or a duration as `parse_duration` reads it). While it waits it publishes the delayed mails that
        fall due, so consumers need nothing else running."""
        if timeout is not None:
            timeout = parse_duration(timeout, "dequeue timeout") / MICROS_PER_SECOND
        deadline = None if timeout is None else time.monotonic() + timeout
        schedule = self.publisher.schedule
        while True:
            self._recount_when_due()
            if self.publisher.publishing_due():
                self.publisher.publish_if_due()
            until_due = (schedule.next_due - self.clock()) / MICROS_PER_SECOND
            wait = max(0.0, min(schedule.look_at - time.monotonic(), until_due))
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - time.monotonic()))
            delivery = self.broker.receive(self.name, wait)
            if delivery is None:
                # Side tasks of an idle consumer: the process's producers may have stopped meanwhile.
                self.failed.withdraw()
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                continue
            item = self._item(delivery, time.perf_counter())
            if item is not None:
                return item

    def dequeue_ready(self, limit: int) -> list[MailQueueItem]:
        """Up to `limit` deliverable mails that are ready now, taken at once (one claim on a broker that
        can), without waiting. A backend failing gives back to the broker the mails not yet taken, and
        the mails taken before it are returned (none, if the claim failed): the caller's next `dequeue`
        meets the failure and waits for the backend."""
        self._recount_when_due()
        started = time.perf_counter()
        try:
            deliveries = self.broker.receive_ready(self.name, limit)
        except BACKEND_FAILURES as error:
            log.info("queue %s: no more mails taken now: %s", self.name, error)
            return []
        items = []
        for index, delivery in enumerate(deliveries):
            try:
                item = self._item(delivery, started)
            except BACKEND_FAILURES as error:
                log.info(
                    "queue %s: %d mails given back untried: %s", self.name, len(deliveries) - index, error
                )
                for rest in deliveries[index + 1 :]:
                    with suppress(*BACKEND_FAILURES):
                        self.broker.release(rest)
                break
            if item is not None:
                items.append(item)
        return items

    def _item(self, delivery: Delivery, started: float) -> MailQueueItem | None:
        """`delivery`'s item, counted as dequeued; None when it was settled here instead (`_deliverable`).
        A backend failing meanwhile gives the delivery back (`giving_back`)."""
        with self.settlement.giving_back(delivery), self.work.turn():
            item = self._deliverable(delivery)
        if item is not None:
            self.metrics.dequeued.inc()
            self.metrics.dequeue_seconds.observe(seconds_since(started))
        return item

    def _deliverable(self, delivery: Delivery) -> MailQueueItem | None:
        """The item of a broker delivery, or None when the delivery was settled here instead."""
        try:
            row, attempts_before = EnqueuedMail.from_payload(delivery.payload)
        except (ValueError, TypeError) as error:
            # Requeued, it would come back after every visibility timeout and fail every time.
            with self.work.writes():
                self.settlement.bury(delivery, None, f"unreadable message: {error}")
            return None
        if not self.view.is_live(row, self._current_slice()):
            self.settlement.ack_settled(delivery)  # removed or cleared while waiting in the broker
            return None
        if self.holds.park(delivery, row):
            self.settlement.ack_settled(delivery)  # its held row keeps it until released
            return None
        try:
            mail = load(self.blobs, row)
        except BlobNotFound as error:
            with self.work.writes():
                self.settlement.bury(delivery, row, f"content missing: {error}")
            return None
        return MailQueueItem(self.settlement, delivery, row, mail, attempts_before + delivery.attempts)

    def _current_slice(self) -> int | None:
        """A slice start no process can have moved browse_start past: now aligned on the widest
        sliceWindow ever in force. browse_start never passes a process's `browse_start_limit`, whose
        clock is at most the clock-skew grace ahead of this one, and every window divides the widest,
        so every limit lies on its grid. The widest is the first configuration's, read once; None
        until a configuration is registered."""
        if self._widest_window is None:
            windows = [configuration.slice_window for configuration in self.context.configurations.history()]
            if not windows:
                return None
            self._widest_window = max(windows)
        return slice_of(self.clock(), max(self._widest_window, self.context.configuration.slice_window))

    def _recount_when_due(self) -> None:
        """Recount the queue every RECOUNT_INTERVAL seconds, whether it idles or not, in the one process
        that holds the queue's lease of the looks for delayed mails (publisher_lease.py): a recount
        folds what settled and never makes a count wrong under traffic, and one process a queue is
        enough. A failure is left to the next one."""
        if time.monotonic() < self._recount_at:
            return
        self._recount_at = time.monotonic() + RECOUNT_INTERVAL
        try:
            self.recount(self.publisher.lease.held)
        except Exception as error:  # a side task of the consumer: it must not fail the dequeue
            log.warning("queue %s: the recount failed, the next one retries: %s", self.name, error)
