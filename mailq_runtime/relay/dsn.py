"""The delivery status notification (RFC 3464) sent to a sender whose mail was bounced: a
multipart/report with a text for people, a message/delivery-status for programs, and the original
mail's headers (text/rfc822-headers, as Postfix sends by default)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import Message
from email.mime.base import MIMEBase
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from email.utils import format_datetime, make_msgid

from ..clock import MICROS_PER_SECOND
from ..model import Mail, creation_time, split_message
from ..queue import MailQueue

log = logging.getLogger("mailq_runtime.relay")


@dataclass(frozen=True)
class Failed:
    """One recipient that will not get the mail: `status` as RFC 3463 has it, `diagnostic` the remote
    server's reply (or what stood in for one), `relay` the server that gave it ("none": no server, as for
    a local user unknown or an operator's bounce)."""

    recipient: str
    status: str
    diagnostic: str
    relay: str


@dataclass(frozen=True)
class Notifications:
    """Where the notifications of a worker's bounces go: into `queue`, the queue the mails came from, sent
    as `hostname`'s mailer daemon. Remote delivery's bounces and local delivery's (an unknown user) alike."""

    queue: MailQueue
    hostname: str

    def notify(self, enqueue_id: str, mail: Mail, failed: Sequence[Failed]) -> None:
        """Enqueue the notification of `failed` to the mail's sender; none for a null sender, whose mail
        is itself a notification (RFC 5321 6.1: no loops of bounces)."""
        if not failed or mail.sender is None:
            return
        arrival = datetime.fromtimestamp((creation_time(enqueue_id) or 0) / MICROS_PER_SECOND, UTC)
        report = build_dsn(self.hostname, enqueue_id, mail.sender, mail.message, arrival, failed)
        notice = self.queue.enqueue(Mail((mail.sender,), report, sender=None))
        log.info("%s: sender non-delivery notification: %s", enqueue_id, notice)


def build_dsn(
    hostname: str, enqueue_id: str, sender: str, message: bytes, arrival: datetime, failed: Sequence[Failed]
) -> bytes:
    """The notification to `sender` that `message` (queued as `enqueue_id`, arrived at `arrival`) was
    not delivered to the `failed` recipients; `hostname` names the reporting MTA."""
    report = MIMEMultipart("report", report_type="delivery-status")
    report["From"] = f"MAILER-DAEMON@{hostname} (Mail Delivery System)"
    report["To"] = sender
    report["Subject"] = "Undelivered Mail Returned to Sender"
    report["Date"] = format_datetime(datetime.now(UTC))
    report["Message-ID"] = make_msgid(domain=hostname)
    report["Auto-Submitted"] = "auto-replied"
    report.attach(MIMEText(_explanation(hostname, failed), "plain"))
    report.attach(_delivery_status(hostname, enqueue_id, arrival, failed))
    headers = MIMEBase("text", "rfc822-headers")
    # The email package writes its own line ends: the original's CRLF would double them.
    headers.set_payload(split_message(message)[0].decode("utf-8", "replace").replace("\r\n", "\n"))
    report.attach(headers)
    return report.as_bytes()


def _explanation(hostname: str, failed: Sequence[Failed]) -> str:
    lines = [
        f"This is the mail system at host {hostname}.",
        "",
        "I'm sorry to have to inform you that your message could not",
        "be delivered to one or more recipients. It's attached below.",
        "",
    ]
    lines += [
        f"<{f.recipient}>: {f.diagnostic}"
        if f.relay == "none"
        else f"<{f.recipient}>: host {f.relay} said: {f.diagnostic}"
        for f in failed
    ]
    return "\n".join(lines) + "\n"


def _delivery_status(hostname: str, enqueue_id: str, arrival: datetime, failed: Sequence[Failed]) -> MIMEBase:
    per_message = Message()
    per_message["Reporting-MTA"] = f"dns; {hostname}"
    per_message["X-Mailq-Enqueue-Id"] = enqueue_id
    per_message["Arrival-Date"] = format_datetime(arrival)
    blocks = [per_message]
    for failure in failed:
        block = Message()
        block["Final-Recipient"] = f"rfc822; {failure.recipient}"
        block["Original-Recipient"] = f"rfc822; {failure.recipient}"
        block["Action"] = "failed"
        block["Status"] = failure.status
        if failure.relay != "none":
            block["Remote-MTA"] = f"dns; {failure.relay.partition('[')[0]}"
        block["Diagnostic-Code"] = f"smtp; {failure.diagnostic}"
        blocks.append(block)
    status = MIMEBase("message", "delivery-status")
    status.set_payload(blocks)
    return status
