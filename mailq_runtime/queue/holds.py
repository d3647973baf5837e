"""Hold and release (Postfix's `postsuper -h` and `-H`): a held mail stays in the view, in browse and size,
and is not delivered until released.

A hold is one write, the mail's row in the held mails. The mail's broker message or delayed row stays where
it is: the consumer that receives it parks its payload in the held row and acks it (`park`), so holding
costs no broker operation and works the same on every broker. A release hands a parked payload back
through the delayed mails, due now, then drops the held row. A mail held while a consumer is delivering
it is delivered (the delivery had started); its held row then names a mail no longer live, which the
next release or listing drops.

A consumer does not read a held row per delivery while the queue holds nothing: it looks whether the
queue has any held row at most every HOLDS_SEEN_WITHIN seconds, and a hold returns only once that long
has passed since its row was written. So every look made after the hold was written sees it, and every
delivery that starts after the hold returned is parked: a delivery that started before is delivered, as
one under way at the hold always was.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from ..brokers.base import Delivery
from ..clock import to_datetime
from ..errors import InvalidInput
from ..faults import PARK_AFTER_PAYLOAD, RELEASE_AFTER_DELAYED_ROW
from ..model import (
    NULL_SENDER_SPELLINGS,
    DomainName,
    EnqueueId,
    MailAddress,
    address_key,
    creation_time,
)
from ..stores.records import DelayedMail, EnqueuedMail, HeldMail
from .context import QueueContext, QueuePart, slice_of
from .delays import DueSchedule
from .mail_view import live_rows

Matcher = Callable[[EnqueuedMail], bool]

# Seconds a consumer trusts its last look at whether the queue holds any mail (see the module's docstring).
HOLDS_SEEN_WITHIN = 0.5


@dataclass(frozen=True)
class HeldItem:
    enqueue_id: str
    sender: str | None
    recipients: list[str]
    enqueued_time: datetime
    held_at: datetime


def matcher(*, sender: str | None = None, recipient: str | None = None, domain: str | None = None) -> Matcher:
    """Which mails one criterion names; a mail with several recipients matches if any does. Addresses match
    as `remove`'s do; "<>" (or "") is the null sender."""
    named = (("sender", sender), ("recipient", recipient), ("domain", domain))
    given = [name for name, value in named if value is not None]
    if len(given) != 1:
        raise InvalidInput(
            f"takes exactly one of an enqueue id, sender, recipient or domain, got {given or 'none'}"
        )
    if sender in NULL_SENDER_SPELLINGS:
        return lambda row: row.sender is None
    if sender is not None:
        wanted = address_key(MailAddress(sender))
        return lambda row: row.sender is not None and address_key(row.sender) == wanted
    if recipient is not None:
        wanted = address_key(MailAddress(recipient))
        return lambda row: any(address_key(r) == wanted for r in row.recipient_list)
    name = DomainName(domain)
    return lambda row: any(address_key(r)[1] == name for r in row.recipient_list)


