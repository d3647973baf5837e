"""Delayed mails: the schedule of the due times this process wrote, and the publisher that hands the
delayed mails that fell due to the broker."""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable

from ..brokers.base import Broker
from ..clock import LATEST
from ..errors import BrokerRefused, BrokerUnavailable
from ..faults import FLUSH_AFTER_DELAYED_ROWS, PUBLISH_DUE_AFTER_PUBLISH, FaultInjector
from ..model import address_key
from ..stores.protocols import DelayedMails, Destinations, QueueView
from ..stores.records import DelayedMail, EnqueuedMail
from ..unit_of_work import UnitOfWork
from .context import QueueContext, QueuePart
from .mail_view import live_rows
from .publisher_lease import PublisherLease

log = logging.getLogger(__name__)

# Seconds between a waiting consumer's looks for delayed mails that other processes wrote and that fell
# due (its own process's delays it publishes on time): the bound on how late such a mail is delivered.
PUBLISH_INTERVAL = 1.0
NEVER = LATEST + 1
# Delayed mails handed to the broker per group of writes.
_PUBLISH_BATCH = 100


class DueSchedule:
    """The publisher's schedule: when a dequeue next looks for due mails (time.monotonic(), so that a clock
    set back delays nothing), and the due times of the delays this process wrote, so that those are
    published on time rather than up to an interval late. Its lock is held for nothing else, as delays are
    scheduled in the middle of a group of writes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.look_at = 0.0
        self._dues: list[int] = []
        self.next_due = NEVER

    def expect(self, due: int) -> None:
        with self.lock:
            heapq.heappush(self._dues, due)
            self.next_due = self._dues[0]

    def looked(self, now: int) -> None:
        """The due mails up to `now` are published: forget their due times, and look again in an interval."""
        with self.lock:
            while self._dues and self._dues[0] <= now:
                heapq.heappop(self._dues)
            self.next_due = self._dues[0] if self._dues else NEVER
            self.look_at = time.monotonic() + PUBLISH_INTERVAL

    def look_later(self) -> None:
        with self.lock:
            self.look_at = time.monotonic() + PUBLISH_INTERVAL


class DelayedMailPublisher(QueuePart):
    def __init__(
        self,
        context: QueueContext,
        *,
        view: QueueView,
        broker: Broker,
        delayed: DelayedMails,
        destinations: Destinations,
        work: UnitOfWork,
        faults: FaultInjector,
        schedule: DueSchedule,
        drain_dead_letters: Callable[[], int],
    ) -> None:
        super().__init__(context)
        self.view = view
        self.broker = broker
        self.delayed = delayed
        self.work = work
        self.faults = faults
        self.schedule = schedule
        self.drain_dead_letters = drain_dead_letters
        # One publisher at a time in this process (it takes the store after this lock, never before), and
        # one process at a time of the deployment for the looks of waiting consumers (publisher_lease.py).
        self._publishing = threading.Lock()
        self.lease = PublisherLease(destinations, self.name, self.clock)

    def publishing_due(self) -> bool:
        return time.monotonic() >= self.schedule.look_at or self.clock() >= self.schedule.next_due

    def publish_if_due(self) -> None:
        with self._publishing:
            if not self.publishing_due():  # another thread may just have done it
                return
            # A broker away (restarting, unreachable) stops neither this consumer nor its process: the
            # rows stay, and the next look hands them over.
            try:
                self._publish_due(self.lease.held)
                self.drain_dead_letters()
            except BrokerRefused:
                raise
            except BrokerUnavailable as error:
                log.warning("queue %s: due mails wait for the broker: %s", self.name, error)
                self.schedule.look_later()

    def publish_due(self) -> int:
        """Hand the delayed mails that are due to the broker now, whoever holds the lease of the looks;
        returns how many. A waiting `dequeue` looks through `publish_if_due` instead, when a delay of this
        process falls due and every PUBLISH_INTERVAL seconds, while its process holds the lease.

        Crash-safe order, mail by mail: 1. publish; 2. delete the delayed row. A crash after 1 leaves the
        row, which the next run publishes again: a duplicate delivery, which at-least-once allows and the
        view's deletion mark absorbs once the first copy is done."""
        with self._publishing:
            return self._publish_due()

    def _publish_due(self, allowed: Callable[[], bool] = lambda: True) -> int:
        """Publish the due mails, once `allowed` says so (asked only when some are due: a queue with none
        writes nothing, not even a lease)."""
        now = self.clock()
        handed = 0
        while True:
            with self.work.writes():
                due = self.delayed.due(self.name, now, _PUBLISH_BATCH)
                if due and not handed and not allowed():
                    due = []  # another process looks: this one's due mails are its too
                for mail in due:
                    self._hand_over(mail)
            handed += len(due)
            if len(due) < _PUBLISH_BATCH:
                break
        self.schedule.looked(now)
        return handed

    def _hand_over(self, mail: DelayedMail) -> None:
        self.broker.publish(self.name, mail.enqueue_id, mail.payload, mail.priority)
        self.faults.reached(PUBLISH_DUE_AFTER_PUBLISH)
        self.delayed.remove(mail)

    def flush_domain(self, domain: str) -> int:
        """Postfix's `postqueue -s`: make the delayed mails with a recipient at `domain` deliverable now;
        returns how many. The crash-safe order is `flush`'s, the view rows rescheduled from the delayed
        rows' own payloads (no browse)."""
        with self._publishing:
            now = self.clock()
            rows = []
            for mail in self.delayed.all(self.name):
                row = EnqueuedMail.from_payload(mail.payload)[0]
                if any(address_key(recipient)[1] == domain for recipient in row.recipient_list):
                    with self.work.writes():
                        self._hand_over(mail)
                    rows.append(row)
        self.faults.reached(FLUSH_AFTER_DELAYED_ROWS)
        self.view.reschedule(rows, now)
        return len(rows)

    def flush(self) -> int:
        """Make every delayed mail deliverable now; returns how many were waiting.

        Crash-safe order: 1. publish each delayed mail and delete its row, as `publish_due` does; 2. set
        the view rows' next delivery to now. A crash in 1 leaves rows that are published again when due
        (a duplicate, absorbed as there); after 1, browse shows the former next deliveries, which
        flushing again corrects."""
        with self._publishing:
            now = self.clock()
            waiting = self.delayed.all(self.name)
            for first in range(0, len(waiting), _PUBLISH_BATCH):
                with self.work.writes():
                    for mail in waiting[first : first + _PUBLISH_BATCH]:
                        self._hand_over(mail)
        self.faults.reached(FLUSH_AFTER_DELAYED_ROWS)
        self.view.reschedule([row for row in live_rows(self.view, self.name) if row.next_delivery > now], now)
        return len(waiting)
