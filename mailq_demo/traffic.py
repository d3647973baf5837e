"""The traffic of `mailq demo`: two hours of generated mail through the queue of a fresh deployment.

The steps are plain functions on one runtime (`generate_traffic`, `deliver`, `remove_by_sender`);
`simulate` runs them on a runtime from `open_demo`, on any deployment. The demo, `mailq_cli.demo`, goes on
from there with the mailboxes (`mailq_demo.mailboxes`) and the maintenance pipeline. Time is simulated
so that the traffic spreads over many slices in a few seconds: that is what lets the demo show
browse_start moving and record 32's clean-up dropping the rows of finished slices.
"""

from __future__ import annotations

import base64
import os
import random
import shutil
import socket
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, replace
from email.utils import format_datetime
from pathlib import Path
from typing import Any

from mailq_runtime.clock import MICROS_PER_SECOND, system_clock, to_datetime
from mailq_runtime.config import QueueViewConfiguration
from mailq_runtime.deployments import data_dir_holds_store
from mailq_runtime.errors import InvalidInput, StoreUnusable, shown
from mailq_runtime.mailbox import INBOX
from mailq_runtime.mailboxes import Mailboxes
from mailq_runtime.model import Mail, normalise_domains
from mailq_runtime.queue import MailQueue
from mailq_runtime.relay.dsn import Notifications
from mailq_runtime.runtime import Runtime
from mailq_runtime.settings import Settings
from mailq_runtime.worker import WorkerStats, handle

QUEUE = "outbound"
SPAN = 2 * 3600 * MICROS_PER_SECOND
# Delivery runs over simulated time too, so that short delays and retries fall due while it runs.
DELIVERY_SPAN = 1800 * MICROS_PER_SECOND
# Small slices and a fast pace, so that two simulated hours show browse_start advancing several times.
CONFIGURATION = QueueViewConfiguration(
    slice_window=600 * MICROS_PER_SECOND, bucket_count=4, update_browse_start_pace=50
)
DELIVERED_SHARE = 0.8
RETRY_DELAY = "5m"
MAX_ATTEMPTS = 5

SPAM_SENDER = "promo@deals.example"
NEWSLETTER_SENDER = "news@shop.example"
UNKNOWN_USER = "nobody@invalid.example"  # not a local domain: its mails are rejected to the dead letters
GREYLISTING = "ops@slow.example"  # its first delivery attempt fails ('try again later'): the mail is retried
PEOPLE = [
    ("Alice Martin", "alice@example.com"),
    ("Bob Chen", "bob@example.org"),
    ("Carol Diaz", "carol@mail.example.net"),
    ("Dmitri Ivanov", "dmitri@example.com"),
    ("Erin O'Neil", "erin@corp.example"),
    ("Farah Haddad", "farah@corp.example"),
]
RECIPIENTS = [
    "gus@example.org",
    "hana@example.net",
    "ivan@corp.example",
    "jade@mail.example.net",
    "kofi@example.com",
    "lena@example.org",
    "mo@example.net",
    "nina@corp.example",
    "oscar@example.com",
    "pia@mail.example.net",
    "quinn@example.org",
    "ravi@example.net",
    "sara@corp.example",
    "tom@example.com",
    "uma@example.org",
]
# The users whose INBOXes the queue delivers to; their domains are the local ones.
LOCAL_USERS = (*RECIPIENTS, GREYLISTING)
LOCAL_DOMAINS = normalise_domains({user.rsplit("@", 1)[1] for user in LOCAL_USERS})
WORDS = (
    "meeting report invoice schedule quarter budget draft review release server deploy customer order "
    "shipment contract lunch agenda notes update figures minutes proposal travel ticket question answer "
    "thanks please attached below tomorrow friday monday week month plan team project status"
).split()

Advance = Callable[[int], None]
Progress = Callable[[str, int], AbstractContextManager[Advance]]


