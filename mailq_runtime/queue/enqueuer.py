"""Enqueue: a mail's content to the blob store, its row to the view, its delivery to the broker or, while
it waits for a delay, to the delayed mails."""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Callable, Iterable

from ..blobs.dedup import DeduplicatingBlobStore
from ..brokers.base import Broker
from ..errors import BACKEND_FAILURES, BrokerRefused, BrokerUnavailable, InvalidInput
from ..faults import ENQUEUE_AFTER_REFERENCES, ENQUEUE_AFTER_VIEW_ROW, FaultInjector
from ..metrics import seconds_since
from ..model import EnqueueId, Mail, check_message, check_priority, delivery_time, split_message
from ..stores.protocols import DelayedMails, Destinations, QueueView
from ..stores.records import DelayedMail, DestinationCount, EnqueuedMail
from ..unit_of_work import UnitOfWork
from .context import Delay, QueueContext, QueuePart, slice_of
from .delays import DueSchedule
from .destinations import moves

log = logging.getLogger(__name__)
# An enqueue's mail, delay and priority, as the holder of the turn writes it.
_Request = tuple[Mail, Delay, int]


def _merged(changes: Iterable[DestinationCount]) -> list[DestinationCount]:
    """One change a domain, state and slot: a group's mails mostly share them."""
    sums: dict[tuple[str, str, int], int] = {}
    for change in changes:
        key = (change.domain, change.state, change.slot)
        sums[key] = sums.get(key, 0) + change.mails
    return [DestinationCount(*key, mails) for key, mails in sums.items()]


def check_enqueue(mail: Mail, delay: Delay, priority: int | None, max_message_size: int, now: int) -> int:
    """Refuse what an enqueue must refuse, before anything is written (the CLI calls it before it opens
    the store, so refused input does not even create a data dir). Returns the priority to store."""
    if not isinstance(mail, Mail):
        raise InvalidInput(f"enqueue takes a Mail, not {type(mail).__name__}")
    # What the worker would dead-letter as malformed is refused here, at the edge.
    check_message(mail.message, max_message_size)
    delivery_time(now, delay)
    return check_priority(priority)


class FailedEnqueues(QueuePart):
    """The enqueues of this process that a backend failed once their view row may have been written: a
    store that applied the row and lost its answer with the connection, or a broker and delayed mails
    that could take the mail nowhere. Such a row is live, counted and published nowhere: its producer,
    told the enqueue failed, sends the mail again, while the row would wait in the queue's size for ever
    (or for a `republish`). So each is withdrawn once the store answers again: marked deleted, its
    content released, and its slice recounted, as its row or its count may never have been written.
    The next enqueue and an idle consumer's wait try; a process that dies first leaves them to
    `republish`, as a crash does."""

    def __init__(
        self,
        context: QueueContext,
        *,
        view: QueueView,
        blobs: DeduplicatingBlobStore,
        destinations: Destinations,
        work: UnitOfWork,
    ) -> None:
        super().__init__(context)
        self.view = view
        self.blobs = blobs
        self.destinations = destinations
        self.work = work
        self._lock = threading.Lock()
        self._rows: list[tuple[EnqueuedMail, bool]] = []

    def add(self, row: EnqueuedMail, counted: bool) -> None:
        """`counted`: its destination domains' counts were written (destinations.py)."""
        with self._lock:
            self._rows.append((row, counted))

    def withdraw(self) -> None:
        """Withdraw the failed enqueues, in order, until the store fails again (the rest wait for the
        next call)."""
        if not self._rows:  # the usual case, read without the lock
            return
        with self._lock:
            rows, self._rows = self._rows, []
        for done, (row, counted) in enumerate(rows):
            try:
                with self.work.writes():
                    self.view.mark_deleted(self.name, row.enqueue_id, row.slice_start, row.bucket)
                    self.blobs.release_saved(row.enqueue_id, (row.header_blob_id, row.body_blob_id))
                    if counted:
                        self.destinations.count(self.name, moves(row, -1))
                self.view.recount(self.name, row.slice_start)
            except BACKEND_FAILURES as error:
                log.info("queue %s: failed enqueues wait to be withdrawn: %s", self.name, error)
                with self._lock:
                    self._rows[:0] = rows[done:]
                return
            log.info("queue %s: mail %s withdrawn, its enqueue failed", self.name, row.enqueue_id)


