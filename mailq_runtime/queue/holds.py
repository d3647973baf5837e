"""Hold and release (Postfix's `postsuper -h` and `-H`): a held mail stays in the view, in browse and size,
and is not delivered until released.

A hold is one write, the mail's row in the held mails. The mail's broker message or delayed row stays where
it is: the consumer that receives it parks its payload in the held row and acks it (`park`), so holding
costs no broker operation and works the same on every broker. A release hands a parked payload back
through the delayed mails, due now, then drops the held row. A mail held while a consumer is delivering
it is delivered (the delivery had started).

A consumer does not read a held row per delivery while the queue holds nothing: it looks whether the
queue has any held row at most every HOLDS_SEEN_WITHIN seconds, and a hold returns only once that long
has passed since its row was written. So every look made after the hold was written sees it, and every
delivery that starts after the hold returned is parked: a delivery that started before is delivered, as
one under way at the hold always was.

The counts per destination domain (destinations.py) follow the held row: the hold that writes it moves
the mail's counts from its state to "held"; whoever drops it moves them out, a release back to the
mail's state, the mail's leaving (delivered, dead-lettered, removed: `leaving`) out of the queue. The drop
is a compare-and-set, so of a release, a leaving and the hold's own check below exactly one drops a row
and moves its counts. A settlement that looked at the holds before a hold's row was written takes the
mail from its state; so the hold, once every look postdates its row, checks that its mails are still
live, and for one that left meanwhile without its held row dropped, drops it and moves its counts back.
What stays off (by one mail, on its domains, in "held" and its state, the other way round): a crash
between a held row and its counts, or between its drop and their move (a leaving drops the row first,
then counts as it marks the mail); a hold that dies before its check; a settlement slower than
HOLDS_SEEN_WITHIN between its look and its count, or whose held row a listing drops before the check.
A listing drops the row of a mail no longer live, leaving the counts as they are.
"""

from __future__ import annotations

