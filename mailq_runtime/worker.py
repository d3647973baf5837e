"""Local delivery: a worker that takes mails off a queue and appends them to their recipients' INBOXes.

Delivery is at-least-once and idempotent. The message id of a delivered copy is derived from (enqueue id,
recipient), and a copy already in the source of truth is not appended again, so a worker dying between
delivering and acknowledging (the broker then delivers the mail again) never duplicates mail. Several
workers, threads or processes, may serve one queue on one data directory: the broker leases each mail to
one of them, and the mailboxes allocate uids atomically. A worker extends the lease of the mail in hand
while its delivery runs, so a slow delivery is not given to another worker meanwhile.

A local domain's recipient who is not a local user (no mailbox: `Mailboxes.has_user`, the definition
`mailq smtp` refuses recipients by) is bounced: the sender gets an RFC 3464 notification (5.1.1), none
for a null sender, enqueued before the mail is settled, as remote delivery's bounces are.

With remote delivery (`mailq_runtime.relay`), the same worker sends the other domains' recipients by
SMTP, and settles the mail once for both: done, or retried to the deferred remote recipients only.
"""

from __future__ import annotations

import hashlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from .clock import MICROS_PER_SECOND
from .errors import BACKEND_FAILURES, BrokerRefused, InvalidInput, LeaseExpired
from .mailbox import INBOX, unknown_user_reply
from .mailboxes import Mailboxes
from .model import (
    Mail,
    MailAddress,
    MessageId,
    check_message,
    creation_time,
    normalise_domains,
    parse_count,
    parse_duration,
)
from .queue import MailQueue, MailQueueItem
from .relay import Outcome, RemoteDelivery
from .relay.dsn import Failed, Notifications

if TYPE_CHECKING:
    from .runtime import Runtime

log = logging.getLogger(__name__)

# How long one dequeue waits: the bound on how late a worker notices `stop` while idle.
_POLL_SECONDS = 0.2
# How long a worker waits after a backend failed a dequeue, doubling up to the last while it fails: the
# mail it held is given back at once, and the worker comes back to it within seconds of the backend.
_BACKOFF_FIRST, _BACKOFF_MAX = 0.5, 5.0
# The mails a worker thread takes at once when they are ready (one claim): their settlements share one
# commit (one WAL sync on the embedded store), which takes about a fifth off a relaying worker's CPU a
# mail (docs/benchmarks.md, "The worker's batch"). The batch is also bounded in
# time: past BATCH_SECONDS (a slow destination), the mails not yet tried go back to the queue at once,
# for another worker, rather than waiting behind it with their leases held.
BATCH, BATCH_SECONDS = 8, 1.0


