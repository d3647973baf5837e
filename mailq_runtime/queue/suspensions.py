"""Suspend and resume a destination domain (KumoMTA's suspend), and retry it now (Postfix's
`postqueue -s`). A suspension is one row of the store; remote delivery reads it (relay/delivery.py) and
defers the domain's recipients, new arrivals too, on its schedule until the suspension ends or is lifted.
A resume drops the row, then retries the domain now, so its mails go out without waiting for their next
attempt: a crash between the two leaves them to their schedule."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from ..clock import from_datetime, to_datetime
from ..errors import InvalidInput, shown
from ..model import DomainName, parse_duration
from ..stores.records import Suspension
from .context import QueueContext, QueuePart


class Suspensions(QueuePart):
    def __init__(self, context: QueueContext, flush_domain: Callable[[str], int]) -> None:
        super().__init__(context)
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

    def suspended(self) -> dict[str, datetime]:
        """The domains suspended now, each with the end of its suspension."""
        now = self.clock()
        return {
            s.domain: to_datetime(s.until) for s in self.destinations.suspensions(self.name) if s.until > now
        }
