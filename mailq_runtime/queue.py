"""The mail queue of records 31 and 32: enqueue, dequeue, browse, size, remove, clear, flush, republish,
and the dead letters.

Content goes to the deduplicating blob store (owner: the enqueue id), the mail's row to the time series
`enqueued_mails` (queue, slice, bucket), the delivery to the broker, or, while it waits for a delay, to
the delayed mails of the metadata store. A dequeue is a broker delivery checked against `deleted_mails`;
browse and size read the view from `browse_start` on. Mails that will not be delivered become dead
letters, records of the metadata store that an operator lists, requeues or purges.

No path assumes a transaction across its writes: each call to a store or the broker commits on its own,
and each path writes in an order where a crash leaves only what a later step heals (its docstring says
which). `group_writes` may group one operation's writes and `one_turn` hold the store over a whole operation,
for speed (runtime.py); nothing here depends on either.
"""

from __future__ import annotations

import heapq
import logging
import random
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from types import TracebackType

from .blobs.dedup import DeduplicatingBlobStore
from .brokers.base import Broker, BrokerDeadLetter, Delivery
from .clock import LATEST, MICROS_PER_SECOND, Clock, to_datetime
from .config import ConfigurationStore, QueueViewConfiguration
from .errors import (
    BACKEND_FAILURES,
    BlobNotFound,
    BrokerRefused,
    BrokerUnavailable,
    InvalidInput,
    LeaseExpired,
    UnknownQueue,
    shown,
)
from .faults import (
    CLEAN_AFTER_BROWSE_START,
    CLEAN_AFTER_DELETE,
    CLEAN_AFTER_RELEASE,
    DONE_AFTER_DELETION_MARK,
    DONE_AFTER_MARK,
    DONE_AFTER_RELEASE,
    ENQUEUE_AFTER_REFERENCES,
    ENQUEUE_AFTER_VIEW_ROW,
    FLUSH_AFTER_DELAYED_ROWS,
    PUBLISH_DUE_AFTER_PUBLISH,
    PURGE_AFTER_REMOVE,
    REJECT_AFTER_DEAD_LETTER,
    REJECT_AFTER_MARK,
    REMOVE_AFTER_MARK,
    REMOVE_AFTER_RELEASE,
    REQUEUE_AFTER_ENQUEUE,
    REQUEUE_AFTER_REMOVE,
    RETRY_AFTER_ACK,
    RETRY_AFTER_DELAYED_ROW,
    FaultInjector,
)
from .model import (
    NULL_SENDER_SPELLINGS,
    EnqueueId,
    Mail,
    MailAddress,
    QueueName,
    address_key,
    check_message,
    check_priority,
    delivery_time,
    parse_duration,
)
from .overview import QueueOverview, overview
from .stores.protocols import DeadLetters, DelayedMails, QueueView
from .stores.records import DeadLetter, DelayedMail, EnqueuedMail

Delay = timedelta | int | float | str | None
GroupWrites = Callable[[], AbstractContextManager]
log = logging.getLogger(__name__)

# Seconds between a waiting consumer's looks for delayed mails that other processes wrote and that fell
# due (its own process's delays it publishes on time): the bound on how late such a mail is delivered.
PUBLISH_INTERVAL = 1.0
_NEVER = LATEST + 1
# Delayed mails handed to the broker per group of writes.
_PUBLISH_BATCH = 100
# Seconds between an idle consumer's recounts of a queue whose counters count mails that are neither
# delayed nor delivered to it (`_recount_if_idle`): the bound, once a queue idles, on how long a count
# a crash left wrong stays wrong.
RECOUNT_INTERVAL = 60.0


def split_message(message: bytes) -> tuple[bytes, bytes]:
    """Headers (up to and including the blank line) and body; joining them gives the message back."""
    for separator in (b"\r\n\r\n", b"\n\n"):
        index = message.find(separator)
        if index >= 0:
            cut = index + len(separator)
            return message[:cut], message[cut:]
    return message, b""


def slice_of(moment: int, window: int) -> int:
    return moment - moment % window


def check_enqueue(mail: Mail, delay: Delay, priority: int | None, max_message_size: int, now: int) -> int:
    """Refuse what an enqueue must refuse, before anything is written (the CLI calls it before it opens
    the store, so refused input does not even create a data dir). Returns the priority to store."""
    if not isinstance(mail, Mail):
        raise InvalidInput(f"enqueue takes a Mail, not {type(mail).__name__}")
    # What the worker would dead-letter as malformed is refused here, at the edge.
    check_message(mail.message, max_message_size)
    delivery_time(now, delay)
    return check_priority(priority)


@dataclass
class BrowseItem:
    enqueue_id: EnqueueId
    name: str
    sender: str | None
    recipients: list[str]
    enqueued_time: datetime
    next_delivery: datetime
    _row: EnqueuedMail = field(repr=False)
    _queue: MailQueue = field(repr=False)

    @property
    def mail(self) -> Mail:
        return self._queue._load(self._row)