class SimulatedClock:
    """Demo time, moved forward by the steps. It starts SPAN + DELIVERY_SPAN before the real time and
    ends about at it, so that `mailq` commands run afterwards on the real clock find a consistent queue."""

    def __init__(self, start: int) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now


def fresh_data_dir(path: Path) -> None:
    """Empty `path`, refusing to when it is not a directory of the running user's, or is not empty and
    does not look like a mailq data dir. The directory itself stays: its parent need not be writable."""
    holds_store = data_dir_holds_store(path)
    children = list(path.iterdir()) if path.is_dir() else []
    if children and not holds_store:
        raise InvalidInput(
            f"refusing to wipe {shown(str(path))}: it is not a mailq data dir (no mailq store)"
        )
    for child in children:
        try:
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        except OSError as error:
            raise StoreUnusable(f"cannot wipe demo data dir {path}: {error.strerror} ({child})") from None


# Messages ---------------------------------------------------------------------------------------------------


def _sentence(rng: random.Random) -> str:
    words = rng.choices(WORDS, k=rng.randint(6, 14))
    return " ".join(words).capitalize() + "."


def _paragraph(rng: random.Random) -> str:
    return " ".join(_sentence(rng) for _ in range(rng.randint(1, 4)))


def _headers(sender: str, recipients: list[str], subject: str, moment: int, extra: str = "") -> str:
    domain = sender.rsplit("@", 1)[1] if "@" in sender else "mx.example.net"
    return (
        f"From: {sender}\r\n"
        f"To: {', '.join(recipients)}\r\n"
        f"Subject: {subject}\r\n"
        f"Date: {format_datetime(to_datetime(moment))}\r\n"
        f"Message-ID: <{os.urandom(12).hex()}@{domain}>\r\n"
        "MIME-Version: 1.0\r\n"
        f"{extra}"
    )


def personal_message(
    rng: random.Random, sender: tuple[str, str], recipients: list[str], moment: int
) -> bytes:
    """A person's mail: a few paragraphs, one in ten with an attachment (base64, so lines of 76)."""
    name, address = sender
    text = "\r\n\r\n".join(_paragraph(rng) for _ in range(rng.randint(1, 5)))
    subject = " ".join(rng.choices(WORDS, k=3)).capitalize()
    if rng.random() >= 0.1:
        headers = _headers(
            f"{name} <{address}>",
            recipients,
            subject,
            moment,
            "Content-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n",
        )
        return f"{headers}\r\n{text}\r\n".encode()
    boundary = f"=_{os.urandom(8).hex()}"
    attachment = base64.encodebytes(os.urandom(rng.randint(2_000, 20_000))).decode().replace("\n", "\r\n")
    headers = _headers(
        f"{name} <{address}>",
        recipients,
        subject,
        moment,
        f'Content-Type: multipart/mixed; boundary="{boundary}"\r\n',
    )
    return (
        f"{headers}\r\n--{boundary}\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{text}\r\n"
        f"--{boundary}\r\nContent-Type: application/pdf\r\n"
        'Content-Disposition: attachment; filename="report.pdf"\r\n'
        f"Content-Transfer-Encoding: base64\r\n\r\n{attachment}--{boundary}--\r\n"
    ).encode()


# The same body for every subscriber: the deduplicating blob store keeps it once per generation.
_NEWSLETTER_BODY = (
    "This week at the shop: new arrivals, a spring sale and free shipping over 50 EUR.\r\n\r\n"
    + "\r\n".join(f"* Item {n}: {' '.join(WORDS[n:n + 5])}" for n in range(20))
    + "\r\n\r\nTo unsubscribe, reply with 'unsubscribe'.\r\n"
)


def newsletter_message(recipient: str, moment: int) -> bytes:
    headers = _headers(
        f"Shop News <{NEWSLETTER_SENDER}>",
        [recipient],
        "This week at the shop",
        moment,
        f"Content-Type: text/plain; charset=utf-8\r\nList-Unsubscribe: <mailto:{NEWSLETTER_SENDER}>\r\n",
    )
    return f"{headers}\r\n{_NEWSLETTER_BODY}".encode()


