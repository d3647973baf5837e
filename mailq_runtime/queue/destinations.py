"""The queue by destination domain, as Postfix's qshape shows it: per recipient domain, the mails by state
in doubling age buckets, with remote delivery's last failure there and its next attempt.

Read from counters kept as mail moves (the `Destinations` store protocol), never from the mails: each
(domain, state, enqueue-time slot of SLOT minutes) counts the mails with a recipient there, +1 when a mail
is enqueued, moved from one state to another when it is retried after a delay, held or released, -1 when
it is settled (done, dead-lettered, removed). A mail's state comes from its row: "deferred" once its next
delivery lies after its enqueue time (retried, or enqueued with a delay), else "queued"; "held" from its
hold to its release or its leaving, whichever drops its held row (holds.py). Its age is that of its slot,
summed into buckets at read time, so the cost grows with the domains and slots in the queue, not with its
mails.

The counts are eventually consistent: each change is a write after the mail's own (the view row, the
deletion mark, the delayed row, the held row), so a crash between the two, a mail settled twice (a lease
lost), or a removal or hold of a partly delivered mail while its copy is in the broker (its view row
keeps every recipient; holds.py's `counted` reads the copy in the delayed mails or the held row), leaves
a domain's count off (holds.py says which crashes and races of a hold leave one). `recount_by_domain`, a
part of the queue's recount (a consumer's process's, every RECOUNT_INTERVAL, or the operator's), zeroes
every count of a (domain, slot) where no live mail is. A count the mails cannot check (a mail's state in
the broker is read nowhere) stays off while a mail of its slot and domain is live, and is corrected once
they are all gone.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from ..clock import MICROS_PER_SECOND, to_datetime
from ..model import QueueName, address_key
from ..stores.protocols import Destinations
from ..stores.records import DestinationCount, EnqueuedMail

SLOT = 300 * MICROS_PER_SECOND  # five minutes, qshape's smallest bucket
# qshape's bucket edges, in minutes; the last bucket holds every mail older than the last edge.
BUCKET_EDGES = (5, 10, 20, 40, 80, 160)
BUCKET_NAMES = ("0-5", "5-10", "10-20", "20-40", "40-80", "80-160", "160+")
HELD = "held"
STATES = ("queued", "deferred", HELD)
# Seconds between the recount's two reads of the counts: a settlement whose mail a browse no longer finds
# may not have written its count yet, which then lands in between.
RECOUNT_SETTLE = 1.0


@dataclass(frozen=True)
class DomainShape:
    """One destination domain of a queue: its mails per state, by age bucket (BUCKET_NAMES)."""

    domain: str
    buckets: dict[str, tuple[int, ...]]  # state -> a count per age bucket
    last_error: str | None
    last_error_at: datetime | None
    next_attempt: datetime | None
    suspended_until: datetime | None  # while an operator suspends it
    oldest: datetime | None  # the start of the enqueue-time slot of its oldest mail waiting

    def total(self, state: str) -> int:
        return sum(self.buckets.get(state, ()))


def state_of(row: EnqueuedMail) -> str:
    return "deferred" if row.next_delivery > row.enqueued_time else "queued"


def moves(row: EnqueuedMail, mails: int, state: str | None = None) -> list[DestinationCount]:
    """The changes of the counts that adding `mails` (1 or -1) of `row` in `state` (by default its own,
    `state_of`) makes: one per recipient domain."""
    slot = slot_of(row.enqueued_time)
    domains = sorted(_domains(row))
    counted = state or state_of(row)
    return [DestinationCount(domain, counted, slot, mails) for domain in domains]


def recount_by_domain(
    destinations: Destinations, queue: QueueName, live: Iterable[EnqueuedMail], now: int
) -> int:
    """Zero the counts of every (domain, slot) none of the `live` mails (a browse) has, in slots before
    the last two (an enqueue under way may not have written its row yet), where the counts read before
    the browse and RECOUNT_SETTLE after it agree (a count still moving is left to the next recount).
    Returns the sum of the corrections' sizes (0: nothing was off)."""
    settled = slot_of(now) - SLOT
    first = {(c.domain, c.state, c.slot): c.mails for c in destinations.counts(queue) if c.slot < settled}
    occupied = {(domain, slot_of(row.enqueued_time)) for row in live for domain in _domains(row)}
    suspects = {cell for cell in first if (cell[0], cell[2]) not in occupied}
    if not suspects:
        return 0
    time.sleep(RECOUNT_SETTLE)
    second = {(c.domain, c.state, c.slot): c.mails for c in destinations.counts(queue)}
    wrong = [
        DestinationCount(domain, state, slot, -first[domain, state, slot])
        for domain, state, slot in sorted(suspects)
        if second.get((domain, state, slot), 0) == first[domain, state, slot]
    ]
    destinations.count(queue, wrong)
    return sum(abs(change.mails) for change in wrong)


def slot_of(at: int) -> int:
    """The start of the SLOT that holds the time `at` (microseconds)."""
    return at - at % SLOT


def _domains(row: EnqueuedMail) -> set[str]:
    return {address_key(recipient)[1] for recipient in row.recipient_list}


def by_domain(destinations: Destinations, queue: QueueName, now: int) -> list[DomainShape]:
    counted: dict[str, dict[str, list[int]]] = {}
    in_slots: dict[tuple[str, int], int] = {}
    for count in destinations.counts(queue):
        buckets = counted.setdefault(count.domain, {}).setdefault(count.state, [0] * len(BUCKET_NAMES))
        buckets[_bucket(now - count.slot)] += count.mails
        in_slots[count.domain, count.slot] = in_slots.get((count.domain, count.slot), 0) + count.mails
    oldest: dict[str, int] = {}
    for (domain, slot), mails in in_slots.items():
        if mails > 0 and slot < oldest.get(domain, slot + 1):
            oldest[domain] = slot
    notes = {note.domain: note for note in destinations.notes(queue)}
    suspended = {s.domain: s.until for s in destinations.suspensions(queue) if s.until > now}
    shapes = []
    for domain in sorted(counted.keys() | notes.keys() | suspended.keys()):
        note = notes.get(domain)
        buckets = {
            state: tuple(max(n, 0) for n in counts) for state, counts in counted.get(domain, {}).items()
        }
        shapes.append(
            DomainShape(
                domain,
                buckets,
                None if note is None else note.error,
                None if note is None else to_datetime(note.noted_at),
                None if note is None or note.next_attempt is None else to_datetime(note.next_attempt),
                None if domain not in suspended else to_datetime(suspended[domain]),
                None if domain not in oldest else to_datetime(oldest[domain]),
            )
        )
    return shapes


def _bucket(age: int) -> int:
    minutes = age / (60 * MICROS_PER_SECOND)
    return next((i for i, edge in enumerate(BUCKET_EDGES) if minutes < edge), len(BUCKET_EDGES))