class Holds(QueuePart):
    def __init__(self, context: QueueContext, schedule: DueSchedule) -> None:
        super().__init__(context)
        self.schedule = schedule
        # (any held row found, time.monotonic() until which that look is trusted)
        self._any_held: tuple[bool, float] = (True, -math.inf)

    def hold(self, enqueue_id: str | None = None, **criteria: str | None) -> int:
        """Hold one mail (refused if it is unknown or held already), or every live mail matching one
        criterion (`matcher`); how many were held by this call."""
        if enqueue_id is not None:
            if any(v is not None for v in criteria.values()):
                raise InvalidInput("hold takes an enqueue id or one criterion, not both")
            row = self.live_row(enqueue_id)
            if not self.held.hold(self.name, row.enqueue_id, self.clock()):
                raise InvalidInput(f"mail {enqueue_id} of queue {self.name!r} is held already")
            self._until_seen()
            return 1
        matches = matcher(**criteria)
        now = self.clock()
        rows = [row for row in live_rows(self.context) if matches(row)]
        held = sum(self.held.hold(self.name, row.enqueue_id, now) for row in rows)
        if held:
            self._until_seen()
        return held

    def _until_seen(self) -> None:
        """Wait until every consumer's look at whether the queue holds anything postdates the holds just
        written (this process's consumers see them at once)."""
        self._any_held = (True, time.monotonic() + HOLDS_SEEN_WITHIN)
        time.sleep(HOLDS_SEEN_WITHIN)

    def release(self, enqueue_id: str | None = None, **criteria: str | None) -> int:
        """Release one held mail (refused if it is unknown or not held), or every held mail matching one
        criterion; how many were released."""
        if enqueue_id is not None:
            if any(v is not None for v in criteria.values()):
                raise InvalidInput("release takes an enqueue id or one criterion, not both")
            self.live_row(enqueue_id)
            held = self.held.get(self.name, EnqueueId(enqueue_id))
            if held is None:
                raise InvalidInput(f"mail {enqueue_id} of queue {self.name!r} is not held")
            self._release(held)
            return 1
        matches = matcher(**criteria)
        released = 0
        for held, row in self._held_rows():
            if matches(row):
                self._release(held)
                released += 1
        return released

    def held_mails(self) -> list[HeldItem]:
        return [
            HeldItem(
                row.enqueue_id,
                row.sender,
                row.recipient_list,
                to_datetime(row.enqueued_time),
                to_datetime(held.held_at),
            )
            for held, row in self._held_rows()
        ]

    def counts(self) -> tuple[int, int]:
        """How many live mails are held, and how many of them a consumer has parked (out of the broker
        and the delayed mails)."""
        held = [held for held, _ in self._held_rows()]
        return len(held), sum(h.payload is not None for h in held)

    def park(self, delivery: Delivery, row: EnqueuedMail) -> bool:
        """Whether the delivery is of a held mail, parked here instead of delivered; the caller then acks
        it. Crash-safe order: 1. the payload into the held row; 2. ack. A crash after 1 leaves the broker
        message, delivered again once its lease expires and parked again. The compare-and-set fails when a
        release or another park got there first: the row is read again, and a mail no longer held is
        delivered."""
        if not self._may_be_held():
            return False
        held = self.held.get(self.name, row.enqueue_id)
        while held is not None:
            if self.held.park(held, delivery.payload):
                self.faults.reached(PARK_AFTER_PAYLOAD)
                return True
            held = self.held.get(self.name, row.enqueue_id)
        return False

    def _may_be_held(self) -> bool:
        """Whether a delivery must read its held row: not while this process's last look, started less
        than HOLDS_SEEN_WITHIN ago, found no held row in the queue."""
        any_held, trusted_until = self._any_held
        if time.monotonic() < trusted_until:
            return any_held
        started = time.monotonic()  # a hold written after this look began waits it out
        any_held = self.held.any_held(self.name)
        self._any_held = (any_held, started + HOLDS_SEEN_WITHIN)
        return any_held

    def _release(self, held: HeldMail) -> None:
        """Crash-safe order: 1. the parked payload, if any, to the delayed mails due now; 2. drop the held
        row if no consumer parked the mail again meanwhile, else start over with the new payload. A crash
        after 1 leaves the mail held and its payload published: a consumer parks it again, and the
        release run again completes. The mail is always in the broker, the delayed mails or the held row."""
        while True:
            if held.payload is not None:
                priority = EnqueuedMail.from_payload(held.payload)[0].priority
                due = self.clock()
                self.schedule.expect(due)  # this process's consumers publish it at their next look
                self.delayed.add(DelayedMail(self.name, held.enqueue_id, due, priority, held.payload))
                self.faults.reached(RELEASE_AFTER_DELAYED_ROW)
            if self.held.release(held):
                return
            current = self.held.get(self.name, held.enqueue_id)
            if current is None:
                return
            held = current

    def live_row(self, enqueue_id: str) -> EnqueuedMail:
        """The view row of a live mail, read from the slices its enqueue time can lie in (one a slice
        window ever in force); an unknown or settled mail is refused."""
        wanted = EnqueueId(enqueue_id)
        enqueued = creation_time(wanted) or 0
        windows = {c.slice_window for c in self.context.configurations.history()}
        windows.add(self.context.configuration.slice_window)
        for slice_start in sorted({slice_of(enqueued, window) for window in windows}):
            for row in self.view.live_mails(self.name, slice_start):
                if row.enqueue_id == wanted:
                    return row
        raise InvalidInput(f"queue {self.name!r} holds no mail {enqueue_id}")

    def _held_rows(self) -> list[tuple[HeldMail, EnqueuedMail]]:
        """Each held mail with its view row; the held row of a mail no longer live (delivered while it was
        held, or removed) is dropped."""
        found = []
        for held in self.held.list(self.name):
            try:
                found.append((held, self.live_row(held.enqueue_id)))
            except InvalidInput:
                self.held.release(held)
        return found