@dataclass
class WorkerStats:
    delivered: int = 0  # mails delivered to every recipient and acknowledged
    retried: int = 0  # deliveries given back to the queue for a later attempt
    dead_lettered: int = 0  # mails rejected: malformed, unknown recipients, or out of attempts
    appended: int = 0  # messages appended to mailboxes (a redelivered copy already there is not counted)
    lease_expired: int = 0  # mails not settled here: their lease was lost, another worker settles them
    # recipients whose mail was returned to its sender: local users unknown, and remote delivery's
    bounced: int = 0
    throttled: int = 0  # mails given back untried for a destination's limit (remote delivery)

    @classmethod
    def total(cls, each: list[WorkerStats]) -> WorkerStats:
        """The stats of several workers together."""
        return cls(**{name: sum(getattr(stats, name) for stats in each) for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class DeliveryReport:
    appended: int
    already_delivered: int
    unknown_recipients: tuple[MailAddress, ...]  # outside the local domains
    unknown_users: tuple[MailAddress, ...] = ()  # in a local domain, without a mailbox: to be bounced


def delivery_message_id(enqueue_id: str, recipient: str) -> MessageId:
    """The message id of `recipient`'s copy: the enqueue id's time (ids keep sorting by age) and a hash
    of both, so every redelivery of the mail names the same copy."""
    digest = hashlib.sha256(f"{enqueue_id}\0{recipient.lower()}".encode()).hexdigest()
    return MessageId(enqueue_id[:16] + digest[:16])


def deliver(
    mailboxes: Mailboxes, enqueue_id: str, mail: Mail, local_domains: Collection[str]
) -> DeliveryReport:
    """Append `mail` to the INBOX of each local user among its recipients, once per recipient.

    Raises InvalidInput, before appending anything, if the message is malformed: that mail is never
    deliverable. The recipients outside `local_domains`, and those in them who are no local user, are
    returned, not delivered."""
    return _deliver(mailboxes, enqueue_id, mail, normalise_domains(local_domains))


def _deliver(mailboxes: Mailboxes, enqueue_id: str, mail: Mail, domains: frozenset[str]) -> DeliveryReport:
    """`deliver` to domains normalised already (`handle`'s, normalised once per worker)."""
    message = check_message(mail.message)
    appended = already = 0
    unknown_users: list[MailAddress] = []
    recipients = dict.fromkeys(MailAddress(r.lower()) for r in mail.recipients)
    unknown = tuple(recipient for recipient in recipients if recipient.domain not in domains)
    if len(unknown) == len(recipients):
        return DeliveryReport(0, 0, unknown)  # nothing to write: no transaction, no commit, no sync
    # The copies' writes (each one's source of truth, projection and counters) in one group on a store
    # that groups writes: one commit, and on the embedded store one sync, per delivery instead of three
    # per copy. Each append's order still holds if its group commits alone.
    with mailboxes.writes.work.writes():
        for recipient in recipients:
            if recipient.domain not in domains:
                continue
            message_id = delivery_message_id(enqueue_id, recipient)
            # Anywhere, not only in the INBOX: the user may have moved the first copy before the redelivery.
            placements = mailboxes.locate(message_id)
            if placements:
                # A backend that failed the first append after the source of truth left the copy out of
                # the projection, which lists the mailbox: written again here (an idempotent copy of the
                # source of truth) rather than left unlisted until the next counter recomputation.
                for mailbox_id in placements:
                    mailboxes.heal_projection(mailbox_id, message_id)
                already += 1
                continue
            inbox = mailboxes.delivery_inbox(recipient)
            if inbox is None:
                unknown_users.append(recipient)
                continue
            # Placed nowhere, as read just now: the append does not look for the copy again.
            mailboxes.writes.append_unplaced(inbox, message, message_id)
            appended += 1
    return DeliveryReport(appended, already, unknown, tuple(unknown_users))


def run_worker(
    runtime: Runtime,
    queue_name: str,
    *,
    local_domains: Collection[str],
    stop: threading.Event | None = None,
    idle_timeout: timedelta | int | float | str | None = None,
    retry_delay: timedelta | int | float | str = "5m",
    max_attempts: int = 5,
    relay: RemoteDelivery | None = None,
    hostname: str | None = None,
) -> WorkerStats:
    """Deliver the mails of `queue_name` to local mailboxes until stopped; returns what it did.

    For each mail: every recipient in `local_domains` gets a copy in the INBOX of the user named by their
    address (lowercased), then the mail is acknowledged (`done()`, which releases the queue's blob
    references; the copies hold their own). A mail is rejected to the dead letters (which keep its
    content) when it is malformed (`check_message`, the rule enqueue applies too) or has recipients outside
    `local_domains` (the local ones are delivered first; the reason names the others). A backend away (the
    store, the blob store, the broker) gives the mail back untried and uncounted, and the worker waits for
    it, half a second and doubling up to 5 s, so an outage delays mails by its length and dead-letters
    none. Any other failure gives the mail back to the queue for another try after `retry_delay`, and
    rejects it once it has been attempted `max_attempts` times.

    With `relay`, recipients outside `local_domains` are delivered by SMTP instead of dead-lettered:
    retried on the relay's schedule to those deferred only, and bounced to the sender with a delivery
    status notification (see `mailq_runtime.relay`). Notifications name `hostname` (default: the
    machine's FQDN; with `relay`, the relay's) as their reporting MTA.

    Raises UnknownQueue, naming the known queues, if no enqueue has created `queue_name`. Returns when
    `stop` is set (the mail in hand is finished first, the rest of its batch given back: the CLI sets
    it on SIGTERM) or when no mail has arrived for `idle_timeout` (seconds, or a duration as
    `parse_duration` reads it); with neither, it runs for ever.
    """
    domains = normalise_domains(local_domains)
    parse_duration(retry_delay, "retry_delay")
    max_attempts = parse_count(max_attempts, "max_attempts")
    if idle_timeout is not None:
        idle_timeout = parse_duration(idle_timeout, "idle_timeout") / MICROS_PER_SECOND
    # A worker serves a queue that enqueues have created: a typo must fail, not create an empty queue.
    queue = runtime.queue(queue_name, create=False)
    mailboxes = runtime.mailboxes
    notifications = (
        relay.notifications if relay is not None else Notifications(queue, hostname or socket.getfqdn())
    )
    stats = WorkerStats()
    idle_since = time.monotonic()
    stop = threading.Event() if stop is None else stop
    backoff = _BACKOFF_FIRST
    with LeaseKeeper(queue.backends.broker.visibility_timeout / MICROS_PER_SECOND / 2) as leases:
        while not stop.is_set():
            wait = _POLL_SECONDS
            if idle_timeout is not None:
                remaining = idle_timeout - (time.monotonic() - idle_since)
                if remaining <= 0:
                    break
                wait = min(wait, remaining)
            try:
                item = queue.dequeue(timeout=wait)
                if item is None and relay is not None:
                    relay.idle()
                if item is not None:
                    items = [item, *queue.dequeue_ready(BATCH - 1)]
                    handle(
                        queue,
                        mailboxes,
                        items,
                        domains,
                        retry_delay,
                        max_attempts,
                        stats,
                        notifications,
                        leases=leases,
                        relay=relay,
                        stop=stop,
                    )
                    idle_since = time.monotonic()
            except BrokerRefused:
                raise  # its configuration must change: waiting will not help
            except BACKEND_FAILURES as error:
                log.warning("queue %s: a backend is away, again in %.1f s: %s", queue_name, backoff, error)
                stop.wait(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX)
                continue
            backoff = _BACKOFF_FIRST
    return stats


class LeaseKeeper:
    """Extends the leases of the mails a worker has in hand every `interval` seconds while `keeping` them.

    One thread per worker, started at its first mail, rather than one per mail: starting a thread costs
    about 150 us, a sixth of a whole delivery on the embedded store. The extension runs under the keeper's
    lock, so leaving `keeping` waits for one in progress: the mails are settled only after it."""

    def __init__(self, interval: float) -> None:
        self._interval = interval
        self._changed = threading.Condition()
        self._items: list[MailQueueItem] = []
        self._due = 0.0
        self._closed = False
        self._thread: threading.Thread | None = None

    def __enter__(self) -> LeaseKeeper:
        return self

    def __exit__(self, *exception: object) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify()
        if self._thread is not None:
            self._thread.join()

    @contextmanager
    def keeping(self, items: Sequence[MailQueueItem]) -> Iterator[None]:
        # A zero visibility timeout makes every lease expire at once: there is nothing to keep.
        if self._interval <= 0:
            yield
            return
        with self._changed:
            self._items = list(items)
            self._due = time.monotonic() + self._interval
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="mailq lease keeper", daemon=True)
                self._thread.start()
            self._changed.notify()
        try:
            yield
        finally:
            with self._changed:
                self._items = []

    def _run(self) -> None:
        with self._changed:
            while not self._closed:
                wait = None if not self._items else self._due - time.monotonic()
                if wait is None or wait > 0:
                    self._changed.wait(wait)
                    continue
                self._due = time.monotonic() + self._interval
                for item in list(self._items):
                    try:
                        item.extend_lease()
                    except LeaseExpired:
                        log.warning("lost the lease on mail %s while delivering it", item.enqueue_id)
                        self._items.remove(item)
                    # Any other failure (the store busy past its timeout) may pass: the next interval
                    # tries again, and the delivery goes on meanwhile, as settling the mail says what
                    # became of it.
                    except Exception:
                        log.warning("could not extend the lease on mail %s", item.enqueue_id, exc_info=True)


def handle(
    queue: MailQueue,
    mailboxes: Mailboxes,
    items: Sequence[MailQueueItem],
    domains: frozenset[str],
    retry_delay: timedelta | int | float | str,
    max_attempts: int,
    stats: WorkerStats,
    notifications: Notifications,
    *,
    leases: LeaseKeeper | None = None,
    relay: RemoteDelivery | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Deliver the mails dequeued from `queue` one after the other, then settle them as `run_worker` does
    in one group of the queue's writes (one commit on a store that groups them), counting the outcomes in
    `stats` and logging each in one line that names the mail by its enqueue id (`delivery_line`).
    `domains` are normalised (`normalise_domains`); the caller that drives its own dequeues (the demo, on
    simulated time) gets exactly the worker's behaviour. The notifications of bounces go through
    `notifications`. `leases` keeps the mails' leases while they are delivered. Past BATCH_SECONDS, or
    once `stop` is set, the mails not yet tried go back to the queue untried. A backend away gives the
    mail it failed and those not yet tried back untried, settles those tried, and is raised, for the
    caller to wait.

    A crash before the settlements' commit sends the delivered mails again (at-least-once): local copies
    are not appended twice, and a remote recipient gets the mail again, as after a crash between any
    delivery and its acknowledgement."""
    settlements: list[Callable[[], None]] = []
    started = time.monotonic()
    try:
        with nullcontext() if leases is None else leases.keeping(items):
            for index, item in enumerate(items):
                if time.monotonic() - started > BATCH_SECONDS or (stop is not None and stop.is_set()):
                    settlements += [_giving_back(untried, stats) for untried in items[index:]]
                    break
                try:
                    settlements.append(
                        _attempt(
                            mailboxes, item, domains, retry_delay, max_attempts, stats, notifications, relay
                        )
                    )
                except BACKEND_FAILURES:
                    settlements += [_giving_back(untried, stats) for untried in items[index + 1 :]]
                    raise
    finally:
        if settlements:
            with queue.writes():
                for settle in settlements:
                    settle()


def _giving_back(item: MailQueueItem, stats: WorkerStats) -> Callable[[], None]:
    return lambda: _settle(item, item.release, stats)


def _attempt(
    mailboxes: Mailboxes,
    item: MailQueueItem,
    domains: frozenset[str],
    retry_delay: timedelta | int | float | str,
    max_attempts: int,
    stats: WorkerStats,
    notifications: Notifications,
    relay: RemoteDelivery | None,
) -> Callable[[], None]:
    """Deliver one mail: its local copies written, its remote recipients sent to, the notification of its
    bounces enqueued; returns its settlement, to run with the others of its batch. A backend away gives
    the mail back untried and is raised."""
    try:
        report = _deliver(mailboxes, item.enqueue_id, item.mail, domains)
        bounced = [_unknown_user(item, user) for user in report.unknown_users]
        if relay is not None and report.unknown_recipients:
            remote = [r for r in item.mail.recipients if r.domain not in domains]
            outcome = relay.deliver(item.enqueue_id, item.mail, remote)
            bounced += outcome.bounced
        # Before the settlement: a crash in between sends a second notification, never none.
        notifications.notify(item.enqueue_id, item.mail, bounced)
    except InvalidInput as error:
        reason = f"undeliverable: {error}"
        return lambda: _dead_letter(item, reason, stats)
    except BACKEND_FAILURES as error:
        # Not the mail's fault: it goes back untried and uncounted, and the caller waits for the backend.
        log.warning(delivery_line(item, "deferred", f"a backend is away: {error}"))
        _settle(item, item.release, stats)
        raise
    except Exception as error:
        failure = f"{type(error).__name__}: {error}"
        if item.attempts >= max_attempts:
            return lambda: _dead_letter(item, f"gave up after {item.attempts} attempts: {failure}", stats)
        # The traceback too: a failure that is neither the mail's nor a backend's is a fault to find.
        log.warning(
            delivery_line(item, "deferred", f"attempt {item.attempts} of {max_attempts}: {failure}"),
            exc_info=True,
        )
        return lambda: _retried(item, lambda: item.retry(retry_delay), stats)
    stats.appended += report.appended
    stats.bounced += len(report.unknown_users)
    if relay is not None and report.unknown_recipients:
        return lambda: _settle_remote(item, relay, outcome, stats)
    if report.unknown_recipients:
        unknown = ", ".join(report.unknown_recipients)
        return lambda: _dead_letter(item, f"unknown recipients: {unknown}", stats)
    if not report.appended and not report.already_delivered:  # every recipient bounced
        return lambda: _delivered(item, stats, "bounced", "returned to its sender: no such local user")
    return lambda: _delivered(item, stats)


def _unknown_user(item: MailQueueItem, user: MailAddress) -> Failed:
    reply = unknown_user_reply(user)
    log.info("%s: to=<%s>, status=bounced (%s)", item.enqueue_id, user, reply)
    return Failed(user, "5.1.1", reply, "none")


def _delivered(
    item: MailQueueItem, stats: WorkerStats, status: str = "sent", detail: str = f"delivered to {INBOX}"
) -> None:
    if _settle(item, item.done, stats):
        stats.delivered += 1
        log.info(delivery_line(item, status, detail))


def _retried(item: MailQueueItem, retry: Callable[[], None], stats: WorkerStats) -> None:
    if _settle(item, retry, stats):
        stats.retried += 1


def delivery_line(item: MailQueueItem, status: str, detail: str) -> str:
    """The log line of a mail's delivery attempt, as Postfix's: its enqueue id (the one `mailq smtp`
    logged and answered with), its recipients, the seconds since it was enqueued, and its status."""
    enqueued = creation_time(item.enqueue_id)
    delay = 0.0 if enqueued is None else max(time.time() - enqueued / MICROS_PER_SECOND, 0.0)
    recipients = ",".join(f"<{recipient}>" for recipient in item.mail.recipients)
    return (
        f"{item.enqueue_id}: to={recipients}, delay={delay:.2f}, attempts={item.attempts}, "
        f"status={status} ({detail})"
    )


def _dead_letter(item: MailQueueItem, reason: str, stats: WorkerStats) -> None:
    if _settle(item, lambda: item.reject(reason), stats):
        stats.dead_lettered += 1
        log.info(delivery_line(item, "dead-letter", reason))


def _settle_remote(item: MailQueueItem, relay: RemoteDelivery, outcome: Outcome, stats: WorkerStats) -> None:
    """Done when no recipient is deferred or throttled; else retried, to those only, after the delay the
    relay's schedule gives the mail's age (its notification of any bounce is enqueued already), or after
    the short delay of a limit when every recipient left was throttled."""
    stats.bounced += len(outcome.bounced)
    if not outcome.deferred and not outcome.throttled:
        if _settle(item, item.done, stats):
            stats.delivered += 1
        return
    if not outcome.deferred:
        # Only throttled by a destination's limit: again soon, and not an attempt of the mail's.
        delay = timedelta(microseconds=outcome.throttle_delay)
        if _settle(item, lambda: item.retry(delay, recipients=outcome.throttled, counted=False), stats):
            stats.throttled += 1
        return
    delay = timedelta(microseconds=relay.retry_delay(item.enqueue_id))
    remaining = outcome.deferred + outcome.throttled
    _retried(item, lambda: item.retry(delay, recipients=remaining), stats)


def _settle(item: MailQueueItem, settle: Callable[[], None], stats: WorkerStats) -> bool:
    """Whether the outcome is this worker's to count: False when another worker took the mail."""
    # A failed acknowledgement loses nothing: the mail comes back (at once when a backend failed, as the
    # queue gives it back; once its lease expires otherwise), and delivering it again is idempotent. So
    # the worker logs it and goes on with the next mail rather than dying.
    try:
        settle()
    except LeaseExpired as error:
        log.warning("%s", error)
        stats.lease_expired += 1
        return False
    except BACKEND_FAILURES as error:
        log.warning("could not settle mail %s, it comes back: %s", item.enqueue_id, error)
    except Exception:
        log.exception("could not settle mail %s: its lease will expire and it comes back", item.enqueue_id)
    return True
