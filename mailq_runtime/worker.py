"""Local delivery: a worker that takes mails off a queue and appends them to their recipients' INBOXes.

Delivery is at-least-once and idempotent. The message id of a delivered copy is derived from (enqueue id,
recipient), and a copy already in the source of truth is not appended again, so a worker dying between
delivering and acknowledging (the broker then delivers the mail again) never duplicates mail. Several
workers, threads or processes, may serve one queue on one data directory: the broker leases each mail to
one of them, and the mailboxes allocate uids atomically.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from .errors import InvalidInput
from .mailbox import INBOX, Mailboxes, check_message
from .model import Mail, MailAddress, MessageId, parse_duration
from .queue import MailQueueItem

if TYPE_CHECKING:
    from .runtime import Runtime

log = logging.getLogger(__name__)

# How long one dequeue waits: the bound on how late a worker notices `stop` while idle.
_POLL_SECONDS = 0.2


@dataclass
class WorkerStats:
    delivered: int = 0  # mails delivered to every recipient and acknowledged
    retried: int = 0  # deliveries given back to the queue for a later attempt
    dead_lettered: int = 0  # mails rejected: malformed, unknown recipients, or out of attempts
    appended: int = 0  # messages appended to mailboxes (a redelivered copy already there is not counted)


@dataclass(frozen=True)
class DeliveryReport:
    appended: int
    already_delivered: int
    unknown_recipients: tuple[MailAddress, ...]


def delivery_message_id(enqueue_id: str, recipient: str) -> MessageId:
    """The message id of `recipient`'s copy: the enqueue id's time (ids keep sorting by age) and a hash
    of both, so every redelivery of the mail names the same copy."""
    digest = hashlib.sha256(f"{enqueue_id}\0{recipient.lower()}".encode()).hexdigest()
    return MessageId(enqueue_id[:16] + digest[:16])


def normalise_domains(local_domains: Collection[str]) -> frozenset[str]:
    if isinstance(local_domains, str) or not local_domains:
        raise InvalidInput(f"local_domains is a non-empty collection of domains, not {local_domains!r}")
    # The address grammar is the domain grammar's validator: a bad domain fails as postmaster@<domain>.
    return frozenset(MailAddress(f"postmaster@{domain}").domain for domain in local_domains)


def deliver(
    mailboxes: Mailboxes, enqueue_id: str, mail: Mail, local_domains: Collection[str]
) -> DeliveryReport:
    """Append `mail` to the INBOX of each local recipient (created if missing), once per recipient.

    Raises InvalidInput, before appending anything, if the message is malformed: that mail is never
    deliverable. The recipients outside `local_domains` are returned, not delivered."""
    domains = normalise_domains(local_domains)
    message = check_message(mail.message)
    appended = already = 0
    unknown = []
    for recipient in dict.fromkeys(MailAddress(r.lower()) for r in mail.recipients):
        if recipient.domain not in domains:
            unknown.append(recipient)
            continue
        message_id = delivery_message_id(enqueue_id, recipient)
        # Anywhere, not only in the INBOX: the user may have moved the first copy before the redelivery.
        if mailboxes.locate(message_id):
            already += 1
            continue
        inbox = mailboxes.get_or_create(recipient, INBOX)
        mailboxes.append(inbox, message, message_id=message_id)
        appended += 1
    return DeliveryReport(appended, already, tuple(unknown))


def run_worker(
    runtime: Runtime,
    queue_name: str,
    *,
    local_domains: Collection[str],
    stop: threading.Event | None = None,
    idle_timeout: float | None = None,
    retry_delay: timedelta | int | float | str = "5m",
    max_attempts: int = 5,
) -> WorkerStats:
    """Deliver the mails of `queue_name` to local mailboxes until stopped; returns what it did.

    For each mail: every recipient in `local_domains` gets a copy in the INBOX of the user named by their
    address (lowercased), then the mail is acknowledged (`done()`, which releases the queue's blob
    references; the copies hold their own). A mail is rejected to the dead letters (which keep its
    content) when it is malformed (its first line is not a header field) or has recipients outside
    `local_domains` (the local ones are delivered first; the reason names the others). Any other failure
    gives the mail back to the queue for another try after `retry_delay`, and rejects it once it has been
    attempted `max_attempts` times.

    Raises UnknownQueue, naming the known queues, if no enqueue has created `queue_name`. Returns when
    `stop` is set (the mail in hand is finished first: the CLI sets it on SIGTERM) or when no
    mail has arrived for `idle_timeout` seconds; with neither, it runs for ever.
    """
    domains = normalise_domains(local_domains)
    if parse_duration(retry_delay) < 0:
        raise InvalidInput(f"invalid retry_delay {retry_delay!r}: must not be negative")
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise InvalidInput(f"invalid max_attempts {max_attempts!r}: expected a positive integer")
    if idle_timeout is not None and (
        isinstance(idle_timeout, bool) or not isinstance(idle_timeout, int | float) or idle_timeout < 0
    ):
        raise InvalidInput(f"invalid idle_timeout {idle_timeout!r}: expected seconds >= 0 or None")
    # A worker serves a queue that enqueues have created: a typo must fail, not create an empty queue.
    queue = runtime.queue(queue_name, create=False)
    stats = WorkerStats()
    idle_since = time.monotonic()
    while stop is None or not stop.is_set():
        wait = _POLL_SECONDS
        if idle_timeout is not None:
            remaining = idle_timeout - (time.monotonic() - idle_since)
            if remaining <= 0:
                break
            wait = min(wait, remaining)
        item = queue.dequeue(timeout=wait)
        if item is None:
            continue
        handle(runtime.mailboxes, item, domains, retry_delay, max_attempts, stats)
        idle_since = time.monotonic()
    return stats


def handle(
    mailboxes: Mailboxes,
    item: MailQueueItem,
    domains: frozenset[str],
    retry_delay: timedelta | int | float | str,
    max_attempts: int,
    stats: WorkerStats,
) -> None:
    """Deliver one dequeued mail and settle it as `run_worker` does, counting the outcome in `stats`.
    `domains` are normalised (`normalise_domains`); the caller that drives its own dequeues (the demo, on
    simulated time) gets exactly the worker's behaviour."""
    try:
        report = deliver(mailboxes, item.enqueue_id, item.mail, domains)
    except InvalidInput as error:
        reason = f"undeliverable: {error}"
        _settle(item, lambda: item.reject(reason))
        stats.dead_lettered += 1
        return
    except Exception as error:
        log.warning(
            "delivery of %s failed (attempt %d of %d)",
            item.enqueue_id,
            item.attempts,
            max_attempts,
            exc_info=True,
        )
        if item.attempts >= max_attempts:
            reason = f"gave up after {item.attempts} attempts: {type(error).__name__}: {error}"
            _settle(item, lambda: item.reject(reason))
            stats.dead_lettered += 1
        else:
            _settle(item, lambda: item.retry(retry_delay))
            stats.retried += 1
        return
    stats.appended += report.appended
    if report.unknown_recipients:
        _settle(item, lambda: item.reject(f"unknown recipients: {', '.join(report.unknown_recipients)}"))
        stats.dead_lettered += 1
    else:
        _settle(item, item.done)
        stats.delivered += 1


def _settle(item: MailQueueItem, settle: Callable[[], None]) -> None:
    # A failed acknowledgement loses nothing: the lease expires and the mail comes back, and delivering
    # it again is idempotent. So the worker logs it and goes on with the next mail rather than dying.
    try:
        settle()
    except Exception:
        log.exception("could not settle mail %s: its lease will expire and it comes back", item.enqueue_id)
