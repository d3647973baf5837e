"""Remote delivery of one dequeued mail: its recipients grouped by domain, each domain routed and sent
one SMTP transaction, and every reply sorted into sent, deferred and bounced, with Postfix's log line.

What the worker does with the outcome (`mailq_runtime/worker.py`): the notification of the bounced
recipients is enqueued first, then the mail is settled: done when nothing is deferred, else retried
after the schedule's delay to the deferred recipients only. A crash between the two sends the mail
again to those not yet settled, and may send a second notification: never a lost mail."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..clock import MICROS_PER_SECOND, Clock
from ..metrics import RELAY_ATTEMPTS, RELAY_THROTTLED
from ..model import Mail, MailAddress, creation_time
from ..queue import MailQueue
from ..stores.records import DestinationNote, DomainBounce
from .client import Reply, send
from .connections import Connections
from .dsn import Failed, Notifications
from .limits import Destination, Limit, Limiter, Throttled
from .routes import RouteFailure, Router
from .schedule import RetrySchedule

log = logging.getLogger("mailq_runtime.relay")
CONTROLS_READ = 1.0  # seconds between reads of the suspended and bounced domains


@dataclass(frozen=True)
class Outcome:
    """What became of each recipient; `throttled` ones were not tried (a limit of their destination),
    and are tried again after `throttle_delay` microseconds without counting as an attempt."""

    sent: tuple[str, ...]
    deferred: tuple[str, ...]
    bounced: tuple[Failed, ...]
    throttled: tuple[str, ...] = ()
    throttle_delay: int = 0


class RemoteDelivery:
    """Delivers to other domains through `router`, retries on `schedule`, and enqueues the notifications
    of bounced mail to `queue` as `hostname`'s mailer daemon; `limiter` keeps the per-destination limits
    (None: none). Used by one worker thread at a time, which `close()`s it when it stops (the sessions
    kept for the next mail)."""

    def __init__(
        self,
        queue: MailQueue,
        router: Router,
        schedule: RetrySchedule,
        hostname: str,
        clock: Clock,
        limiter: Limiter | None = None,
    ) -> None:
        self.queue = queue
        self.router = router
        self.schedule = schedule
        self.notifications = Notifications(queue, hostname)
        self.clock = clock
        self._suspended: set[str] = set()
        self._bounced: dict[str, DomainBounce] = {}
        self._controls_read_at = 0.0  # time.monotonic() of the next read
        self.limiter = limiter
        self.connections = Connections(limiter)

    def close(self) -> None:
        """Close the sessions kept for the next mail (the worker stops)."""
        self.connections.close()

    def idle(self) -> None:
        """Close the sessions idle past their limit, freeing their slots for other workers: called while
        the worker waits for mail, when no delivery would."""
        self.connections.close_expired()

    def deliver(self, enqueue_id: str, mail: Mail, recipients: Sequence[MailAddress]) -> Outcome:
        """Send `mail` to `recipients`, one transaction per domain; what became of each."""
        started = time.monotonic()
        replies: dict[str, Reply] = {}
        throttled: dict[str, Throttled] = {}
        age = self.clock() - (creation_time(enqueue_id) or self.clock())
        suspended, bounced = self._controls()
        enqueued = creation_time(enqueue_id) or 0
        for domain, group in _by_domain(recipients).items():
            bounce = bounced.get(domain)
            if bounce is not None and enqueued <= bounce.until:
                text = f"550 5.0.0 returned by the operator: {bounce.reason}"
                replies.update(dict.fromkeys(group, Reply(550, "5.0.0", text, "none")))
                continue
            if domain in suspended:
                text = f"delivery to {domain} suspended by the operator"
                replies.update(dict.fromkeys(group, Reply(450, "4.3.2", text, "none")))
                continue
            sent = self._send(enqueue_id, mail, domain, group)
            if isinstance(sent, Throttled):
                throttled.update(dict.fromkeys(group, sent))
                continue
            replies.update(sent)
            self._note(domain, list(sent.values()), age)
        outcome = self._sorted(enqueue_id, replies, age, time.monotonic() - started)
        if not throttled:
            return outcome
        delay = max(t.delay for t in throttled.values())
        return replace(outcome, throttled=tuple(throttled), throttle_delay=delay)

    def _send(
        self, enqueue_id: str, mail: Mail, domain: str, group: list[str]
    ) -> dict[str, Reply] | Throttled:
        """One transaction to `domain`'s exchangers, or the route's failure for each of `group`."""
        try:
            targets = self.router.route(domain)
        except RouteFailure as failure:
            code = 550 if failure.permanent else 450
            return dict.fromkeys(group, Reply(code, failure.status, failure.text, "none"))
        destination = self._destination(domain)
        hostname = self.notifications.hostname
        sent = send(targets, destination, mail.sender, group, mail.message, hostname, self.connections)
        if isinstance(sent, Throttled):
            RELAY_THROTTLED.labels(destination.name, sent.limit).inc()
            for recipient in group:
                log.info(
                    "%s: to=<%s>, status=throttled (%s: %s)",
                    enqueue_id,
                    recipient,
                    destination.name,
                    sent.reason,
                )
        return sent

    def _destination(self, domain: str) -> Destination:
        name = self.router.destination(domain)
        limit = Limit(None) if self.limiter is None else self.limiter.limits.of_domain(domain)
        return Destination(name, limit, self.limiter)

    def _controls(self) -> tuple[set[str], dict[str, DomainBounce]]:
        """The domains suspended now and those bounced, read again at most every CONTROLS_READ seconds:
        an operator's control takes effect within that, for the cost of reads a second rather than a
        mail."""
        if time.monotonic() >= self._controls_read_at:
            self._suspended = set(self.queue.suspensions.suspended())
            self._bounced = self.queue.suspensions.bounced()
            self._controls_read_at = time.monotonic() + CONTROLS_READ
        return self._suspended, self._bounced

    def _note(self, domain: str, replies: list[Reply], age: int) -> None:
        """Record the domain's failure, if any, and its next attempt (none when every failure bounces),
        for `mailq queues --by-domain`."""
        failed = [reply for reply in replies if not reply.delivered]
        if not failed:
            return
        now = self.clock()
        retried = not self.schedule.expired(age) and any(not reply.permanent for reply in failed)
        due = now + self.schedule.delay(age) if retried else None
        self.queue.overviews.note_destination(DestinationNote(domain, failed[0].text, now, due))

    def retry_delay(self, enqueue_id: str) -> int:
        """Microseconds until the next attempt of the mail `enqueue_id`, from its age."""
        return self.schedule.delay(self.clock() - (creation_time(enqueue_id) or self.clock()))

    def _sorted(self, enqueue_id: str, replies: dict[str, Reply], age: int, spent: float) -> Outcome:
        expired = self.schedule.expired(age)
        sent, deferred, bounced = [], [], []
        for recipient, reply in replies.items():
            if reply.delivered:
                sent.append(recipient)
                status = "sent"
            elif reply.permanent or expired:
                bounced.append(Failed(recipient, _final(reply, expired), reply.text, reply.relay))
                status = "bounced"
            else:
                deferred.append(recipient)
                status = "deferred"
            RELAY_ATTEMPTS.labels(recipient.rpartition("@")[2].lower(), status).inc()
            log.info(
                "%s: to=<%s>, relay=%s, delay=%.1f, delays=%.2f, dsn=%s, status=%s (%s)",
                enqueue_id,
                recipient,
                reply.relay,
                age / MICROS_PER_SECOND,
                spent,
                reply.status,
                status,
                reply.text if not expired or reply.delivered else f"message expired: {reply.text}",
            )
        return Outcome(tuple(sent), tuple(deferred), tuple(bounced))


def _final(reply: Reply, expired: bool) -> str:
    """The status of a bounce: the server's, or 4.4.7 (delivery time expired) for a passing failure
    that outlived the maximum age."""
    return "4.4.7" if expired and not reply.permanent else reply.status


def _by_domain(recipients: Sequence[MailAddress]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for recipient in dict.fromkeys(recipients):
        groups.setdefault(recipient.domain, []).append(str(recipient))
    return groups
