"""mailq's Prometheus metrics: every family is defined here, on prometheus_client's default registry,
and counted where the work happens (the queue's collaborators, the SMTP session, the backends). Serving
them is the CLI's (`--metrics`); a process that serves nothing only pays for the counting.

Names follow Prometheus's conventions (`_total` counters, base units) and stand for OpenTelemetry's
messaging names where one fits: enqueued is `messaging.client.sent.messages`, dequeued
`messaging.client.consumed.messages`, the enqueue and dequeue durations
`messaging.client.operation.duration`, with the queue as `messaging.destination.name`.

The hot path pays a bound child's `inc()` or `observe()`: each queue, listener and backend call kind
binds its children once (`queue_metrics`, `SmtpMetrics`, `count_calls`), so no label lookup is made per
mail.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any, Protocol

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .errors import BACKEND_FAILURES
from .unit_of_work import UnitOfWork

log = logging.getLogger(__name__)

# Seconds: an enqueue or a dequeue takes from a fraction of a millisecond (embedded) to tens (Cassandra,
# S3, RabbitMQ with confirms); a mail stays in the queue from milliseconds to the days of its retries.
OPERATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
TIME_IN_QUEUE_BUCKETS = (0.01, 0.1, 1.0, 10.0, 60.0, 300.0, 1800.0, 3600.0, 6 * 3600.0, 86400.0, 5 * 86400.0)

ENQUEUED = Counter("mailq_queue_enqueued_mails", "Mails accepted into the queue", ["queue"])
DEQUEUED = Counter("mailq_queue_dequeued_mails", "Mails handed to a consumer", ["queue"])
SETTLED = Counter(
    "mailq_queue_settled_mails",
    "Mails that left the queue, or went back to it, by how: delivered, retried, dead_lettered, removed",
    ["queue", "outcome"],
)
ENQUEUE_SECONDS = Histogram(
    "mailq_queue_enqueue_duration_seconds", "Time to enqueue a mail", ["queue"], buckets=OPERATION_BUCKETS
)
DEQUEUE_SECONDS = Histogram(
    "mailq_queue_dequeue_duration_seconds",
    "Time to make a broker delivery a mail in hand (its check and content read), the wait for one left out",
    ["queue"],
    buckets=OPERATION_BUCKETS,
)
TIME_IN_QUEUE = Histogram(
    "mailq_queue_time_in_queue_seconds",
    "Time from a mail's enqueue to its delivery",
    ["queue"],
    buckets=TIME_IN_QUEUE_BUCKETS,
)
SMTP_SESSIONS = Counter(
    "mailq_smtp_sessions", "SMTP sessions opened, the refused ones included", ["listener"]
)
SMTP_REPLIES = Counter("mailq_smtp_replies", "SMTP replies sent, by code class", ["listener", "code_class"])
SMTP_RECEIVED = Counter("mailq_smtp_received_bytes", "Bytes received from SMTP clients", ["listener"])
BACKEND_CALLS = Counter("mailq_backend_calls", "Calls to a backend, by call kind", ["backend", "kind"])
BACKEND_ERRORS = Counter(
    "mailq_backend_errors", "Backend calls that failed with the backend away or failing", ["backend", "kind"]
)
RELAY_ATTEMPTS = Counter(
    "mailq_relay_attempts",
    "Remote delivery attempts, one per recipient, by destination domain and outcome: sent, deferred, bounced",
    ["domain", "outcome"],
)
RELAY_CONNECTIONS = Gauge(
    "mailq_relay_connections", "SMTP sessions open to mail exchangers, by exchanger", ["destination"]
)
RELAY_THROTTLED = Counter(
    "mailq_relay_throttled",
    "Mails given back untried by a destination's limit, by destination and limit: connections, rate",
    ["destination", "limit"],
)

OUTCOMES = ("delivered", "retried", "dead_lettered", "removed")
STATES = ("ready", "in_flight", "delayed", "dead_letters", "held")


class QueueMetrics:
    """One queue's children of the queue families, bound once."""

    def __init__(self, queue: str) -> None:
        self.enqueued = ENQUEUED.labels(queue)
        self.dequeued = DEQUEUED.labels(queue)
        self.enqueue_seconds = ENQUEUE_SECONDS.labels(queue)
        self.dequeue_seconds = DEQUEUE_SECONDS.labels(queue)
        self.time_in_queue = TIME_IN_QUEUE.labels(queue)
        self.delivered, self.retried, self.dead_lettered, self.removed = (
            SETTLED.labels(queue, outcome) for outcome in OUTCOMES
        )


@functools.cache
def queue_metrics(queue: str) -> QueueMetrics:
    return QueueMetrics(queue)


class SmtpMetrics:
    """One SMTP listener's children, named by the address it is bound to."""

    def __init__(self, listener: str) -> None:
        self.sessions = SMTP_SESSIONS.labels(listener)
        self.received = SMTP_RECEIVED.labels(listener)
        self._replies = {digit: SMTP_REPLIES.labels(listener, f"{digit}xx") for digit in "2345"}

    def reply(self, status: str | bytes) -> None:
        """Count a reply once, at its last line (a multi-line reply's other lines have a `-` after the
        code); aiosmtpd also pushes the 354 of DATA, which counts as 3xx."""
        text = status.decode("ascii", "replace") if isinstance(status, bytes) else status
        if len(text) > 3 and text[3] == "-":
            return
        child = self._replies.get(text[:1])
        if child is not None:
            child.inc()


