"""What a queue holds, at a glance: ready, in flight, delayed and dead-lettered mails and the oldest of each,
read without browsing the queue; its mails by destination domain (destinations.py); and the recount that
corrects the counters both read.

Every figure comes from something kept for it: the per-slice counters (the live mails, as `size` reads
them), the delayed mails and the dead letters (counted by the metadata store, payloads unread), and the
broker's own counts. Only the oldest ready mail needs the mails themselves: it is the first live mail,
from browse_start on, that is neither delayed nor in flight, so the read stops there (the slices the
counters show empty are skipped).

How exact each figure is (the counters are exact unless a crash fell between a write and its count,
which the pipeline's recount reports):

- held: exact. A held mail is counted in `size` and, until a consumer parks it (holds.py), also as
  ready, in flight or delayed where it waits.
- delayed, next due, dead letters, oldest delayed and oldest dead letter: exact.
- ready and in flight, on a broker that knows its leases (the embedded one): in flight exactly, and ready
  the rest of the live mails (those whose delay fell due, waiting for the next publisher, included).
- ready and in flight, on RabbitMQ: ready is what RabbitMQ holds ready plus the delays fallen due, and in
  flight the rest of the live mails: what RabbitMQ handed to consumers and has not had acknowledged, the
  mails a consumer prefetched (up to `prefetch` a consumer, given back after a second unasked) included.
  After a remove or a clear RabbitMQ still counts the removed mails' messages as ready until a consumer
  discards them, so ready is too high and in flight too low (never below 0) until then. Which mails are
  in flight AMQP does not tell: the oldest ready and the oldest in flight are known only while the other
  count is 0 (the oldest mail still to deliver is then the one), else `unknown` names them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from ..brokers.base import Broker, BrokerCounts
from ..clock import to_datetime
from ..errors import BrokerUnavailable
from ..model import QueueName, creation_time
from ..stores.protocols import DeadLetters, DelayedMails, Destinations, QueueView
from ..stores.records import DestinationNote
from .context import QueueContext, QueuePart
from .destinations import DomainShape, by_domain, recount_by_domain
from .mail_view import live_rows

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueueOverview:
    """A queue's mails by state. The oldest of ready, in-flight and delayed mails is the earliest enqueue
    time among them; that of the dead letters when the longest-kept one died. A time is None when there
    is no such mail, or when the deployment cannot tell it (then `unknown` names it)."""

    queue: str
    size: int  # live mails, from the per-slice counters: ready + in_flight + delayed + parked held ones
    ready: int | None  # deliverable now, not handed to a consumer
    in_flight: int | None  # handed to a consumer, not settled yet
    delayed: int  # waiting for their delay to end
    dead_letters: int  # that the queue will not deliver
    held: int  # that an operator holds
    oldest_ready: datetime | None
    oldest_in_flight: datetime | None
    oldest_delayed: datetime | None
    next_due: datetime | None  # when the next delayed mail falls due
    oldest_dead_letter: datetime | None
    unknown: tuple[str, ...] = ()  # the figures this deployment cannot tell now


class Overviews(QueuePart):
    def __init__(
        self,
        context: QueueContext,
        *,
        view: QueueView,
        broker: Broker,
        delayed: DelayedMails,
        dead_letters: DeadLetters,
        destinations: Destinations,
        held_counts: Callable[[], tuple[int, int]],
    ) -> None:
        super().__init__(context)
        self.view = view
        self.broker = broker
        self.delayed = delayed
        self.dead_letters = dead_letters
        self.destinations = destinations
        self.held_counts = held_counts  # held mails, and those of them parked (holds.py)

    def overview(self) -> QueueOverview:
        """Ready, in-flight, delayed and dead-lettered mails and the oldest of each, without a browse."""
        return _overview(self, *self.held_counts(), read_oldest=True)

    def counts(self) -> QueueOverview:
        """The overview's counts, reading no mail (its oldest ready and in-flight mails `unknown`): what
        a metrics scrape reads."""
        return _overview(self, *self.held_counts(), read_oldest=False)

    def by_domain(self) -> list[DomainShape]:
        """Per destination domain, the mails by state in qshape's age buckets, from counters kept as
        mail moves (destinations.py)."""
        return by_domain(self.destinations, self.name, self.clock())

    def note_destination(self, note: DestinationNote) -> None:
        """Record remote delivery's last failure at a domain and its next attempt, which `by_domain`
        shows."""
        self.destinations.note(self.name, note)

    def recount(self, allowed: Callable[[], bool] = lambda: True) -> int:
        """Correct the counts of every slice from browse_start on against its rows and deletion marks
        (the store's `recount`: on Cassandra, of what settled), then the counts by destination domain
        where no live mail is (`recount_by_domain`); returns the sum of the corrections' sizes (0: the
        counts were right). `allowed` is asked once the queue is known to be created (a queue named and
        never enqueued to has nothing to recount, and writes nothing, not even a lease); False: no
        recount.

        A crash between a write and its count, or two settlements of one mail at once, leaves a slice's
        count wrong by one. A consumer's process recounts on its own every RECOUNT_INTERVAL seconds,
        busy or idle (`dequeue`). It costs a browse."""
        browse_start = self.view.browse_start(self.name)
        if browse_start is None or not allowed():
            return 0
        corrected = 0
        for slice_start in self.view.slices_from(self.name, browse_start):
            corrected += self.view.recount(self.name, slice_start)
        corrected += recount_by_domain(
            self.destinations, self.name, live_rows(self.view, self.name), self.clock()
        )
        if corrected:
            log.warning("queue %s: counters corrected by %d from the rows", self.name, corrected)
        return corrected


def _overview(parts: Overviews, held: int, parked: int, *, read_oldest: bool) -> QueueOverview:
    """`held` mails an operator holds, `parked` of them out of the broker and the delayed mails."""
    name = parts.name
    now = parts.clock()
    view = parts.view
    browse_start = parts.context.created(view.browse_start(name))
    # A slice counted below zero (a double count not yet recounted: `recount`) holds none.
    sizes = [(start, max(live, 0)) for start, live in view.slice_sizes(name, browse_start)]
    size = sum(live for _, live in sizes)
    delayed = parts.delayed.summary(name, now)
    letters = parts.dead_letters.summary(name)
    try:
        broker: BrokerCounts | None = parts.broker.counts(name)
    except BrokerUnavailable as error:
        log.warning("queue %s: the broker's counts are unknown: %s", name, error)
        broker = None
    pending = 0 if broker is None else broker.dead_letters  # still live in the view until drained
    deliverable = max(size - delayed.waiting - pending - parked, 0)
    common = {
        "queue": name,
        "size": size,
        "delayed": delayed.waiting,
        "dead_letters": letters.count + pending,
        "held": held,
        "oldest_delayed": _time(creation_time(delayed.oldest_waiting or "")),
        "next_due": _time(delayed.next_due),
        "oldest_dead_letter": _time(letters.oldest_died_at),
    }
    if broker is None:
        return QueueOverview(
            **common,
            ready=None,
            in_flight=None,
            oldest_ready=None,
            oldest_in_flight=None,
            unknown=("ready", "in_flight", "oldest_ready", "oldest_in_flight"),
        )
    ready, in_flight = _split(broker, deliverable, delayed.fallen_due)
    counts = {**common, "ready": ready, "in_flight": in_flight}
    if not read_oldest:
        return QueueOverview(
            **counts, oldest_ready=None, oldest_in_flight=None, unknown=("oldest_ready", "oldest_in_flight")
        )
    if broker.leased is not None:
        leased_times = [t for t in map(creation_time, broker.leased) if t is not None]
        return QueueOverview(
            **counts,
            oldest_ready=_time(_oldest_deliverable(view, name, sizes, now, broker.leased)) if ready else None,
            oldest_in_flight=_time(min(leased_times, default=None)),
        )
    oldest = _time(_oldest_deliverable(view, name, sizes, now, frozenset())) if deliverable else None
    unknown = ("oldest_ready", "oldest_in_flight") if ready and in_flight else ()
    return QueueOverview(
        **counts,
        oldest_ready=oldest if not in_flight else None,
        oldest_in_flight=oldest if not ready else None,
        unknown=unknown,
    )


def _split(broker: BrokerCounts, deliverable: int, fallen_due: int) -> tuple[int, int]:
    """(ready, in flight) of the deliverable mails: on a broker that knows its leases, in flight exactly;
    on RabbitMQ, ready is what it holds ready plus the delays fallen due."""
    if broker.leased is not None:
        in_flight = len(broker.leased)
        return max(deliverable - in_flight, 0), in_flight
    ready = (broker.ready or 0) + fallen_due
    return ready, max(deliverable - ready, 0)


def _oldest_deliverable(
    view: QueueView, name: QueueName, sizes: list[tuple[int, int]], now: int, skip: frozenset[str]
) -> int | None:
    """The enqueue time of the first live mail from browse_start on that is deliverable now (its next
    delivery come) and not in `skip`."""
    for slice_start, live in sizes:
        if live <= 0:
            continue
        for row in view.live_mails(name, slice_start):
            if row.next_delivery <= now and row.enqueue_id not in skip:
                return row.enqueued_time
    return None


def _time(micros: int | None) -> datetime | None:
    return None if micros is None else to_datetime(micros)
