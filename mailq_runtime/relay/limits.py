"""Per-destination limits of remote delivery that hold across every worker process of a deployment:
concurrent connections and mails per second (or minute, hour) per destination, as Postfix's
`default_destination_concurrency_limit` and KumoMTA's `connection_limit` and `max_message_rate`. A
destination is a domain, or the target of its transport entry (domains sharing a smart host share it).

Kept in the metadata store (the `Destinations` protocol), with no coordinator:
- a connection holds one of the destination's N slots: a leased row, taken with a conditional write (a
  SQLite transaction, a Cassandra lightweight transaction), that ends LEASE after its last renewal. A
  keeper thread renews the slots its process holds every third of LEASE, so a session may last as long
  as it must, and a SIGKILLed worker's slots come back within LEASE. A session kept idle for the next
  mail holds its slot until it is closed, at most IDLE_LIMIT (2 s) later: a worker that needs the slot
  waits that long at most (`WAIT`), rather than every worker paying a cross-process call per mail to
  ask another to close its idle session.
- a rate is a counter per window (a second, a minute or an hour, as the rate is written), raised by a
  conditional write only while below the limit: never more than N mails start in a window. Not a token
  bucket, whose state (tokens, time) every taker recomputes and compare-and-sets, losing to every
  concurrent taker: a window's count is one conditional statement on SQLite, a compare-and-set on
  Cassandra whose loss returns the count to try again with, and its row expires with the window. The
  price: up to 2N mails in a second that straddles two windows.

A worker that gets no slot or no mail of the rate within `WAIT` gives the mail back to the queue after
a short delay, uncounted (`Throttled`): the limit is not the mail's failure.

A session starts a transaction only while its slot is known to be its own (`holds`): no renewal found
the row taken by another holder, and its last take or renewal began less than LEASE ago, so the row
cannot have expired yet. A renewal that comes late (the store slow or away, the process paused) finds
the slot lost, or the lease has run out by this process's clock: the session finishes the transaction in
flight, starts no other and is closed (connections.py), and the mail that wanted it is throttled. The
bound: a destination sees at most N transactions at once, plus, for each lease that ran out during a
transaction, that one transaction while it ends (at most the client's TIMEOUT a reply); and a session
left idle with its slot lost stays open, carrying nothing, until its worker's next look at its sessions.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..clock import MICROS_PER_SECOND, Clock
from ..errors import InvalidInput, shown
from ..model import DomainName
from ..stores.protocols import Destinations

log = logging.getLogger("mailq_runtime.relay")

# Postfix's default_destination_concurrency_limit.
DEFAULT_CONCURRENCY = 20
# Microseconds a slot is held after its last renewal: the longest a SIGKILLed worker's slot stays taken.
LEASE = 10 * MICROS_PER_SECOND
# Seconds a worker waits for a slot or a mail of the rate before it gives the mail back: past the idle
# limit of a kept session (connections.py), so a slot held by another worker's idle session comes free.
WAIT = 2.5
# Microseconds before a mail that found no slot is tried again: about the time a busy destination's
# sessions take to free one.
SLOT_DELAY = MICROS_PER_SECOND
# Seconds between tries for a slot meanwhile.
_POLL = 0.1
_RATE = re.compile(r"^(\d+)(?:/([smh]))?$")
_WINDOWS = {"s": 1, "m": 60, "h": 3600}


@dataclass(frozen=True)
class Rate:
    """At most `mails` mails begin in each window of `window` microseconds."""

    mails: int
    window: int

    @classmethod
    def parse(cls, text: str | int) -> Rate | None:
        """ "N", "N/s", "N/m" or "N/h" (KumoMTA's spelling); "0" is no limit."""
        found = _RATE.match(str(text).strip())
        if found is None:
            raise InvalidInput(f"invalid rate {shown(text)}: N, N/s, N/m or N/h mails, N a whole number")
        mails = int(found.group(1))
        if not mails:
            return None
        return cls(mails, _WINDOWS[found.group(2) or "s"] * MICROS_PER_SECOND)

    def __str__(self) -> str:
        unit = {seconds * MICROS_PER_SECOND: name for name, seconds in _WINDOWS.items()}[self.window]
        return f"{self.mails}/{unit}"


@dataclass(frozen=True)
class Limit:
    """A destination's limits: `concurrency` connections at a time, `rate` mails a window; None is none."""

    concurrency: int | None = DEFAULT_CONCURRENCY
    rate: Rate | None = None


def parse_concurrency(value: int | str | None) -> int | None:
    """A count of connections; 0 or None is no limit."""
    if value is None:
        return None
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit():
        raise InvalidInput(f"invalid concurrency {shown(value)}: a whole number of connections, 0 for none")
    return int(text) or None


@dataclass(frozen=True)
class DestinationLimits:
    """The `default` limit, and per domain the limits that differ from it (`domains`)."""

    default: Limit = field(default_factory=Limit)
    domains: Mapping[str, Limit] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        concurrency: int | str | None = DEFAULT_CONCURRENCY,
        rate: str | int | None = None,
        domains: Mapping[str, Mapping[str, int | str | None]] | None = None,
    ) -> DestinationLimits:
        """From the values a person writes: `domains` maps a domain to its "concurrency" and/or "rate",
        each overriding the default's (e.g. {"example.com": {"concurrency": 2, "rate": "10/s"}})."""
        default = Limit(parse_concurrency(concurrency), None if rate is None else Rate.parse(rate))
        overrides = {}
        for domain, given in (domains or {}).items():
            unknown = set(given) - {"concurrency", "rate"}
            if unknown:
                raise InvalidInput(f"unknown limit {shown(sorted(unknown)[0])} for {shown(domain)}")
            overrides[DomainName(domain)] = Limit(
                parse_concurrency(given["concurrency"]) if "concurrency" in given else default.concurrency,
                Rate.parse(given["rate"]) if given.get("rate") is not None else default.rate,
            )
        return cls(default, overrides)

    def of_domain(self, domain: str) -> Limit:
        return self.domains.get(domain, self.default)