class Enqueuer(QueuePart):
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
        browse_start_limit: Callable[[], int],
        failed: FailedEnqueues,
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
        self.browse_start_limit = browse_start_limit
        self.failed = failed
        self._exists = False  # created by an enqueue of this process: no need to create it again

    def enqueue(self, mail: Mail, delay: Delay = None, priority: int | None = None) -> EnqueueId:
        """Accept `mail`, deliverable after `delay`; returns its enqueue id.

        Crash-safe order: 1. the queue's browse_start and content_start, at its first enqueue; 2. the
        content and its references (owner: the new enqueue id); 3. the view row, then its count per
        destination domain (destinations.py); 4. the broker message,
        or with a delay the delayed row. Every step is idempotent, and a mail is only delivered through
        what step 4 writes, so a crash never delivers part of a mail. A crash after 2 leaves references
        whose owner exists nowhere, which the orphan sweep releases; after 3, a mail that browse and size
        show but that no broker holds, which republish sends (or delays again). A backend failing 3 or 4
        leaves the same, which this process withdraws once the store answers (`FailedEnqueues`).
        """
        started = time.perf_counter()
        context = self.context
        priority = check_enqueue(mail, delay, priority, context.max_message_size, context.clock())
        self.failed.withdraw()
        # In the turn, by this thread or by the one holding it for another enqueue (unit_of_work.py).
        if delay is None:
            # Due now, to the broker: in a group's one call a table, by the holder of the turn.
            enqueue_id = self.work.in_group((mail, delay, priority), self._write_all)
        else:
            enqueue_id = self.work.in_turn(lambda: self._write(mail, delay, priority))
        self._exists = True
        self.metrics.enqueued.inc()
        self.metrics.enqueue_seconds.observe(seconds_since(started))
        return enqueue_id

    def _write(self, mail: Mail, delay: Delay, priority: int) -> EnqueueId:
        context = self.context
        now = context.clock()
        next_delivery = delivery_time(now, delay)
        enqueue_id = EnqueueId.generate(now)
        header, body = split_message(mail.message)
        bucket = zlib.crc32(mail.name.encode()) % context.configuration.bucket_count
        with self.work.writes():
            if not self._exists:
                # Created by its first accepted mail, so refused input never leaves an empty queue.
                self.view.create_queue(self.name, self.browse_start_limit(), now)
            blob_ids = self.blobs.save_new(enqueue_id, [header, body])
            self.faults.reached(ENQUEUE_AFTER_REFERENCES)
            row = EnqueuedMail.of(
                mail,
                self.name,
                enqueue_id,
                now,
                next_delivery,
                priority,
                slice_of(now, context.configuration.slice_window),
                bucket,
                *blob_ids,
            )
            counted = False
            try:
                self.view.insert(row)
                self.destinations.count(self.name, moves(row, 1))
                counted = True
                self.faults.reached(ENQUEUE_AFTER_VIEW_ROW)
                self.send(row, next_delivery, now)
            except BACKEND_FAILURES:
                self.failed.add(row, counted)
                raise
        return enqueue_id

    def _write_all(self, requests: list[_Request]) -> list[EnqueueId]:
        """The enqueues of a group handed over together (`in_group`, unit_of_work.py): one call a table
        for them all, in the crash-safe order of one (`enqueue`). A failure fails the call, and the store
        then writes each enqueue alone (`_write`), which gives each its own outcome."""
        if len(requests) == 1:
            return [self._write(*requests[0])]
        context = self.context
        now = context.clock()
        configuration = context.configuration
        enqueue_ids = [EnqueueId.generate(now) for _ in requests]
        saves = [
            (enqueue_id, split_message(mail.message))
            for enqueue_id, (mail, _, _) in zip(enqueue_ids, requests, strict=True)
        ]
        with self.work.writes():
            if not self._exists:
                self.view.create_queue(self.name, self.browse_start_limit(), now)
            saved = self.blobs.save_new_many(saves)
            self.faults.reached(ENQUEUE_AFTER_REFERENCES)
            rows = [
                EnqueuedMail.of(
                    mail,
                    self.name,
                    enqueue_id,
                    now,
                    now,
                    priority,
                    slice_of(now, configuration.slice_window),
                    zlib.crc32(mail.name.encode()) % configuration.bucket_count,
                    *blob_ids,
                )
                for enqueue_id, (mail, _, priority), blob_ids in zip(
                    enqueue_ids, requests, saved, strict=True
                )
            ]
            self.view.insert_many(rows)
            self.destinations.count(self.name, _merged(change for row in rows for change in moves(row, 1)))
            self.faults.reached(ENQUEUE_AFTER_VIEW_ROW)
            self.broker.publish_many(
                self.name, [(row.enqueue_id, row.to_payload(), row.priority) for row in rows]
            )
        return enqueue_ids

    def send(self, row: EnqueuedMail, due: int, now: int) -> None:
        """Publish the mail, or hold it in the delayed mails until `due`. A broker that cannot take it now
        (unreachable, restarting) leaves it held as a delayed mail already due, which the next publisher
        of due mails hands over once the broker is back, with no operator's republish."""
        payload = row.to_payload()
        if due <= now:
            try:
                self.broker.publish(self.name, row.enqueue_id, payload, row.priority)
                return
            except BrokerRefused:
                raise  # its configuration is wrong: the caller must know (an enqueue then withdraws it)
            except BrokerUnavailable as error:
                # The broker link logs the outage once; a line per mail would flood the log meanwhile.
                log.info("queue %s: mail %s waits for the broker: %s", self.name, row.enqueue_id, error)
        self.schedule.expect(due)
        self.delayed.add(DelayedMail(self.name, row.enqueue_id, due, row.priority, payload))
