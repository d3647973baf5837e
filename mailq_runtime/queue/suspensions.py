"""Suspend and resume a destination domain (KumoMTA's suspend), bounce its mails with a reason, now and
for a window of new arrivals (KumoMTA's bounce), and retry it now (Postfix's `postqueue -s`).

A suspension or a bounce is one row of the store; remote delivery reads them (relay/delivery.py), and
defers a suspended domain's recipients, new arrivals too, on its schedule until the suspension ends or is
lifted, or bounces a bounced domain's. A resume drops the row, then retries the domain now, so its mails
go out without waiting for their next attempt: a crash between the two leaves them to their schedule."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from ..clock import from_datetime, to_datetime
from ..errors import InvalidInput, shown
from ..model import DomainName, parse_duration
from ..stores.protocols import Destinations
from ..stores.records import DomainBounce, Suspension
from .context import QueueContext, QueuePart


class Suspensions(QueuePart):
    def __init__(
        self, context: QueueContext, *, destinations: Destinations, flush_domain: Callable[[str], int]
    ) -> None:
        super().__init__(context)
        self.destinations = destinations
        self.flush_domain = flush_domain

    def suspend(self, domain: str, until: datetime | timedelta | str) -> datetime:
        """Suspend deliveries to `domain` until a time (aware), or for a duration from now; returns the
        end. A time not in the future is refused."""
        name = DomainName(domain)
        now = self.clock()
        if isinstance(until, datetime):
            if until.tzinfo is None:
                raise InvalidInput(f"invalid time {shown(until.isoformat())}: give its time zone")
            end = from_datetime(until)
            if end <= now:
                raise InvalidInput(f"the time {until.isoformat()} is in the past: a suspension ends later")
        else:
            length = parse_duration(until, "suspension")
            if not length:
                raise InvalidInput(f"invalid suspension {shown(until)}: must be longer than zero")
            end = now + length
        self.destinations.suspend(self.name, Suspension(name, end))
        return to_datetime(end)

    def resume(self, domain: str) -> int:
        """Lift the suspension of `domain` and retry it now; how many delayed mails were made due. A domain
        not suspended is refused."""
        name = DomainName(domain)
        if name not in self.suspended():
            raise InvalidInput(f"domain {name} of queue {self.name!r} is not suspended")
        self.destinations.resume(self.name, name)
        return self.flush_domain(name)

    def retry(self, domain: str) -> int:
        """Make the delayed mails with a recipient at `domain` deliverable now; how many."""
        return self.flush_domain(DomainName(domain))

    def bounce(self, domain: str, reason: str, window: timedelta | str | None = None) -> int:
        """Return to their senders the mails for `domain` enqueued until now, or until the end of
        `window` from now (new arrivals meanwhile too), with `reason`: remote delivery bounces them at
        their next attempt (relay/delivery.py), which this makes due now for those delayed. Crash-safe
        order: 1. the bounce's row; 2. the domain's delayed mails due now. A crash after 1 leaves them to
        bounce on their schedule. How many delayed mails were made due."""
        name = DomainName(domain)
        if not isinstance(reason, str) or not reason.strip() or any(c in reason for c in "\r\n\0"):
            raise InvalidInput(f"invalid bounce reason {shown(reason)}: give one line of text")
        length = 0 if window is None else parse_duration(window, "bounce window")
        self.destinations.bounce(
            self.name, DomainBounce(name, " ".join(reason.split()), self.clock() + length)
        )
        return self.flush_domain(name)

    def bounced(self) -> dict[str, DomainBounce]:
        """The bounces in force by domain (each catches the mails enqueued up to its `until`)."""
        return {b.domain: b for b in self.destinations.bounces(self.name)}

    def suspended(self) -> dict[str, datetime]:
        """The domains suspended now, each with the end of its suspension."""
        now = self.clock()
        return {
            s.domain: to_datetime(s.until) for s in self.destinations.suspensions(self.name) if s.until > now
        }
