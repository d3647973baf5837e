"""The mail queue of records 31 and 32: enqueue, dequeue, browse, size, remove, clear, flush, republish.

Content goes to the deduplicating blob store (owner: the enqueue id), the mail's row to the time series
`enqueued_mails` (queue, slice, bucket), the delivery to the broker. A dequeue is a broker delivery
checked against `deleted_mails`; browse and size read the view from `browse_start` on.
"""

from __future__ import annotations

import logging
import random
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import TracebackType

from .blobs.dedup import DeduplicatingBlobStore
from .brokers.base import Broker, Delivery
from .clock import LATEST, MICROS_PER_SECOND, Clock, to_datetime
from .config import ConfigurationStore, QueueViewConfiguration
from .errors import BlobNotFound, InvalidInput, LeaseExpired, UnknownQueue, shown
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
from .queue_view import EnqueuedMail, QueueView

Delay = timedelta | int | float | str | None
log = logging.getLogger(__name__)


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


class MailQueueItem:
    """A dequeued mail, leased to this consumer until `done()`, `retry()` or `reject()`.

    The lease lasts the visibility timeout, and `extend_lease()` pushes it out. Once it has expired,
    the broker may give the mail to another consumer; then `done()`, `retry()` and `reject()` raise
    LeaseExpired (the item still counts as settled)."""

    def __init__(self, queue: MailQueue, delivery: Delivery, row: EnqueuedMail, mail: Mail) -> None:
        self._queue = queue
        self._delivery = delivery
        self._row = row
        self.mail = mail
        self.enqueue_id = row.enqueue_id
        self.attempts = delivery.attempts
        self.settled = False

    def _settle(self) -> None:
        if self.settled:
            raise InvalidInput(f"mail {self.enqueue_id} was already acknowledged")
        self.settled = True

    def done(self) -> None:
        """Delivered: mark it deleted, acknowledge it, release its content. With the lease lost, the
        mail is still marked deleted and its content released, then LeaseExpired is raised."""
        self._settle()
        self._queue._done(self._delivery, self._row)

    def retry(self, delay: Delay = None) -> None:
        """Not delivered this time: deliver it again, after `delay` if given. With the lease lost it
        changes nothing and raises LeaseExpired."""
        deliver_at = delivery_time(self._queue.clock(), delay)  # a malformed delay leaves the item unsettled
        self._settle()
        self._queue._retry(self._delivery, self._row, deliver_at)

    def reject(self, reason: str = "rejected") -> None:
        """Never deliverable: move it to the dead letters, which keep its content. With the lease lost
        it changes nothing and raises LeaseExpired."""
        self._settle()
        self._queue._dead_letter(self._delivery, self._row, reason)

    def extend_lease(self, duration: Delay = None) -> None:
        """Keep the mail leased to this consumer for `duration` from now (default: the visibility
        timeout), so that a long delivery is not given to another consumer meanwhile. Raises
        LeaseExpired if another consumer already has it."""
        broker = self._queue.broker
        length = broker.visibility_timeout
        if duration is not None:
            length = parse_duration(duration, "lease extension")
            if not length:
                raise InvalidInput(f"invalid lease extension {shown(duration)}: must be longer than zero")
        if self.settled:
            raise InvalidInput(f"mail {self.enqueue_id} was already acknowledged: it holds no lease")
        now = self._queue.clock()
        if not broker.extend(self._delivery, min(now + length, LATEST)):
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
        configuration: QueueViewConfiguration,
        configurations: ConfigurationStore,
        clock: Clock,
        max_message_size: int,
        clock_skew_grace: int,
    ) -> None:
        self.name = name
        self.view = view
        self.broker = broker
        self.blobs = blobs
        # The configuration this process writes with, read once at open as James does; readers of the
        # view ask `configurations` for what other processes may be writing with.
        self.configuration = configuration
        self.configurations = configurations
        self.clock = clock
        self.max_message_size = max_message_size
        self.clock_skew_grace = clock_skew_grace
        self._random = random.Random()
        self._exists = False  # created by an enqueue of this process: no need to create it again

    def __repr__(self) -> str:
        return f"MailQueue({self.name!r})"

    # enqueue / dequeue
    def enqueue(self, mail: Mail, delay: Delay = None, priority: int | None = None) -> EnqueueId:
        priority = check_enqueue(mail, delay, priority, self.max_message_size, self.clock())
        # The whole operation is one turn (stores/embedded.py): its Python competing for the GIL with
        # another thread's statements would only slow both down.
        with self.view.turn():
            now = self.clock()
            next_delivery = delivery_time(now, delay)
            enqueue_id = EnqueueId.generate(now)
            header, body = split_message(mail.message)
            window = self.configuration.slice_window
            bucket = zlib.crc32(mail.name.encode()) % self.configuration.bucket_count
            # On the embedded store the content references, the view row and the broker message commit
            # together or not at all.
            with self.view.transaction():
                if not self._exists:
                    # Created by its first accepted mail, so refused input never leaves an empty queue.
                    self.view.create_queue(self.name, self.browse_start_limit(), now)
                row = EnqueuedMail.of(
                    mail,
                    self.name,
                    enqueue_id,
                    now,
                    next_delivery,
                    priority,
                    slice_of(now, window),
                    bucket,
                    *self.blobs.save_all(enqueue_id, [header, body]),
                )
                self.view.insert(row)
                self.broker.publish(self.name, enqueue_id, row.to_payload(), priority, next_delivery)
            self._exists = True
        return enqueue_id

    def dequeue(self, timeout: Delay = None) -> MailQueueItem | None:
        """The next deliverable mail; blocks while there is none, or returns None after `timeout` (seconds,
        or a duration as `parse_duration` reads it)."""
        if timeout is not None:
            timeout = parse_duration(timeout, "dequeue timeout") / MICROS_PER_SECOND
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            delivery = self.broker.receive(self.name, remaining)
            if delivery is None:
                return None
            with self.view.turn():
                item = self._deliverable(delivery)
            if item is not None:
                return item

    def _deliverable(self, delivery: Delivery) -> MailQueueItem | None:
        """The item of a broker delivery, or None when the delivery was settled here instead."""
        try:
            row = EnqueuedMail.from_payload(delivery.payload)
        except (ValueError, TypeError) as error:
            # Requeued, it would come back after every visibility timeout and fail every time.
            self.broker.dead_letter(delivery, f"unreadable message: {error}")
            return None
        if not self.view.is_live(row):
            self.broker.ack(delivery)  # removed or cleared while waiting in the broker
            return None
        try:
            mail = self._load(row)
        except BlobNotFound as error:
            self.broker.dead_letter(delivery, f"content missing: {error}")
            return None
        return MailQueueItem(self, delivery, row, mail)

    def _load(self, row: EnqueuedMail) -> Mail:
        return row.to_mail(self.blobs.read(row.header_blob_id) + self.blobs.read(row.body_blob_id))

    def _done(self, delivery: Delivery, row: EnqueuedMail) -> None:
        with self.view.transaction():
            self.view.mark_deleted(self.name, row.enqueue_id, row.slice_start, row.bucket)
            self.blobs.release(row.enqueue_id)
            acked = self.broker.ack(delivery)
        # Checked once the transaction has committed: raising inside it would roll back the deletion
        # mark, which is right even with the lease lost (the mail was delivered) and is what keeps a
        # consumer that has not loaded the mail yet from delivering it again.
        self._maybe_update_browse_start()
        if not acked:
            raise LeaseExpired(
                f"mail {row.enqueue_id} is recorded as delivered, but its lease was lost: it expired and "
                "another consumer took the mail, which may deliver it again (at-least-once)"
            )

    def _retry(self, delivery: Delivery, row: EnqueuedMail, deliver_at: int) -> None:
        with self.view.transaction():
            # A lease that expired meanwhile belongs to another consumer now: leave its mail alone.
            returned = self.broker.nack(delivery, deliver_at)
            if returned:
                self.view.reschedule([row], deliver_at)
        if not returned:
            raise self._lost(row, "retried")

    def _dead_letter(self, delivery: Delivery, row: EnqueuedMail, reason: str) -> None:
        with self.view.transaction():
            if self.view.is_live(row):
                # The broker first, as its answer says whether the lease holds; and a crash between the
                # two writes then leaves a live mail that republish sends again, where the other order
                # would leave a deleted one that the next consumer acknowledges without a dead letter.
                held = self.broker.dead_letter(delivery, reason)
                if held:
                    self.view.mark_deleted(self.name, row.enqueue_id, row.slice_start, row.bucket)
            else:
                # Delivered by a consumer whose lease had expired, or removed: its content is released,
                # so a dead letter would be an empty one. There is nothing left to reject.
                held = self.broker.ack(delivery)
        if not held:
            raise self._lost(row, "rejected")
        self._maybe_update_browse_start()

    @staticmethod
    def _lost(row: EnqueuedMail, action: str) -> LeaseExpired:
        return LeaseExpired(
            f"mail {row.enqueue_id} was not {action}, nothing changed: its lease was lost (it expired and "
            "another consumer took the mail, which settles it now)"
        )

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
        """Read from the per-slice counters: the cost does not grow with the queue's history."""
        browse_start = self.view.browse_start(self.name)
        return 0 if browse_start is None else self.view.size(self.name, browse_start)

    # management
    def remove(
        self, *, name: str | None = None, sender: str | None = None, recipient: str | None = None
    ) -> int:
        """Delete the mails matching exactly one criterion; a multi-recipient mail goes if any recipient
        matches. Addresses match as James's do: the local part exactly, the domain in any case; the
        sender "<>" (or "") is the null sender of bounces."""
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
        return self._delete_where(lambda row: True)

    def _delete_where(self, matches) -> int:
        deleted = 0
        for item in list(self.browse()):
            if matches(item._row):
                with self.view.transaction():
                    if self.view.mark_deleted(
                        self.name, item.enqueue_id, item._row.slice_start, item._row.bucket
                    ):
                        self.blobs.release(item.enqueue_id)
                        deleted += 1
        if deleted:
            self._maybe_update_browse_start()
        return deleted

    def flush(self) -> int:
        """Make every delayed mail deliverable now; returns how many the broker held back."""
        now = self.clock()
        delayed = [item._row for item in self.browse() if item._row.next_delivery > now]
        with self.view.transaction():
            self.view.reschedule(delayed, now)
            return self.broker.flush(self.name)

    def republish(self, older_than: Delay) -> int:
        """Publish again the mails older than `older_than` that the view holds but the broker lost."""
        cutoff = self.clock() - parse_duration(older_than, "older_than")
        candidates = [item._row for item in self.browse() if item._row.enqueued_time < cutoff]
        held = self.broker.published(self.name, [row.enqueue_id for row in candidates])
        republished = 0
        for row in candidates:
            if row.enqueue_id not in held:
                self.broker.publish(
                    self.name, row.enqueue_id, row.to_payload(), row.priority, row.next_delivery
                )
                republished += 1
        return republished

    def dead_letters(self):
        return self.broker.dead_letters(self.name)

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
        # It runs after the operation that triggered it has committed, so its failure must not fail
        # that operation; content_start stays behind and the next update redoes the clean-up.
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
        the clock-skew grace), then clean content_start .. browse_start. Returns the new browse_start."""
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
        self.clean_content()
        return self.browse_start()

    def clean_content(self) -> int:
        """Record 32: release and delete what lies between content_start and browse_start, then move
        content_start. A failure leaves content_start behind, so the next call redoes the work."""
        content_start = self.content_start()
        browse_start = self.browse_start()
        if content_start >= browse_start:
            return 0
        # Dead letters keep their content: they were marked deleted, but are not gone.
        dead = {letter.enqueue_id for letter in self.broker.dead_letters(self.name)}
        for enqueue_id in self.view.mails_before(self.name, content_start, browse_start):
            if enqueue_id not in dead:
                self.blobs.release(enqueue_id)
        removed = self.view.delete_slices(self.name, content_start, browse_start)
        self.view.advance_content_start(self.name, browse_start)
        return removed