def spam_message(recipient: str, moment: int) -> bytes:
    headers = _headers(
        f"Deals <{SPAM_SENDER}>",
        [recipient],
        "You have WON a prize!!!",
        moment,
        "Content-Type: text/plain; charset=utf-8\r\n",
    )
    return f"{headers}\r\nClaim your prize now: http://deals.example/{os.urandom(6).hex()}\r\n".encode()


def bounce_message(rng: random.Random, recipient: str, moment: int) -> bytes:
    """A delivery status notification, sent with the null sender (MAIL FROM:<>)."""
    boundary = f"=_{os.urandom(8).hex()}"
    failed = f"{rng.choice(WORDS)}@unreachable.example"
    headers = _headers(
        "Mail Delivery System <MAILER-DAEMON@mx.example.net>",
        [recipient],
        "Undelivered Mail Returned to Sender",
        moment,
        f'Content-Type: multipart/report; report-type=delivery-status; boundary="{boundary}"\r\n',
    )
    return (
        f"{headers}\r\n--{boundary}\r\nContent-Type: text/plain\r\n\r\n"
        f"Your message to <{failed}> could not be delivered: host unreachable.\r\n"
        f"--{boundary}\r\nContent-Type: message/delivery-status\r\n\r\n"
        f"Final-Recipient: rfc822; {failed}\r\nAction: failed\r\nStatus: 5.4.4\r\n--{boundary}--\r\n"
    ).encode()


# Steps ------------------------------------------------------------------------------------------------------


def generate_traffic(
    queue: MailQueue, clock: SimulatedClock, mails: int, rng: random.Random, progress: Progress
) -> dict[str, Any]:
    """Enqueue `mails` mails spread evenly over SPAN of simulated time, moving `clock` forward.

    The mix: people's mails (some with several recipients, some delayed like retries), a newsletter,
    bounces with the null sender, and a spam run in the last fifth of the span, sent at low priority.
    """
    started = time.perf_counter()
    step = SPAN // mails
    start = clock.now
    senders: Counter[str] = Counter()
    delayed = size = 0
    with progress("enqueue", mails) as advance:
        for index in range(mails):
            clock.now = start + index * step + rng.randrange(step)
            late = index >= 0.8 * mails
            delay = priority = None
            recipient = rng.choice(RECIPIENTS)
            roll = rng.random()
            if late and rng.random() < 0.4:
                mail = Mail(
                    recipients=(recipient,), sender=SPAM_SENDER, message=spam_message(recipient, clock.now)
                )
                priority = 2
            elif roll < 0.15:
                mail = Mail(
                    recipients=(recipient,),
                    sender=NEWSLETTER_SENDER,
                    message=newsletter_message(recipient, clock.now),
                )
            elif roll < 0.2:
                mail = Mail(
                    recipients=(recipient,), sender=None, message=bounce_message(rng, recipient, clock.now)
                )
            else:
                person = rng.choice(PEOPLE)
                recipients = rng.sample(RECIPIENTS, k=rng.choice((1, 1, 1, 2, 3)))
                special = rng.random()
                if special < 0.01:
                    recipients = [UNKNOWN_USER]
                elif special < 0.03:
                    recipients.append(GREYLISTING)
                mail = Mail(
                    recipients=tuple(recipients),
                    sender=person[1],
                    message=personal_message(rng, person, recipients, clock.now),
                )
                if rng.random() < 0.12:
                    # Mostly short waits; late in the span some long ones, still pending at the end.
                    long_wait = late and rng.random() < 0.5
                    delay = f"{rng.randint(1, 3)}h" if long_wait else f"{rng.randint(5, 45)}m"
            queue.enqueue(mail, delay=delay, priority=priority)
            senders[mail.sender or "<>"] += 1
            delayed += delay is not None
            size += len(mail.message)
            advance(1)
    clock.now = start + SPAN
    return {
        "enqueued": mails,
        "delayed": delayed,
        "bytes": size,
        "senders": dict(senders.most_common()),
        "simulated_span_hours": SPAN // (3600 * MICROS_PER_SECOND),
        "seconds": round(time.perf_counter() - started, 2),
    }


