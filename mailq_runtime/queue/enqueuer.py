"""Enqueue: a mail's content to the blob store, its row to the view, its delivery to the broker or, while
it waits for a delay, to the delayed mails."""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable

from ..errors import BrokerRefused, BrokerUnavailable, InvalidInput
from ..faults import ENQUEUE_AFTER_REFERENCES, ENQUEUE_AFTER_VIEW_ROW
from ..metrics import seconds_since
from ..model import EnqueueId, Mail, check_message, check_priority, delivery_time
from ..stores.records import DelayedMail, EnqueuedMail
from .context import Delay, QueueContext, QueuePart, slice_of
from .delays import DueSchedule
from .destinations import moves

log = logging.getLogger(__name__)


def split_message(message: bytes) -> tuple[bytes, bytes]:
    """Headers (up to and including the blank line) and body; joining them gives the message back."""
    for separator in (b"\r\n\r\n", b"\n\n"):
        index = message.find(separator)
        if index >= 0:
            cut = index + len(separator)
            return message[:cut], message[cut:]
    return message, b""


def check_enqueue(mail: Mail, delay: Delay, priority: int | None, max_message_size: int, now: int) -> int:
    """Refuse what an enqueue must refuse, before anything is written (the CLI calls it before it opens
    the store, so refused input does not even create a data dir). Returns the priority to store."""
    if not isinstance(mail, Mail):
        raise InvalidInput(f"enqueue takes a Mail, not {type(mail).__name__}")
    # What the worker would dead-letter as malformed is refused here, at the edge.
    check_message(mail.message, max_message_size)
    delivery_time(now, delay)
    return check_priority(priority)


class Enqueuer(QueuePart):
    def __init__(
        self, context: QueueContext, schedule: DueSchedule, browse_start_limit: Callable[[], int]
    ) -> None:
        super().__init__(context)
        self.schedule = schedule
        self.browse_start_limit = browse_start_limit
        self._exists = False  # created by an enqueue of this process: no need to create it again

    def enqueue(self, mail: Mail, delay: Delay = None, priority: int | None = None) -> EnqueueId:
        """Accept `mail`, deliverable after `delay`; returns its enqueue id.

        Crash-safe order: 1. the queue's browse_start and content_start, at its first enqueue; 2. the
        content and its references (owner: the new enqueue id); 3. the view row, then its count per
        destination domain (destinations.py); 4. the broker message,
        or with a delay the delayed row. Every step is idempotent, and a mail is only delivered through
        what step 4 writes, so a crash never delivers part of a mail. A crash after 2 leaves references
        whose owner exists nowhere, which the orphan sweep releases; after 3, a mail that browse and size
        show but that no broker holds, which republish sends (or delays again).
        """
        started = time.perf_counter()
        context = self.context
        priority = check_enqueue(mail, delay, priority, context.max_message_size, context.clock())
        with self.work.turn():
            now = context.clock()
            next_delivery = delivery_time(now, delay)
            enqueue_id = EnqueueId.generate(now)
            header, body = split_message(mail.message)
            bucket = zlib.crc32(mail.name.encode()) % context.configuration.bucket_count
            with self.work.writes():
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
                    slice_of(now, context.configuration.slice_window),
                    bucket,
                    *blob_ids,
                )
                self.view.insert(row)
                self.destinations.count(self.name, moves(row, 1))
                self.faults.reached(ENQUEUE_AFTER_VIEW_ROW)
                self.send(row, next_delivery, now)
        self._exists = True
        self.metrics.enqueued.inc()
        self.metrics.enqueue_seconds.observe(seconds_since(started))
        return enqueue_id

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
                raise  # its configuration is wrong: the caller must know, and republish sends it later
            except BrokerUnavailable as error:
                # The broker link logs the outage once; a line per mail would flood the log meanwhile.
                log.info("queue %s: mail %s waits for the broker: %s", self.name, row.enqueue_id, error)
        self.schedule.expect(due)
        self.delayed.add(DelayedMail(self.name, row.enqueue_id, due, row.priority, payload))