import builtins
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from ..brokers.base import Delivery
from ..clock import to_datetime
from ..errors import InvalidInput
from ..faults import PARK_AFTER_PAYLOAD, RELEASE_AFTER_DELAYED_ROW, FaultInjector
from ..model import (
    NULL_SENDER_SPELLINGS,
    DomainName,
    EnqueueId,
    MailAddress,
    address_key,
    creation_time,
)
from ..stores.protocols import DelayedMails, Destinations, HeldMails, QueueView
from ..stores.records import DelayedMail, DestinationCount, EnqueuedMail, HeldMail
from .context import QueueContext, QueuePart, slice_of
from .delays import DueSchedule
from .destinations import HELD, moves
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
    def __init__(
        self,
        context: QueueContext,
        *,
        view: QueueView,
        held: HeldMails,
        delayed: DelayedMails,
        destinations: Destinations,
        faults: FaultInjector,
        schedule: DueSchedule,
    ) -> None:
        super().__init__(context)
        self.view = view
        self.held = held
        self.delayed = delayed
        self.destinations = destinations
        self.faults = faults
        self.schedule = schedule
        # (any held row found, time.monotonic() until which that look is trusted)
        self._any_held: tuple[bool, float] = (True, -math.inf)

    def hold(
        self,
        enqueue_id: str | None = None,
        *,
        sender: str | None = None,
        recipient: str | None = None,
        domain: str | None = None,
    ) -> int:
        """Hold one mail (refused if it is unknown or held already), or every live mail matching one
        criterion (`matcher`); how many were held by this call, each counted once."""
        if enqueue_id is not None:
            if (sender, recipient, domain) != (None, None, None):
                raise InvalidInput("hold takes an enqueue id or one criterion, not both")
            counted = self._hold(self.live_row(enqueue_id), self.clock())
            if counted is None:
                raise InvalidInput(f"mail {enqueue_id} of queue {self.name!r} is held already")
            self._until_seen([counted])
            return 1
        matches = matcher(sender=sender, recipient=recipient, domain=domain)
        now = self.clock()
        held = []
        for row in live_rows(self.view, self.name):
            if matches(row) and (counted := self._hold(row, now)) is not None:
                held.append(counted)
        if held:
            self._until_seen(held)
        return len(held)

    def _hold(self, row: EnqueuedMail, now: int) -> EnqueuedMail | None:
        """Crash-safe order: 1. the held row, unless the mail has one (then nothing is written: None); 2.
        its counts from its state to held, by the copy they follow (`counted`), which is returned. A
        crash after 1 leaves the counts in its state, which its release or leaving takes from held."""
        if not self.held.hold(self.name, row.enqueue_id, now):
            return None
        counted = self.counted(row)
        self.destinations.count(self.name, moves(counted, -1) + moves(counted, 1, HELD))
        return counted

    def _until_seen(self, rows: builtins.list[EnqueuedMail]) -> None:
        """Wait until every consumer's look at whether the queue holds anything postdates the holds just
        written (this process's consumers see them at once); then a mail of `rows` (as counted) that left
        the queue meanwhile without dropping its held row was counted out of its state: its row is
        dropped and its counts go back there."""
        self._any_held = (True, time.monotonic() + HOLDS_SEEN_WITHIN)
        time.sleep(HOLDS_SEEN_WITHIN)
        for counted in rows:
            if not self.view.is_live(counted) and self._drop(self.held.get(self.name, counted.enqueue_id)):
                self.destinations.count(self.name, moves(counted, -1, HELD) + moves(counted, 1))

    def leaving(self, row: EnqueuedMail, *, from_view: bool = False) -> builtins.list[DestinationCount]:
        """The count changes of a mail leaving the queue (delivered, dead-lettered, removed): out of held
        if this call drops its held row, else out of its state. `row` is the copy the counts follow (a
        delivery's), or its view row (`from_view`: a removal), whose `counted` copy is then looked up.
        The caller writes them next."""
        dropped = self._drop(self.held.get(self.name, row.enqueue_id)) if self._may_be_held() else None
        counted = self.counted(row, dropped) if from_view else row
        return moves(counted, -1, None if dropped is None else HELD)

    def counted(self, row: EnqueuedMail, held: HeldMail | None = None) -> EnqueuedMail:
        """The copy of a mail whose recipients its counts follow, from its view row: its parked payload
        (`held`), else its delayed row's while it waits for a retry, else the view row. A retry to some
        recipients counts those only, while the view row keeps every one (settlement.py's `retry`)."""
        payload = None if held is None else held.payload
        if payload is None and row.next_delivery > row.enqueued_time:
            delayed = self.delayed.get(self.name, row.next_delivery, row.enqueue_id)
            payload = None if delayed is None else delayed.payload
        return row if payload is None else EnqueuedMail.from_payload(payload)[0]

    def retried(self, before: EnqueuedMail, after: EnqueuedMail) -> builtins.list[DestinationCount]:
        """The count changes of a retry from `before` to `after` (its next delivery, its recipients left):
        within held while the mail is held, whose release then moves them to its state."""
        held = self._may_be_held() and self.held.get(self.name, before.enqueue_id) is not None
        state = HELD if held else None
        return moves(before, -1, state) + moves(after, 1, state)

    def _drop(self, held: HeldMail | None) -> HeldMail | None:
        """Drop a held row (`held`: as last read) by compare-and-set, read again while a park or a release
        changes it; the row this call dropped, None if it dropped none."""
        while held is not None:
            if self.held.release(held):
                return held
            held = self.held.get(held.queue, held.enqueue_id)
        return None

    def release(
        self,
        enqueue_id: str | None = None,
        *,
        sender: str | None = None,
        recipient: str | None = None,
        domain: str | None = None,
    ) -> int:
        """Release one held mail (refused if it is unknown or not held), or every held mail matching one
        criterion; how many were released."""
        if enqueue_id is not None:
            if (sender, recipient, domain) != (None, None, None):
                raise InvalidInput("release takes an enqueue id or one criterion, not both")
            row = self.live_row(enqueue_id)
            held = self.held.get(self.name, EnqueueId(enqueue_id))
            if held is None:
                raise InvalidInput(f"mail {enqueue_id} of queue {self.name!r} is not held")
            self._release(held, row)
            return 1
        matches = matcher(sender=sender, recipient=recipient, domain=domain)
        released = 0
        for held, row in self._held_rows():
            if matches(row):
                self._release(held, row)
                released += 1
        return released

    def list(self) -> builtins.list[HeldItem]:
        """The held mails, each with the time it was held."""
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

    def _release(self, held: HeldMail, row: EnqueuedMail) -> None:
        """Crash-safe order: 1. the parked payload, if any, to the delayed mails due now; 2. drop the held
        row if no consumer parked the mail again meanwhile, else start over with the new payload; 3. the
        mail's counts from held to its state. A crash after 1 leaves the mail held and its payload
        published: a consumer parks it again, and the release run again completes; after 2, the counts
        in held (see the module's docstring). The mail is always in the broker, the delayed mails or the
        held row. A row the mail's leaving dropped first is its: the release then moves nothing."""
        while True:
            if held.payload is not None:
                priority = EnqueuedMail.from_payload(held.payload)[0].priority
                due = self.clock()
                self.schedule.expect(due)  # this process's consumers publish it at their next look
                self.delayed.add(DelayedMail(self.name, held.enqueue_id, due, priority, held.payload))
                self.faults.reached(RELEASE_AFTER_DELAYED_ROW)
            if self.held.release(held):
                counted = self.counted(row, held)
                self.destinations.count(self.name, moves(counted, -1, HELD) + moves(counted, 1))
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

    def _held_rows(self) -> builtins.list[tuple[HeldMail, EnqueuedMail]]:
        """Each held mail with its view row; the held row of a mail no longer live, which its leaving did
        not drop (see the module's docstring), is dropped, its counts left as they are."""
        found = []
        for held in self.held.list(self.name):
            try:
                found.append((held, self.live_row(held.enqueue_id)))
            except InvalidInput:
                self.held.release(held)
        return found
