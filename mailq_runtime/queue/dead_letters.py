"""The dead-letter office: the mails the queue will not deliver, as records of the metadata store that an
operator lists, requeues or purges, and those the broker gave up on, moved in."""

from __future__ import annotations

import builtins
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from ..blobs.dedup import DeduplicatingBlobStore
from ..brokers.base import Broker, BrokerDeadLetter
from ..clock import to_datetime
from ..errors import BrokerUnavailable, InvalidInput
from ..faults import (
    PURGE_AFTER_REMOVE,
    REJECT_AFTER_DEAD_LETTER,
    REJECT_AFTER_MARK,
    REQUEUE_AFTER_ENQUEUE,
    REQUEUE_AFTER_REMOVE,
    FaultInjector,
)
from ..model import EnqueueId, Mail, parse_duration
from ..stores.protocols import DeadLetters, Destinations, QueueView
from ..stores.records import DeadLetter, DestinationCount, EnqueuedMail
from ..unit_of_work import UnitOfWork
from .context import Delay, QueueContext, QueuePart, load

log = logging.getLogger(__name__)


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
    _blobs: DeduplicatingBlobStore = field(repr=False)

    @property
    def mail(self) -> Mail:
        if self._row is None:
            raise InvalidInput(f"dead letter {self.enqueue_id} holds no readable mail: {self.reason}")
        return load(self._blobs, self._row)


def _readable(payload: str) -> EnqueuedMail | None:
    try:
        return EnqueuedMail.from_payload(payload)[0]
    except (ValueError, TypeError):
        return None


class DeadLetterOffice(QueuePart):
    def __init__(
        self,
        context: QueueContext,
        *,
        records: DeadLetters,
        view: QueueView,
        broker: Broker,
        blobs: DeduplicatingBlobStore,
        destinations: Destinations,
        work: UnitOfWork,
        faults: FaultInjector,
        enqueue: Callable[..., EnqueueId],
        leaving: Callable[[EnqueuedMail], list[DestinationCount]],
    ) -> None:
        super().__init__(context)
        self.records = records
        self.view = view
        self.broker = broker
        self.blobs = blobs
        self.destinations = destinations
        self.work = work
        self.faults = faults
        self.enqueue = enqueue
        self.leaving = leaving  # a leaving mail's count changes per destination domain (holds.py)

    def list(self) -> builtins.list[DeadLetterItem]:
        """The queue's dead letters, in enqueue order (those the broker gave up on moved in first)."""
        self._drain_quietly()
        return [self._item(letter) for letter in self.records.list(self.name)]

    def reasons(self) -> builtins.list[tuple[str, datetime]]:
        """The reason and the death time of each dead letter, without reading their messages (those the
        broker gave up on moved in first)."""
        self._drain_quietly()
        return [(reason, to_datetime(died)) for reason, died in self.records.reasons(self.name)]

    def get(self, enqueue_id: str) -> DeadLetterItem:
        """One dead letter; its `mail` holds the content. Raises InvalidInput if there is no such letter."""
        return self._item(self._letter(enqueue_id))

    def _letter(self, enqueue_id: str) -> DeadLetter:
        self._drain_quietly()
        letter = self.records.get(self.name, EnqueueId(enqueue_id))
        if letter is None:
            raise InvalidInput(f"queue {self.name!r} holds no dead letter {enqueue_id}")
        return letter

    def _item(self, letter: DeadLetter) -> DeadLetterItem:
        row = _readable(letter.payload)
        return DeadLetterItem(
            letter.enqueue_id,
            letter.reason,
            to_datetime(letter.died_at),
            None if row is None else row.name,
            None if row is None else row.sender,
            [] if row is None else row.recipient_list,
            None if row is None else to_datetime(row.enqueued_time),
            row,
            self.blobs,
        )

    def requeue(self, enqueue_id: str | None = None, *, every: bool = False) -> builtins.list[EnqueueId]:
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
            requeued.append(self.enqueue(load(self.blobs, row), priority=row.priority))
            self.faults.reached(REQUEUE_AFTER_ENQUEUE)
            self.records.remove(self.name, letter.enqueue_id)
            self.faults.reached(REQUEUE_AFTER_REMOVE)
            self.blobs.release(letter.enqueue_id)
        return requeued

    def purge(self, enqueue_id: str | None = None, *, older_than: Delay = None) -> int:
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
            letters = [letter for letter in self.records.list(self.name) if letter.died_at < cutoff]
        for letter in letters:
            with self.work.writes():
                self.records.remove(self.name, letter.enqueue_id)
                self.faults.reached(PURGE_AFTER_REMOVE)
                self.blobs.release(letter.enqueue_id)
        return len(letters)

    def _chosen_letters(self, enqueue_id: str | None, *, every: bool) -> builtins.list[DeadLetter]:
        if (enqueue_id is None) == (not every):
            raise InvalidInput("requeue takes exactly one of an enqueue id or every")
        if every:
            self._drain_quietly()
            return self.records.list(self.name)
        return [self._letter(enqueue_id)]

    def entomb(
        self, enqueue_id: str, payload: str, row: EnqueuedMail | None, reason: str, died_at: int
    ) -> None:
        """The dead letter, then the deletion mark of its mail (if its payload could be read), then, the
        first time it is marked, its counts per destination domain (out of held if it was held: a crash
        before them leaves its domains counting it)."""
        self.records.add(DeadLetter(self.name, enqueue_id, reason, died_at, payload))
        self.faults.reached(REJECT_AFTER_DEAD_LETTER)
        if row is not None:
            marked = self.view.mark_deleted(self.name, row.enqueue_id, row.slice_start, row.bucket)
            self.faults.reached(REJECT_AFTER_MARK)
            if marked:
                self.destinations.count(self.name, self.leaving(row))

    def drain(self) -> int:
        """Move the mails the broker gave up on by itself (RabbitMQ's delivery limit: every consumer died
        or lost its lease on them) into the dead letters, with the broker's reason; returns how many.
        `dequeue` does it while it waits, and listing the dead letters does it first.

        Crash-safe order, letter by letter: 1. the dead letter; 2. the mail's deletion mark; then the
        broker forgets them. A crash leaves them in the broker, which hands them over again: adding a
        letter again replaces it. A mail removed or delivered meanwhile gets no letter: its content is
        released."""
        drained = 0
        while moved := self.broker.drain_dead_letters(self.name, self._keep):
            drained += moved
        return drained

    def _keep(self, letters: builtins.list[BrokerDeadLetter]) -> None:
        for letter in letters:
            row = _readable(letter.payload)
            if row is not None and not self.view.is_live(row):
                continue
            with self.work.writes():
                self.entomb(letter.enqueue_id, letter.payload, row, letter.reason, letter.died_at)

    def _drain_quietly(self) -> None:
        # Listing the letters the metadata store holds must not fail because the broker is away.
        try:
            self.drain()
        except BrokerUnavailable as error:
            log.warning("queue %s: the broker's dead letters are not listed yet: %s", self.name, error)