@dataclass
class DeadLetterItem:
    """A dead letter as the operator sees it. The mail's fields are None when its broker message could
    not be read (the reason says so); `mail` reads the content."""

    enqueue_id: str
    reason: str
    died_at: datetime
    name: str | None
    sender: str | None
    recipients: list[str]
    enqueued_time: datetime | None
    _row: EnqueuedMail | None = field(repr=False)
    _queue: MailQueue = field(repr=False)

    @property
    def mail(self) -> Mail:
        if self._row is None:
            raise InvalidInput(f"dead letter {self.enqueue_id} holds no readable mail: {self.reason}")
        return self._queue._load(self._row)


class MailQueueItem:
    """A dequeued mail, leased to this consumer until `done()`, `retry()` or `reject()`.

    The lease lasts the visibility timeout, and `extend_lease()` pushes it out. Once it has expired,
    the broker may give the mail to another consumer; then `done()`, `retry()` and `reject()` raise
    LeaseExpired (the item still counts as settled)."""

    def __init__(
        self, queue: MailQueue, delivery: Delivery, row: EnqueuedMail, mail: Mail, attempts: int
    ) -> None:
        self._queue = queue
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
        self._queue._done(self._delivery, self._row)

    def retry(self, delay: Delay = None) -> None:
        """Not delivered this time: deliver it again, after `delay` if given. With the lease lost it
        changes nothing and raises LeaseExpired."""
        deliver_at = delivery_time(self._queue.clock(), delay)  # a malformed delay leaves the item unsettled
        self._settle()
        self._queue._retry(self._delivery, self._row, deliver_at, self.attempts)

    def release(self) -> None:
        """Not tried: a backend the delivery needs is away. Give the mail back, deliverable again at once,
        without counting this delivery towards any limit. With the lease lost it changes nothing and
        raises LeaseExpired."""
        self._settle()
        self._queue._release(self._delivery, self._row)

    def reject(self, reason: str = "rejected") -> None:
        """Never deliverable: move it to the dead letters, which keep its content. With the lease lost
        it changes nothing and raises LeaseExpired."""
        self._settle()
        self._queue._reject(self._delivery, self._row, reason)

    def extend_lease(self, duration: Delay = None) -> None:
        """Keep the mail leased to this consumer for `duration` from now (default: the visibility
        timeout), so that a long delivery is not given to another consumer meanwhile. Raises
        LeaseExpired if another consumer already has it."""
        length = self._queue.broker.visibility_timeout
        if duration is not None:
            length = parse_duration(duration, "lease extension")
            if not length:
                raise InvalidInput(f"invalid lease extension {shown(duration)}: must be longer than zero")
        if self.settled:
            raise InvalidInput(f"mail {self.enqueue_id} was already acknowledged: it holds no lease")
        if not self._queue._extend(self._delivery, length):
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


