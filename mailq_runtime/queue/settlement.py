"""Settling a dequeued mail: done, retry, release, reject, and the lease that each needs to hold."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

from ..blobs.dedup import DeduplicatingBlobStore
from ..brokers.base import Broker, Delivery
from ..clock import LATEST, MICROS_PER_SECOND
from ..errors import BACKEND_FAILURES, BrokerUnavailable, LeaseExpired
from ..faults import (
    DONE_AFTER_DELETION_MARK,
    DONE_AFTER_MARK,
    DONE_AFTER_RELEASE,
    RETRY_AFTER_ACK,
    RETRY_AFTER_DELAYED_ROW,
    FaultInjector,
)
from ..stores.protocols import DelayedMails, Destinations, QueueView
from ..stores.records import DelayedMail, EnqueuedMail
from ..unit_of_work import UnitOfWork
from .context import QueueContext, QueuePart
from .dead_letters import DeadLetterOffice
from .delays import DueSchedule
from .holds import Holds

log = logging.getLogger(__name__)


def lost(row: EnqueuedMail, action: str) -> LeaseExpired:
    return LeaseExpired(
        f"mail {row.enqueue_id} was not {action}, nothing changed: its lease was lost (it expired and "
        "another consumer took the mail, which settles it now)"
    )


class Settlement(QueuePart):
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
        schedule: DueSchedule,
        letters: DeadLetterOffice,
        holds: Holds,
        maybe_update_browse_start: Callable[[], None],
    ) -> None:
        super().__init__(context)
        self.view = view
        self.broker = broker
        self.blobs = blobs
        self.delayed = delayed
        self.destinations = destinations
        self.work = work
        self.faults = faults
        self.schedule = schedule
        self.letters = letters
        self.holds = holds
        self.maybe_update_browse_start = maybe_update_browse_start

    @contextmanager
    def giving_back(self, delivery: Delivery) -> Iterator[None]:
        """A backend that fails while this consumer holds `delivery` (the store, the blob store, the
        broker) gets the delivery back to the broker at once, uncounted, before the error is raised: the
        mail goes out again as soon as the backend is back, not once its lease expires. A broker that lost
        the delivery with its connection delivers it again by itself."""
        try:
            yield
        except BACKEND_FAILURES:
            try:
                self.broker.release(delivery)
            except BACKEND_FAILURES as error:
                log.info("queue %s: mail %s not given back: %s", self.name, delivery.enqueue_id, error)
            raise

    def extend(self, delivery: Delivery, length: int) -> bool:
        return self.broker.extend(delivery, min(self.clock() + length, LATEST))

    def done(self, delivery: Delivery, row: EnqueuedMail) -> None:
        """Crash-safe order: 0. drop its held row if it has one (held while it was being delivered:
        holds.py's `leaving`); 1. mark the mail deleted, then count it (per slice and per destination
        domain, out of held after 0, in one request where the store can); 2. release its references
        (those its row names, not read again); 3. ack. A crash after 0 leaves the mail live, no longer
        held, counted in held, and its broker message, delivered again; after 1 or 2, the broker
        message, which the next consumer acks as not live; after 1, also the references, which record
        32's clean-up releases with the mail's slice; between the mark and the count, a counter
        `recount` corrects the slice's.
        A backend failing before the ack gives the delivery back (`giving_back`): after 1, its next
        consumer acks it as not live. A lost broker connection at 3 fails nothing: the mark absorbs the
        message RabbitMQ sends again."""
        with self.giving_back(delivery), self.work.writes():
            counts = self.holds.leaving(row)
            self.view.mark_done(
                self.name,
                row.enqueue_id,
                row.slice_start,
                row.bucket,
                lambda: self.faults.reached(DONE_AFTER_DELETION_MARK),
                counts,
            )
            self.faults.reached(DONE_AFTER_MARK)
            self.blobs.release_saved(row.enqueue_id, (row.header_blob_id, row.body_blob_id))
            self.faults.reached(DONE_AFTER_RELEASE)
            acked = self.ack_settled(delivery)
        self.metrics.delivered.inc()
        self.metrics.time_in_queue.observe(max(self.clock() - row.enqueued_time, 0) / MICROS_PER_SECOND)
        # Raised once the writes are done, and not undone: the mail was delivered even with the lease
        # lost, and the mark keeps a consumer that has not loaded it yet from delivering it again.
        self.maybe_update_browse_start()
        if not acked:
            raise LeaseExpired(
                f"mail {row.enqueue_id} is recorded as delivered, but its lease was lost: it expired and "
                "another consumer took the mail, which may deliver it again (at-least-once)"
            )

    def retry(
        self,
        delivery: Delivery,
        row: EnqueuedMail,
        deliver_at: int,
        attempts: int,
        recipients: Sequence[str] | None = None,
    ) -> None:
        """Without a delay or `recipients`, one write: the broker requeues the message. With one, the
        delayed row carries the mail anew (with `recipients` only, when given), crash-safe order: 1. the
        delayed row (its payload counts the attempts so far); 2. ack; 3. the view row's next delivery. A
        crash after 1 leaves the broker message too, delivered again once the lease expires and once more
        when the row falls due (at-least-once; the view's deletion mark absorbs the later copy once the
        mail is done); after 2, browse shows the former next delivery until the row is published.
        Then the counts per destination domain move to the delayed row's state and recipients (within
        held for a mail held while it was being delivered: holds.py's `retried`).
        A lease lost meanwhile (the ack fails) takes the delayed row back: the mail is another consumer's;
        so does a connection to the broker lost meanwhile, as the broker delivers the mail again at once.
        A backend failing before the ack gives the delivery back (`giving_back`). The view row keeps every
        recipient: browse shows the mail as enqueued, the broker's copy what is left to deliver."""
        counted = row
        if recipients is not None:
            row = replace(row, recipients=json.dumps(list(recipients)))
        elif deliver_at <= self.clock():
            try:
                requeued = self.broker.requeue(delivery)
            except BrokerUnavailable as error:
                # What was asked: the broker delivers it again at once, from its own copy.
                log.info(
                    "queue %s: mail %s given back with the connection: %s", self.name, row.enqueue_id, error
                )
                requeued = True
            if not requeued:
                raise lost(row, "retried")
            self.metrics.retried.inc()
            return
        later = replace(row, next_delivery=deliver_at)
        delayed = DelayedMail(self.name, row.enqueue_id, deliver_at, row.priority, later.to_payload(attempts))
        self.schedule.expect(deliver_at)  # first: a look for nothing costs less than a row published late
        with self.giving_back(delivery), self.work.writes():
            self.delayed.add(delayed)
            self.faults.reached(RETRY_AFTER_DELAYED_ROW)
            try:
                acked = self.broker.ack(delivery)
            except BrokerUnavailable:
                self.delayed.remove(delayed)
                raise
            if acked:
                self.faults.reached(RETRY_AFTER_ACK)
                self.view.reschedule([row], deliver_at)
                self.destinations.count(self.name, self.holds.retried(counted, later))
            else:
                self.delayed.remove(delayed)
        if not acked:
            raise lost(row, "retried")
        self.metrics.retried.inc()

    def release(self, delivery: Delivery, row: EnqueuedMail) -> None:
        try:
            released = self.broker.release(delivery)
        except BrokerUnavailable as error:
            # What was asked: the broker delivers it again, from its own copy.
            log.info("queue %s: mail %s given back with the connection: %s", self.name, row.enqueue_id, error)
            return
        if not released:
            raise lost(row, "given back")

    def reject(self, delivery: Delivery, row: EnqueuedMail, reason: str) -> None:
        """Crash-safe order: 1. extend the lease, which says whether it still holds (a mail another consumer
        took is left alone, unchanged); 2. the dead letter; 3. mark the mail deleted; 4. ack. A crash
        after 2 leaves a live mail that is delivered again once the lease expires (its dead letter is
        replaced if it is rejected again); after 3, a broker message the next consumer acks as not live.
        The mail is never lost: it is in the queue or in the dead letters, or both. A backend failing
        before the ack gives the delivery back (`giving_back`)."""
        with self.giving_back(delivery):
            self._reject_held(delivery, row, reason)

    def _reject_held(self, delivery: Delivery, row: EnqueuedMail, reason: str) -> None:
        if not self.view.is_live(row):
            # Delivered by a consumer whose lease had expired, or removed: its content is released, so a
            # dead letter would be an empty one. There is nothing left to reject.
            if not self.ack_settled(delivery):
                raise lost(row, "rejected")
            return
        if not self.extend(delivery, self.broker.visibility_timeout):
            raise lost(row, "rejected")
        with self.work.writes():
            self.bury(delivery, row, reason)
        self.maybe_update_browse_start()

    def bury(self, delivery: Delivery, row: EnqueuedMail | None, reason: str) -> None:
        """Dead-letter a delivery this consumer holds (`row` None: its payload is unreadable), in the
        crash-safe order of `reject`'s steps 2 to 4."""
        self.letters.entomb(delivery.enqueue_id, delivery.payload, row, reason, self.clock())
        self.metrics.dead_lettered.inc()
        # An ack that finds the lease lost is no failure: the letter is written, and the consumer that
        # took the mail acks it as not live.
        self.ack_settled(delivery)

    def ack_settled(self, delivery: Delivery) -> bool:
        """Ack a delivery whose mail the store already records as settled; whether the lease held. A
        connection to the broker lost meanwhile fails nothing: the store absorbs the copy sent again."""
        try:
            return self.broker.ack(delivery)
        except BrokerUnavailable as error:
            log.info("queue %s: mail %s settled, its ack lost: %s", self.name, delivery.enqueue_id, error)
            return True
