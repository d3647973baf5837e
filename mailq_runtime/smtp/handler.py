"""The hooks of `mailq smtp`'s sessions (aiosmtpd's handle_* API): which recipients a client may name, and
a mail answered 250 only once `enqueue` returned.

The enqueue and the mailbox look-ups are blocking calls on the store: they run on a few threads (calls.py),
so that the other sessions keep flowing while one waits for its sync. A backend that fails (BACKEND_FAILURES)
gets 451 4.3.0: the client keeps the mail and tries again later, never a 5xx for the server's own fault.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import format_datetime

from aiosmtpd.smtp import SMTP, Envelope, Session

from ..errors import BACKEND_FAILURES, InvalidInput
from ..mailbox import unknown_user_reply
from ..mailboxes import Mailboxes
from ..model import EnqueueId, Mail, MailAddress
from ..queue import MailQueue
from .access import Network, in_networks
from .calls import BlockingCalls

log = logging.getLogger("mailq_runtime.smtp")

BACKEND_AWAY = "451 4.3.0 Error: queue file write error"
# The reserve the Received header may take of the queue's maximum message size: SIZE advertises the rest.
RECEIVED_RESERVE = 1024
# Characters of a client's HELO name kept in the Received header; the others show as '?'.
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9.:_\[\]-]")


@dataclass(frozen=True)
class Policy:
    """What a session lets a client do: `hostname` the server's name in replies and trace headers."""

    hostname: str
    local_domains: frozenset[str]
    networks: tuple[Network, ...]
    max_recipients: int


def client_address(session: Session) -> str:
    peer = session.peer
    return str(peer[0]) if isinstance(peer, tuple) else str(peer)


def client_name(session: Session) -> str:
    """The client as Postfix's log names it: no reverse look-up is made, so `unknown[ip]`."""
    return f"unknown[{client_address(session)}]"


class MailHandler:
    """The hooks of every session of one server: one queue, one runtime's mailboxes, the threads
    of their blocking calls."""

    def __init__(self, queue: MailQueue, mailboxes: Mailboxes, policy: Policy, calls: BlockingCalls) -> None:
        self.queue = queue
        self.mailboxes = mailboxes
        self.policy = policy
        self._blocking = calls.run
        self.accepted = 0

    async def handle_EHLO(
        self, server: SMTP, session: Session, envelope: Envelope, hostname: str, responses: list[str]
    ) -> list[str]:
        session.host_name = hostname
        *extensions, last = responses
        # aiosmtpd offers AUTH over TLS whether or not there are credentials to check: only with some.
        if not getattr(server, "credentials_known", False):
            extensions = [line for line in extensions if not line.startswith("250-AUTH")]
        return [*extensions, "250-PIPELINING", "250-ENHANCEDSTATUSCODES", last]

    async def handle_MAIL(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        if address != "<>":
            try:
                MailAddress(address)
            except InvalidInput:
                return "501 5.1.7 Bad sender address syntax"
        envelope.mail_from = address
        envelope.mail_options.extend(options)
        return "250 2.1.0 Ok"

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        if len(envelope.rcpt_tos) >= self.policy.max_recipients:
            return "452 4.5.3 Error: too many recipients"
        try:
            recipient = MailAddress(address)
        except InvalidInput:
            return "501 5.1.3 Bad recipient address syntax"
        if recipient.domain in self.policy.local_domains:
            try:
                known = await self._blocking(self.mailboxes.has_user, recipient)
            except BACKEND_FAILURES as error:
                log.warning("%s: mailbox look-up failed: %s", client_name(session), error)
                return BACKEND_AWAY
            if not known:
                return unknown_user_reply(recipient)
        elif not (session.authenticated or in_networks(client_address(session), self.policy.networks)):
            return f"554 5.7.1 <{recipient}>: Relay access denied"
        envelope.rcpt_tos.append(recipient)
        envelope.rcpt_options.extend(options)
        return "250 2.1.5 Ok"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        content = envelope.original_content or b""
        name = f"smtp-{os.urandom(8).hex()}"
        message = self._received(session, envelope, name) + content
        if len(message) > self.queue.max_message_size:
            return "552 5.3.4 Error: message file too big"
        sender = None if envelope.mail_from == "<>" else envelope.mail_from
        mail = Mail(
            recipients=tuple(envelope.rcpt_tos),
            message=message,
            sender=sender,
            name=name,
            remote_host=session.host_name or "unknown",
            remote_addr=client_address(session),
        )
        try:
            enqueue_id = await self._blocking(self._enqueue, mail, client_name(session))
        except BACKEND_FAILURES as error:
            log.warning("%s: %s: enqueue failed, 451 4.3.0: %s", client_name(session), name, error)
            return BACKEND_AWAY
        except InvalidInput as error:
            log.warning("%s: %s: message refused: %s", client_name(session), name, error)
            return "554 5.6.0 Error: message content rejected"
        self.accepted += 1
        return f"250 2.0.0 Ok: queued as {enqueue_id}"

    def _enqueue(self, mail: Mail, client: str) -> EnqueueId:
        """On a calls thread: logged here, so that a mail made durable for a client gone meanwhile is
        logged too."""
        enqueue_id = self.queue.enqueue(mail)
        log.info(
            "%s: client=%s, name=%s, from=<%s>, size=%d, nrcpt=%d (queue %s)",
            enqueue_id,
            client,
            mail.name,
            mail.sender or "",
            len(mail.message),
            len(mail.recipients),
            self.queue.name,
        )
        return enqueue_id

    def _received(self, session: Session, envelope: Envelope, name: str) -> bytes:
        """The trace header of RFC 5321 4.4, prepended to the message."""
        helo = _UNSAFE_NAME.sub("?", session.host_name or "unknown")[:255]
        protocol = "ESMTP" if session.extended_smtp else "SMTP"
        protocol += "S" if session.ssl is not None else ""
        protocol += "A" if session.authenticated else ""
        recipient = f"\r\n\tfor <{envelope.rcpt_tos[0]}>" if len(envelope.rcpt_tos) == 1 else ""
        when = format_datetime(datetime.now(UTC))
        header = (
            f"Received: from {helo} ({client_name(session)})\r\n\tby {self.policy.hostname} (mailq) "
            f"with {protocol} id {name}{recipient}; {when}\r\n"
        )
        return header.encode("utf-8", errors="replace")