def deliver(
    queue: MailQueue,
    mailboxes: Mailboxes,
    clock: SimulatedClock,
    count: int,
    progress: Progress,
) -> dict[str, Any]:
    """Dequeue up to `count` mails over DELIVERY_SPAN of simulated time and hand each to the worker's
    delivery (`worker.handle`): a copy in the INBOX of every local recipient, then `done()`; a mail with
    a recipient outside LOCAL_DOMAINS goes to the dead letters. The greylisted mails fail their first
    attempt and are retried after RETRY_DELAY. The low-priority spam waits behind everything else, so most
    of it is still queued."""
    started = time.perf_counter()
    step = DELIVERY_SPAN // count
    stats = WorkerStats()
    notifications = Notifications(queue, socket.getfqdn())
    with progress("deliver", count) as advance:
        for _ in range(count):
            clock.now += step
            item = queue.dequeue(timeout=0)
            advance(1)
            if item is None:
                continue  # nothing due at this moment; retries and delays fall due as the clock moves
            if GREYLISTING in item.mail.recipients and item.attempts == 1:
                item.retry(delay=RETRY_DELAY)
                stats.retried += 1
            else:
                handle(
                    queue, mailboxes, [item], LOCAL_DOMAINS, RETRY_DELAY, MAX_ATTEMPTS, stats, notifications
                )
    return {
        "delivered": stats.delivered,
        "retried": stats.retried,
        "rejected": stats.dead_lettered,
        "appended": stats.appended,
        "seconds": round(time.perf_counter() - started, 2),
    }


def remove_by_sender(queue: MailQueue, sender: str) -> dict[str, Any]:
    """The operator's answer to the spam run: what `mailq remove QUEUE --sender ADDR` does."""
    before = queue.size()
    removed = queue.remove(sender=sender)
    return {"sender": sender, "removed": removed, "initial_count": before, "remaining_count": queue.size()}


def check_size(mails: int) -> None:
    if mails < 10:
        raise InvalidInput(f"invalid demo size {mails}: at least 10 mails")


def open_demo(
    settings: Settings, configuration: QueueViewConfiguration, later: int
) -> tuple[Runtime, SimulatedClock]:
    """Open a runtime that makes the deployment of `settings` with the demo's `configuration`, on a clock
    the steps move. The clock starts so that SPAN + DELIVERY_SPAN + `later` (microseconds the caller's
    later steps move it on) end about at the real time."""
    clock = SimulatedClock(system_clock() - SPAN - DELIVERY_SPAN - later)
    settings = replace(settings, view_configuration=asdict(configuration))
    return Runtime(settings, clock, create=True), clock


def describe_configuration(configuration: QueueViewConfiguration) -> dict[str, int]:
    return {
        "slice_window_seconds": configuration.slice_window // MICROS_PER_SECOND,
        "bucket_count": configuration.bucket_count,
        "update_browse_start_pace": configuration.update_browse_start_pace,
    }


def simulate(runtime: Runtime, clock: SimulatedClock, mails: int, progress: Progress) -> dict[str, Any]:
    """The traffic: `mails` generated mails enqueued, most delivered to the local INBOXes, the spam run
    removed by the operator. Returns the figures of each step."""
    for user in LOCAL_USERS:  # as `mailq users add` makes them: the local users are those with a mailbox
        runtime.mailboxes.create(user, INBOX)
    queue = runtime.queue(QUEUE)
    traffic = generate_traffic(queue, clock, mails, random.Random(), progress)
    delivery = deliver(queue, runtime.mailboxes, clock, round(mails * DELIVERED_SHARE), progress)
    removal = remove_by_sender(queue, SPAM_SENDER)
    return {"traffic": traffic, "delivery": delivery, "removal": removal}