def count_calls(backend: Any, protocol: type, prefix: str) -> None:
    """Count the calls of `backend`'s methods of `protocol` (and the ones that fail with the backend away
    or failing) as `prefix.method`: the runtime's backend objects are the one seam every call to
    Cassandra, S3, RabbitMQ or SQLite passes, each failure already one of mailq's errors there."""
    name = backend_name(backend)
    for kind in vars(protocol):
        method = getattr(backend, kind, None)
        if not kind.startswith("_") and callable(method):
            setattr(backend, kind, _counting(method, name, f"{prefix}.{kind}"))


def backend_name(backend: Any) -> str:
    """cassandra, s3, rabbitmq, or sqlite (the embedded store, its broker and its blob content)."""
    module = type(backend).__module__
    for name in ("cassandra", "s3", "rabbitmq"):
        if f".{name}" in module:
            return name
    return "sqlite"


def _counting(method: Callable[..., Any], backend: str, kind: str) -> Callable[..., Any]:
    calls = BACKEND_CALLS.labels(backend, kind)

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        calls.inc()
        try:
            return method(*args, **kwargs)
        except BACKEND_FAILURES:
            # Bound on the first failure: a series of zeros per call kind would only crowd a scrape.
            BACKEND_ERRORS.labels(backend, kind).inc()
            raise

    return call


class DomainCounts(Protocol):
    """What a scrape reads of one destination domain's counters (queue.destinations.DomainShape)."""

    @property
    def domain(self) -> str: ...
    @property
    def buckets(self) -> dict[str, tuple[int, ...]]: ...
    @property
    def oldest(self) -> datetime | None: ...
    def total(self, state: str) -> int: ...


class QueueCounts(Protocol):
    """What a scrape reads of a mail queue's overviews (queue.overview.Overviews): its counts by state,
    each an attribute named as in STATES (None: the deployment cannot tell it now), and its destination
    domains."""

    def counts(self) -> object: ...
    def by_domain(self) -> Sequence[DomainCounts]: ...


class CountedQueue(Protocol):
    """What a scrape reads of a mail queue (queue.MailQueue): its overviews."""

    @property
    def overviews(self) -> QueueCounts: ...


class CountedQueues(Protocol):
    """What QueueSizes reads of the runtime (runtime.Runtime), named here because the queue itself counts
    into this module."""

    @property
    def work(self) -> UnitOfWork: ...
    def queues(self) -> list[str]: ...
    def queue(self, name: str) -> CountedQueue: ...


class QueueSizes(Collector):
    """`mailq_queue_mails{queue, state}` read at scrape time from the runtime's counters (each queue's
    `overviews.counts()`, which reads no mail); a state the deployment cannot tell now (RabbitMQ away) is
    left out. Per destination domain, from the counters kept as mail moves (`overviews.by_domain()`, no
    browse either):
    `mailq_destination_mails{queue, domain, state}` and the age of its oldest mail waiting (to the start
    of its enqueue slot, five minutes wide)."""

    def __init__(self, runtime: CountedQueues) -> None:
        self.runtime = runtime

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # Registering a collector without it would run a scrape's reads at once.
        yield from self._families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        sizes, destinations, oldest = self._families()
        try:
            # The store's turn, as a queue operation takes it: a scrape never reads another thread's
            # transaction half done.
            with self.runtime.work.turn():
                now = time.time()
                for name in self.runtime.queues():
                    queue = self.runtime.queue(name)
                    counts = queue.overviews.counts()
                    for state in STATES:
                        value = getattr(counts, state)
                        if value is not None:
                            sizes.add_metric([name, state], value)
                    for shape in queue.overviews.by_domain():
                        for state in shape.buckets:
                            destinations.add_metric([name, shape.domain, state], shape.total(state))
                        if shape.oldest is not None:
                            oldest.add_metric([name, shape.domain], max(now - shape.oldest.timestamp(), 0.0))
        except BACKEND_FAILURES as error:
            # The counters still go out: they are what tells an operator how the backends fail.
            log.warning("the queue sizes are left out of this scrape: %s", error)
            return
        yield from (sizes, destinations, oldest)

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily("mailq_queue_mails", "Mails in the queue, by state", labels=["queue", "state"]),
            GaugeMetricFamily(
                "mailq_destination_mails",
                "Mails with a recipient at a destination domain, by state: queued, deferred, held",
                labels=["queue", "domain", "state"],
            ),
            GaugeMetricFamily(
                "mailq_destination_oldest_mail_age_seconds",
                "Age of the oldest mail waiting for a destination domain",
                labels=["queue", "domain"],
            ),
        )


def seconds_since(started: float) -> float:
    return time.perf_counter() - started