@dataclass(frozen=True)
class Slot:
    """A connection's slot at `destination` (`number` None: no concurrency limit there)."""

    destination: str
    number: int | None = None
    holder: str = ""


@dataclass(frozen=True)
class Throttled:
    """No slot or no mail of the rate was had in time (the `limit`, "connections" or "rate"): try again
    after `delay` microseconds."""

    delay: int
    limit: str
    reason: str


@dataclass(frozen=True)
class Destination:
    """Where a domain's mail goes as the limits count it: `name` (the domain, or its transport entry's
    target), its `limit`, and the `limiter` that counts (None: no limits)."""

    name: str
    limit: Limit
    limiter: Limiter | None

    def send(self) -> Throttled | None:
        """Count one mail in the rate (see `Limiter.send`)."""
        return None if self.limiter is None else self.limiter.send(self.name, self.limit)


class Limiter:
    """The limits of `limits`, kept in `destinations` on `clock`; one a process, shared by its worker
    threads (`close()` it when they stop: its slots are freed)."""

    def __init__(self, destinations: Destinations, limits: DestinationLimits, clock: Clock) -> None:
        self.destinations = destinations
        self.limits = limits
        self.clock = clock
        self._lock = threading.Condition()
        self._held: dict[str, Slot] = {}  # by holder
        self._lost: set[str] = set()  # holders whose lease ran out while their session was open
        self._renewed: dict[str, float] = {}  # by holder: time.monotonic() its last take or renewal began
        self._keeper: threading.Thread | None = None
        self._closed = False

    def slot(self, destination: str, limit: Limit) -> Slot | None:
        """A slot at `destination`, None if none came free within WAIT."""
        if limit.concurrency is None:
            return Slot(destination)
        holder = uuid.uuid4().hex
        deadline = time.monotonic() + WAIT
        while True:
            started = time.monotonic()
            number = self.destinations.take_slot(destination, limit.concurrency, holder, self.clock(), LEASE)
            if number is not None:
                taken = Slot(destination, number, holder)
                self._keep(taken, started)
                return taken
            if time.monotonic() + _POLL > deadline:
                return None
            time.sleep(_POLL)

    def free(self, slot: Slot) -> None:
        """Give the slot back (its connection is closed)."""
        if slot.number is None:
            return
        with self._lock:
            self._held.pop(slot.holder, None)
            self._lost.discard(slot.holder)
            self._renewed.pop(slot.holder, None)
        try:
            self.destinations.free_slot(slot.destination, slot.number, slot.holder)
        except Exception as error:
            # No longer renewed, the slot comes free within LEASE anyway.
            log.warning("could not free a slot at %s: %s", slot.destination, error)

    def holds(self, slot: Slot) -> bool:
        """Whether the slot's lease is surely still this process's (see the module's docstring): a session
        starts a transaction only then, and is closed rather than kept once it is not."""
        if slot.number is None:
            return True
        with self._lock:
            renewed = self._renewed.get(slot.holder)
            lost = slot.holder in self._lost
        return not lost and renewed is not None and time.monotonic() < renewed + LEASE / MICROS_PER_SECOND

    def send(self, destination: str, limit: Limit) -> Throttled | None:
        """Count one mail to `destination` in its rate's window, waiting for the next windows while they
        start within WAIT; a Throttled when the rate allows none by then."""
        rate = limit.rate
        if rate is None:
            return None
        deadline = time.monotonic() + WAIT
        while True:
            now = self.clock()
            window = now - now % rate.window
            if self.destinations.take_send(destination, window, rate.window, rate.mails):
                return None
            wait = window + rate.window - now
            # Bounded, as other workers may take every next window's mails before this one.
            if time.monotonic() + wait / MICROS_PER_SECOND > deadline:
                return Throttled(wait, "rate", f"rate {rate} reached")
            time.sleep(wait / MICROS_PER_SECOND)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            held = list(self._held.values())
            self._lock.notify()
        for slot in held:
            self.free(slot)
        if self._keeper is not None:
            self._keeper.join()

    def _keep(self, slot: Slot, started: float) -> None:
        with self._lock:
            self._held[slot.holder] = slot
            self._renewed[slot.holder] = started
            if self._keeper is None:
                self._keeper = threading.Thread(target=self._renew, name="mailq slot keeper", daemon=True)
                self._keeper.start()

    def _renew(self) -> None:
        """Every third of LEASE, renew each slot held; a failure to reach the store is tried again at the
        next round, within the lease. The store is called outside the lock, which takers share."""
        interval = LEASE / MICROS_PER_SECOND / 3
        while True:
            with self._lock:
                self._lock.wait(interval)
                if self._closed:
                    return
                held = [s for s in self._held.values() if s.holder not in self._lost]
            for slot in held:
                started = time.monotonic()
                try:
                    renewed = self.destinations.renew_slot(
                        slot.destination, slot.number or 0, slot.holder, self.clock(), LEASE
                    )
                except Exception:
                    log.warning("could not renew a slot at %s", slot.destination, exc_info=True)
                    continue
                with self._lock:
                    if slot.holder not in self._held:
                        continue  # freed meanwhile
                    if renewed:
                        self._renewed[slot.holder] = started
                    else:
                        self._lost.add(slot.holder)
                if not renewed:
                    log.warning("lost a slot at %s: its lease ran out", slot.destination)