class MailQueue:
    def __init__(
        self,
        name: QueueName,
        view: QueueView,
        broker: Broker,
        blobs: DeduplicatingBlobStore,
        dead_letters: DeadLetters,
        delayed: DelayedMails,
        configuration: QueueViewConfiguration,
        configurations: ConfigurationStore,
        clock: Clock,
        max_message_size: int,
        clock_skew_grace: int,
        *,
        group_writes: GroupWrites = nullcontext,
        one_turn: GroupWrites = nullcontext,
        faults: FaultInjector | None = None,
    ) -> None:
        self.name = name
        self.view = view
        self.broker = broker
        self.blobs = blobs
        self.dead_letter_records = dead_letters
        self.delayed = delayed
        # The configuration this process writes with, read once at open as James does; readers of the
        # view ask `configurations` for what other processes may be writing with.
        self.configuration = configuration
        self.configurations = configurations
        self.clock = clock
        self.max_message_size = max_message_size
        self.clock_skew_grace = clock_skew_grace
        self.group_writes = group_writes
        self.one_turn = one_turn
        self.faults = FaultInjector() if faults is None else faults
        self._random = random.Random()
        self._exists = False  # created by an enqueue of this process: no need to create it again
        # One publisher at a time in this process (it takes the store after this lock, never before).
        self._publishing = threading.Lock()
        # The publisher's schedule: when a dequeue next looks for due mails (time.monotonic(), so that a
        # clock set back delays nothing), and the due times of the delays this process wrote, so that those
        # are published on time rather than up to an interval late. Its lock is held for nothing else, as
        # delays are scheduled in the middle of a group of writes.
        self._schedule = threading.Lock()
        self._look_at = 0.0
        self._dues: list[int] = []
        self._next_due = _NEVER
        self._recount_at = 0.0  # time.monotonic() of the next idle recount
        self._widest_window: int | None = None  # see `_current_slice`

    def __repr__(self) -> str:
        return f"MailQueue({self.name!r})"

    # enqueue / dequeue
    def enqueue(self, mail: Mail, delay: Delay = None, priority: int | None = None) -> EnqueueId:
        """Accept `mail`, deliverable after `delay`; returns its enqueue id.

        Crash-safe order: 1. the queue's browse_start and content_start, at its first enqueue; 2. the
        content and its references (owner: the new enqueue id); 3. the view row; 4. the broker message,
        or with a delay the delayed row. Every step is idempotent, and a mail is only delivered through
        what step 4 writes, so a crash never delivers part of a mail. A crash after 2 leaves references
        whose owner exists nowhere, which the orphan sweep releases; after 3, a mail that browse and size
        show but that no broker holds, which republish sends (or delays again).
        """
        priority = check_enqueue(mail, delay, priority, self.max_message_size, self.clock())
        with self.one_turn():
            now = self.clock()
            next_delivery = delivery_time(now, delay)
            enqueue_id = EnqueueId.generate(now)
            header, body = split_message(mail.message)
            bucket = zlib.crc32(mail.name.encode()) % self.configuration.bucket_count
            with self.group_writes():
                if not self._exists:
                    # Created by its first accepted mail, so refused input never leaves an empty queue.
                    self.view.create_queue(self.name, self.browse_start_limit(), now)
                blob_ids = self.blobs.save_all(enqueue_id, [header, body])
                self.faults.reached(ENQUEUE_AFTER_REFERENCES)
                row = EnqueuedMail.of(
                    mail,
                    self.name,
                    enqueue_id,
                    now,
                    next_delivery,
                    priority,
                    slice_of(now, self.configuration.slice_window),
                    bucket,
                    *blob_ids,
                )
                self.view.insert(row)
                self.faults.reached(ENQUEUE_AFTER_VIEW_ROW)
                self._send(row, next_delivery, now)
        self._exists = True
        return enqueue_id

    def _send(self, row: EnqueuedMail, due: int, now: int, attempts: int = 0) -> None:
        """Publish the mail, or hold it in the delayed mails until `due`. A broker that cannot take it now
        (unreachable, restarting) leaves it held as a delayed mail already due, which the next publisher
        of due mails hands over once the broker is back, with no operator's republish."""
        payload = row.to_payload(attempts)
        if due <= now:
            try:
                self.broker.publish(self.name, row.enqueue_id, payload, row.priority)
                return
            except BrokerRefused:
                raise  # its configuration is wrong: the caller must know, and republish sends it later
            except BrokerUnavailable as error:
                # The broker link logs the outage once; a line per mail would flood the log meanwhile.
                log.info("queue %s: mail %s waits for the broker: %s", self.name, row.enqueue_id, error)
        self._expect(due)
        self.delayed.add(DelayedMail(self.name, row.enqueue_id, due, row.priority, payload))

    def dequeue(self, timeout: Delay = None) -> MailQueueItem | None:
        """The next deliverable mail; blocks while there is none, or returns None after `timeout` (seconds,
        or a duration as `parse_duration` reads it). While it waits it publishes the delayed mails that
        fall due, so consumers need nothing else running."""
        if timeout is not None:
            timeout = parse_duration(timeout, "dequeue timeout") / MICROS_PER_SECOND
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._publishing_due():
                self._publish_if_due()
            until_due = (self._next_due - self.clock()) / MICROS_PER_SECOND
            wait = max(0.0, min(self._look_at - time.monotonic(), until_due))
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - time.monotonic()))
            delivery = self.broker.receive(self.name, wait)
            if delivery is None:
                self._recount_if_idle()
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                continue
            with self._giving_back(delivery), self.one_turn():
                item = self._deliverable(delivery)
            if item is not None:
                return item

    @contextmanager
    def _giving_back(self, delivery: Delivery) -> Iterator[None]:
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

    def _deliverable(self, delivery: Delivery) -> MailQueueItem | None:
        """The item of a broker delivery, or None when the delivery was settled here instead."""
        try:
            row, attempts_before = EnqueuedMail.from_payload(delivery.payload)
        except (ValueError, TypeError) as error:
            # Requeued, it would come back after every visibility timeout and fail every time.
            with self.group_writes():
                self._bury(delivery, None, f"unreadable message: {error}")
            return None
        if not self.view.is_live(row, self._current_slice()):
            self._ack_settled(delivery)  # removed or cleared while waiting in the broker
            return None
        try:
            mail = self._load(row)
        except BlobNotFound as error:
            with self.group_writes():
                self._bury(delivery, row, f"content missing: {error}")
            return None
        return MailQueueItem(self, delivery, row, mail, attempts_before + delivery.attempts)

    def _current_slice(self) -> int | None:
        """A slice start no process can have moved browse_start past: now aligned on the widest
        sliceWindow ever in force. browse_start never passes a process's `browse_start_limit`, whose
        clock is at most the clock-skew grace ahead of this one, and every window divides the widest,
        so every limit lies on its grid. The widest is the first configuration's, read once; None
        until a configuration is registered."""
        if self._widest_window is None:
            windows = [configuration.slice_window for configuration in self.configurations.history()]
            if not windows:
                return None
            self._widest_window = max(windows)
        return slice_of(self.clock(), max(self._widest_window, self.configuration.slice_window))

    def _load(self, row: EnqueuedMail) -> Mail:
        return row.to_mail(self.blobs.read(row.header_blob_id) + self.blobs.read(row.body_blob_id))

    def _extend(self, delivery: Delivery, length: int) -> bool:
        return self.broker.extend(delivery, min(self.clock() + length, LATEST))

    def _done(self, delivery: Delivery, row: EnqueuedMail) -> None:
        """Crash-safe order: 1. mark the mail deleted, then count it; 2. release its references (those
        its row names, not read again); 3. ack. A crash after 1 or 2 leaves the broker message, which the
        next consumer acks as not live; after 1, also the references, which record 32's clean-up
        releases with the mail's slice; between the mark and the count, a counter `recount` corrects.
        A backend failing before the ack gives the delivery back (`_giving_back`): after 1, its next
        consumer acks it as not live. A lost broker connection at 3 fails nothing: the mark absorbs the
        message RabbitMQ sends again."""
        with self._giving_back(delivery), self.group_writes():
            self.view.mark_done(
                self.name,
                row.enqueue_id,
                row.slice_start,
                row.bucket,
                lambda: self.faults.reached(DONE_AFTER_DELETION_MARK),
            )
            self.faults.reached(DONE_AFTER_MARK)
            self.blobs.release_saved(row.enqueue_id, (row.header_blob_id, row.body_blob_id))
            self.faults.reached(DONE_AFTER_RELEASE)
            acked = self._ack_settled(delivery)
        # Raised once the writes are done, and not undone: the mail was delivered even with the lease
        # lost, and the mark keeps a consumer that has not loaded it yet from delivering it again.
        self._maybe_update_browse_start()
        if not acked:
            raise LeaseExpired(
                f"mail {row.enqueue_id} is recorded as delivered, but its lease was lost: it expired and "
                "another consumer took the mail, which may deliver it again (at-least-once)"
            )

    def _retry(self, delivery: Delivery, row: EnqueuedMail, deliver_at: int, attempts: int) -> None:
        """Without a delay, one write: the broker requeues the message. With one, crash-safe order: 1. the
        delayed row (its payload counts the attempts so far); 2. ack; 3. the view row's next delivery. A
        crash after 1 leaves the broker message too, delivered again once the lease expires and once more
        when the row falls due (at-least-once; the view's deletion mark absorbs the later copy once the
        mail is done); after 2, browse shows the former next delivery until the row is published.
        A lease lost meanwhile (the ack fails) takes the delayed row back: the mail is another consumer's;
        so does a connection to the broker lost meanwhile, as the broker delivers the mail again at once.
        A backend failing before the ack gives the delivery back (`_giving_back`)."""
        if deliver_at <= self.clock():
            try:
                requeued = self.broker.requeue(delivery)
            except BrokerUnavailable as error:
                # What was asked: the broker delivers it again at once, from its own copy.
                log.info(
                    "queue %s: mail %s given back with the connection: %s", self.name, row.enqueue_id, error
                )
                return
            if not requeued:
                raise self._lost(row, "retried")
            return
        later = replace(row, next_delivery=deliver_at)
        delayed = DelayedMail(self.name, row.enqueue_id, deliver_at, row.priority, later.to_payload(attempts))
        self._expect(deliver_at)  # first: a look for nothing costs less than a row published late
        with self._giving_back(delivery), self.group_writes():
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
            else:
                self.delayed.remove(delayed)
        if not acked:
            raise self._lost(row, "retried")

    def _release(self, delivery: Delivery, row: EnqueuedMail) -> None:
        try:
            released = self.broker.release(delivery)
        except BrokerUnavailable as error:
            # What was asked: the broker delivers it again, from its own copy.
            log.info("queue %s: mail %s given back with the connection: %s", self.name, row.enqueue_id, error)
            return
        if not released:
            raise self._lost(row, "given back")

    def _reject(self, delivery: Delivery, row: EnqueuedMail, reason: str) -> None:
        """Crash-safe order: 1. extend the lease, which says whether it still holds (a mail another consumer
        took is left alone, unchanged); 2. the dead letter; 3. mark the mail deleted; 4. ack. A crash
        after 2 leaves a live mail that is delivered again once the lease expires (its dead letter is
        replaced if it is rejected again); after 3, a broker message the next consumer acks as not live.
        The mail is never lost: it is in the queue or in the dead letters, or both. A backend failing
        before the ack gives the delivery back (`_giving_back`)."""
        with self._giving_back(delivery):
            self._reject_held(delivery, row, reason)

    def _reject_held(self, delivery: Delivery, row: EnqueuedMail, reason: str) -> None:
        if not self.view.is_live(row):
            # Delivered by a consumer whose lease had expired, or removed: its content is released, so a
            # dead letter would be an empty one. There is nothing left to reject.
            if not self._ack_settled(delivery):
                raise self._lost(row, "rejected")
            return
        if not self._extend(delivery, self.broker.visibility_timeout):
            raise self._lost(row, "rejected")
        with self.group_writes():
            self._bury(delivery, row, reason)
        self._maybe_update_browse_start()

    def _bury(self, delivery: Delivery, row: EnqueuedMail | None, reason: str) -> None:
        """Dead-letter a delivery this consumer holds (`row` None: its payload is unreadable), in the
        crash-safe order of `_reject`'s steps 2 to 4."""
        self._entomb(delivery.enqueue_id, delivery.payload, row, reason, self.clock())
        # An ack that finds the lease lost is no failure: the letter is written, and the consumer that
        # took the mail acks it as not live.
        self._ack_settled(delivery)

    def _ack_settled(self, delivery: Delivery) -> bool:
        """Ack a delivery whose mail the store already records as settled; whether the lease held. A
        connection to the broker lost meanwhile fails nothing: the store absorbs the copy sent again."""
        try:
            return self.broker.ack(delivery)
        except BrokerUnavailable as error:
            log.info("queue %s: mail %s settled, its ack lost: %s", self.name, delivery.enqueue_id, error)
            return True

    def _entomb(
        self, enqueue_id: str, payload: str, row: EnqueuedMail | None, reason: str, died_at: int
    ) -> None:
        """The dead letter, then the deletion mark of its mail (if its payload could be read)."""
        self.dead_letter_records.add(DeadLetter(self.name, enqueue_id, reason, died_at, payload))
        self.faults.reached(REJECT_AFTER_DEAD_LETTER)
        if row is not None:
            self.view.mark_deleted(self.name, row.enqueue_id, row.slice_start, row.bucket)
            self.faults.reached(REJECT_AFTER_MARK)

    def drain_dead_letters(self) -> int:
        """Move the mails the broker gave up on by itself (RabbitMQ's delivery limit: every consumer died
        or lost its lease on them) into the dead letters, with the broker's reason; returns how many.
        `dequeue` does it while it waits, and listing the dead letters does it first.

        Crash-safe order, letter by letter: 1. the dead letter; 2. the mail's deletion mark; then the
        broker forgets them. A crash leaves them in the broker, which hands them over again: adding a
        letter again replaces it. A mail removed or delivered meanwhile gets no letter: its content is
        released."""
        drained = 0
        while moved := self.broker.drain_dead_letters(self.name, self._keep_dead_letters):
            drained += moved
        return drained

    def _keep_dead_letters(self, letters: list[BrokerDeadLetter]) -> None:
        for letter in letters:
            try:
                row, _ = EnqueuedMail.from_payload(letter.payload)
            except (ValueError, TypeError):
                row = None
            if row is not None and not self.view.is_live(row):
                continue
            with self.group_writes():
                self._entomb(letter.enqueue_id, letter.payload, row, letter.reason, letter.died_at)

    def _drain_quietly(self) -> None:
        # Listing the letters the metadata store holds must not fail because the broker is away.
        try:
            self.drain_dead_letters()
        except BrokerUnavailable as error:
            log.warning("queue %s: the broker's dead letters are not listed yet: %s", self.name, error)

    @staticmethod
    def _lost(row: EnqueuedMail, action: str) -> LeaseExpired:
        return LeaseExpired(
            f"mail {row.enqueue_id} was not {action}, nothing changed: its lease was lost (it expired and "
            "another consumer took the mail, which settles it now)"
        )

    # delays
    def _expect(self, due: int) -> None:
        with self._schedule:
            heapq.heappush(self._dues, due)
            self._next_due = self._dues[0]

    def _publishing_due(self) -> bool:
        return time.monotonic() >= self._look_at or self.clock() >= self._next_due

    def _publish_if_due(self) -> None:
        with self._publishing:
            if self._publishing_due():  # another thread may just have done it
                # A broker away (restarting, unreachable) stops neither this consumer nor its process:
                # the rows stay, and the next look hands them over.
                try:
                    self._publish_due()
                    self.drain_dead_letters()
                except BrokerRefused:
                    raise
                except BrokerUnavailable as error:
                    log.warning("queue %s: due mails wait for the broker: %s", self.name, error)
                    with self._schedule:
                        self._look_at = time.monotonic() + PUBLISH_INTERVAL

    def publish_due(self) -> int:
        """Hand the delayed mails that are due to the broker; returns how many. `dequeue` calls it when a
        delay of this process falls due and every PUBLISH_INTERVAL seconds while it waits.

        Crash-safe order, mail by mail: 1. publish; 2. delete the delayed row. A crash after 1 leaves the
        row, which the next run publishes again: a duplicate delivery, which at-least-once allows and the
        view's deletion mark absorbs once the first copy is done."""
        with self._publishing:
            return self._publish_due()

    def _publish_due(self) -> int:
        now = self.clock()
        handed = 0
        while True:
            with self.group_writes():
                due = self.delayed.due(self.name, now, _PUBLISH_BATCH)
                for mail in due:
                    self._hand_over(mail)
            handed += len(due)
            if len(due) < _PUBLISH_BATCH:
                break
        with self._schedule:
            while self._dues and self._dues[0] <= now:
                heapq.heappop(self._dues)
            self._next_due = self._dues[0] if self._dues else _NEVER
            self._look_at = time.monotonic() + PUBLISH_INTERVAL
        return handed

    def _hand_over(self, mail: DelayedMail) -> None:
        self.broker.publish(self.name, mail.enqueue_id, mail.payload, mail.priority)
        self.faults.reached(PUBLISH_DUE_AFTER_PUBLISH)
        self.delayed.remove(mail)

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
                with self.group_writes():
                    for mail in waiting[first : first + _PUBLISH_BATCH]:
                        self._hand_over(mail)
        self.faults.reached(FLUSH_AFTER_DELAYED_ROWS)
        self.view.reschedule([item._row for item in self.browse() if item._row.next_delivery > now], now)
        return len(waiting)

    # browse / size
    def browse(self) -> Iterator[BrowseItem]:
        """The mails still enqueued, in enqueue order, read from `browse_start` on."""
        browse_start = self.view.browse_start(self.name)
        if browse_start is None:
            return  # not created yet: empty
        for slice_start in self.view.slices_from(self.name, browse_start):
            for row in self.view.live_mails(self.name, slice_start):
                yield BrowseItem(
                    row.enqueue_id,
                    row.name,
                    row.sender,
                    row.recipient_list,
                    to_datetime(row.enqueued_time),
                    to_datetime(row.next_delivery),
                    row,
                    self,
                )

    def size(self) -> int:
        """Read from the per-slice counters: the cost does not grow with the queue's history. A slice
        counted below zero, which no queue holds, is recounted first (see `recount`)."""
        browse_start = self.view.browse_start(self.name)
        if browse_start is None:
            return 0
        sizes = self.view.slice_sizes(self.name, browse_start)
        if any(live < 0 for _, live in sizes):
            self.recount()
            sizes = self.view.slice_sizes(self.name, browse_start)
        return sum(max(live, 0) for _, live in sizes)

    def recount(self) -> int:
        """Correct the counters of every slice from browse_start on against its rows and deletion marks,
        as a browse reads them; returns the sum of the corrections' sizes (0: the counters were right).

        A crash between a done()'s deletion mark and its count, or two settlements of one mail at once,
        leaves a slice's counters wrong by one. An idle consumer recounts on its own (`dequeue`, at most
        every RECOUNT_INTERVAL seconds while the counters count mails it cannot find), as does `size()`
        when a slice is counted below zero. It costs a browse."""
        browse_start = self.view.browse_start(self.name)
        if browse_start is None:
            return 0
        corrected = 0
        for slice_start in self.view.slices_from(self.name, browse_start):
            corrected += self.view.recount(self.name, slice_start)
        if corrected:
            log.warning("queue %s: counters corrected by %d from the rows", self.name, corrected)
        return corrected

    def _recount_if_idle(self) -> None:
        """Recount when nothing was delivered to this consumer, yet the counters count mails that are not
        delayed (or a slice below zero): those are mails in flight with other consumers, or a count a
        crash left wrong. At most every RECOUNT_INTERVAL seconds; a failure is left to the next one."""
        if time.monotonic() < self._recount_at:
            return
        self._recount_at = time.monotonic() + RECOUNT_INTERVAL
        try:
            browse_start = self.view.browse_start(self.name)
            if browse_start is None:
                return
            sizes = self.view.slice_sizes(self.name, browse_start)
            counted = sum(live for _, live in sizes)
            if (
                counted > self.delayed.summary(self.name, self.clock()).waiting
                or min((live for _, live in sizes), default=0) < 0
            ):
                self.recount()
        except Exception as error:  # a side task of the consumer's wait: it must not fail the dequeue
            log.warning("queue %s: the idle recount failed, the next one retries: %s", self.name, error)

    def overview(self) -> QueueOverview:
        """Ready, in-flight, delayed and dead-lettered mails and the oldest of each, without a browse
        (overview.py says how exact each figure is on each broker)."""
        return overview(self)

    # management
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
        """Crash-safe order, mail by mail: 1. mark it deleted; 2. release its references; 3. drop its
        delayed row, if it waits for one. A crash after 1 leaves the references, which record 32's
        clean-up releases with the slice; after 2, a delayed row that is published when due and acked as
        not live. A mail marked is out of browse and size, so running the removal again finds the rest."""
        deleted = 0
        now = self.clock()
        for item in list(self.browse()):
            row = item._row
            if not matches(row):
                continue
            with self.group_writes():
                if self.view.mark_deleted(self.name, row.enqueue_id, row.slice_start, row.bucket):
                    self.faults.reached(REMOVE_AFTER_MARK)
                    self.blobs.release(row.enqueue_id)
                    self.faults.reached(REMOVE_AFTER_RELEASE)
                    if row.next_delivery > now:
                        self.delayed.remove(
                            DelayedMail(self.name, row.enqueue_id, row.next_delivery, row.priority, "")
                        )
                    deleted += 1
        if deleted:
            self._maybe_update_browse_start()
        return deleted

    def republish(self, older_than: Delay) -> int:
        """Publish again the mails older than `older_than` that the view holds but neither the broker nor
        the delayed mails do (a broker outage, a crash in the middle of an enqueue); a mail whose next
        delivery is still to come is delayed again instead. Each mail is one write, so a crash leaves
        the rest to the next run."""
        now = self.clock()
        cutoff = now - parse_duration(older_than, "older_than")
        candidates = [item._row for item in self.browse() if item._row.enqueued_time < cutoff]
        held = self.broker.published(self.name, [row.enqueue_id for row in candidates])
        held |= {mail.enqueue_id for mail in self.delayed.all(self.name)}
        republished = 0
        for row in candidates:
            if row.enqueue_id not in held:
                self._send(row, row.next_delivery, now)
                republished += 1
        return republished

    # dead letters
    def dead_letters(self) -> list[DeadLetterItem]:
        """The queue's dead letters, in enqueue order (those the broker gave up on moved in first)."""
        self._drain_quietly()
        return [self._dead_letter_item(letter) for letter in self.dead_letter_records.list(self.name)]

    def dead_letter_reasons(self) -> list[tuple[str, datetime]]:
        """The reason and the death time of each dead letter, without reading their messages (those the
        broker gave up on moved in first)."""
        self._drain_quietly()
        return [(reason, to_datetime(died)) for reason, died in self.dead_letter_records.reasons(self.name)]

    def dead_letter(self, enqueue_id: str) -> DeadLetterItem:
        """One dead letter; its `mail` holds the content. Raises InvalidInput if there is no such letter."""
        return self._dead_letter_item(self._letter(enqueue_id))

    def _letter(self, enqueue_id: str) -> DeadLetter:
        self._drain_quietly()
        letter = self.dead_letter_records.get(self.name, EnqueueId(enqueue_id))
        if letter is None:
            raise InvalidInput(f"queue {self.name!r} holds no dead letter {enqueue_id}")
        return letter

    def _dead_letter_item(self, letter: DeadLetter) -> DeadLetterItem:
        try:
            row, _ = EnqueuedMail.from_payload(letter.payload)
        except (ValueError, TypeError):
            row = None
        return DeadLetterItem(
            letter.enqueue_id,
            letter.reason,
            to_datetime(letter.died_at),
            None if row is None else row.name,
            None if row is None else row.sender,
            [] if row is None else row.recipient_list,
            None if row is None else to_datetime(row.enqueued_time),
            row,
            self,
        )

    def requeue_dead_letters(self, enqueue_id: str | None = None, *, every: bool = False) -> list[EnqueueId]:
        """Put the dead letter `enqueue_id` (or `every` one) back in the queue, deliverable now with its
        priority; returns the new enqueue ids. Each is enqueued anew under a new enqueue id (its view
        row is deleted for good), with the same mail fields.

        Crash-safe order, letter by letter: 1. enqueue its mail anew (enqueue's own order); 2. remove the
        letter; 3. release the old enqueue id's references. A crash after 1 leaves the letter as well as
        the requeued mail, so requeueing it again delivers it twice (at-least-once); after 2, references
        whose owner is gone, which the content clean-up or the orphan sweep releases. Letters whose
        message cannot be read are refused before anything is written: purge those."""
        letters = self._chosen_letters(enqueue_id, every=every)
        rows = []
        for letter in letters:
            try:
                rows.append(EnqueuedMail.from_payload(letter.payload)[0])
            except (ValueError, TypeError):
                raise InvalidInput(
                    f"dead letter {letter.enqueue_id} holds no readable mail ({letter.reason}): it cannot "
                    "be requeued, only purged"
                ) from None
        requeued = []
        for letter, row in zip(letters, rows, strict=True):
            requeued.append(self.enqueue(self._load(row), priority=row.priority))
            self.faults.reached(REQUEUE_AFTER_ENQUEUE)
            self.dead_letter_records.remove(self.name, letter.enqueue_id)
            self.faults.reached(REQUEUE_AFTER_REMOVE)
            self.blobs.release(letter.enqueue_id)
        return requeued

    def purge_dead_letters(self, enqueue_id: str | None = None, *, older_than: Delay = None) -> int:
        """Delete the dead letter `enqueue_id`, or those that died more than `older_than` ago, and
        release their content; returns how many.

        Crash-safe order, letter by letter: 1. remove the letter; 2. release its references. A crash
        after 1 leaves references whose owner is gone, which the content clean-up or the orphan sweep
        releases."""
        if (enqueue_id is None) == (older_than is None):
            raise InvalidInput("purge takes exactly one of an enqueue id or older_than")
        if enqueue_id is not None:
            letters = [self._letter(enqueue_id)]
        else:
            cutoff = self.clock() - parse_duration(older_than, "older_than")
            self._drain_quietly()
            letters = [
                letter for letter in self.dead_letter_records.list(self.name) if letter.died_at < cutoff
            ]
        for letter in letters:
            with self.group_writes():
                self.dead_letter_records.remove(self.name, letter.enqueue_id)
                self.faults.reached(PURGE_AFTER_REMOVE)
                self.blobs.release(letter.enqueue_id)
        return len(letters)

    def _chosen_letters(self, enqueue_id: str | None, *, every: bool) -> list[DeadLetter]:
        if (enqueue_id is None) == (not every):
            raise InvalidInput("requeue takes exactly one of an enqueue id or every")
        if every:
            self._drain_quietly()
            return self.dead_letter_records.list(self.name)
        return [self._letter(enqueue_id)]

    # record 31's browse_start and record 32's content clean-up
    def browse_start(self) -> int:
        return self._created(self.view.browse_start(self.name))

    def content_start(self) -> int:
        return self._created(self.view.content_start(self.name))

    def _created(self, start: int | None) -> int:
        if start is None:
            raise UnknownQueue(
                f"queue {self.name!r} does not exist yet: a queue is created by its first enqueue"
            )
        return start

    def maintenance_due(self) -> bool:
        """A clean-up is unfinished, or browse_start lags the newest slice it may reach by two slices."""
        browse_start = self.browse_start()
        lag = self.browse_start_limit() - browse_start
        return self.content_start() < browse_start or lag >= 2 * self.configurations.widest_slice_window()

    def _maybe_update_browse_start(self) -> None:
        # Random piggy-backing (record 31): no coordination between nodes, and liveness on average.
        # It runs after the operation that triggered it is written, so its failure must not fail that
        # operation; content_start stays behind and the next update redoes the clean-up.
        if self._random.random() * self.configuration.update_browse_start_pace < 1:
            try:
                self.update_browse_start()
            except Exception:
                log.warning(
                    "browse_start update of queue %s failed; the next one retries it",
                    self.name,
                    exc_info=True,
                )

    def browse_start_limit(self) -> int:
        """The newest slice browse_start may reach: the current one minus the clock-skew grace, aligned on
        the widest sliceWindow ever in force. A process still holding an older, wider window writes its mails
        into the slice of that window, which may start before the current slice of a narrower one; were
        browse_start past it, those mails would be invisible to browse, size, remove and clear, and their rows
        would stay behind content_start for ever."""
        window = max(self.configurations.widest_slice_window(), self.configuration.slice_window)
        return slice_of(self.clock() - self.clock_skew_grace, window)

    def update_browse_start(self) -> int:
        """Advance browse_start to the first slice holding a live mail (never past the current slice minus
        the clock-skew grace), then clean content_start .. browse_start. Returns the new browse_start.

        Crash-safe order: 1. advance browse_start; 2. the clean-up (`clean_content`). A crash after 1
        leaves content_start behind, and the next update or clean-up does the work."""
        current = self.browse_start()
        limit = self.browse_start_limit()
        new_start = limit
        for slice_start in self.view.slices_from(self.name, current):
            if slice_start >= limit:
                break
            if self.view.live_mails(self.name, slice_start):
                new_start = slice_start
                break
        if new_start > current:
            self.view.advance_browse_start(self.name, new_start)
        self.faults.reached(CLEAN_AFTER_BROWSE_START)
        self.clean_content()
        return self.browse_start()

    def clean_content(self) -> int:
        """Record 32: release and delete what lies between content_start and browse_start, then move
        content_start. Returns the number of rows deleted.

        Crash-safe order: 1. release the references of the slices' mails (not those of dead letters,
        which keep their content); 2. delete the slices' rows; 3. move content_start. A crash after 1 or
        2 leaves content_start behind, so the next call does it again: releasing a released owner and
        deleting deleted rows change nothing."""
        content_start = self.content_start()
        browse_start = self.browse_start()
        if content_start >= browse_start:
            return 0
        dead = {letter.enqueue_id for letter in self.dead_letter_records.list(self.name)}
        for enqueue_id in self.view.mails_before(self.name, content_start, browse_start):
            if enqueue_id not in dead:
                self.blobs.release(enqueue_id)
        self.faults.reached(CLEAN_AFTER_RELEASE)
        removed = self.view.delete_slices(self.name, content_start, browse_start)
        self.faults.reached(CLEAN_AFTER_DELETE)
        self.view.advance_content_start(self.name, browse_start)
        return removed
