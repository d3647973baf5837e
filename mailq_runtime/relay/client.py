"""The SMTP client of remote delivery: one transaction to one destination, with a reply per recipient.

The standard library's smtplib rather than aiosmtplib: the worker that calls it is a blocking thread
(the store and the broker are blocking calls), so an event loop would add a thread hop and a dependency
for nothing; smtplib speaks EHLO, STARTTLS, SIZE, 8BITMIME and SMTPUTF8, and keeps the reply of every
command, which is what per-recipient results need. Neither library pipelines commands: this client does
(RFC 2920) on smtplib's send and getreply, so a mail costs two round trips (the envelope, then the
content) instead of one a command, which is most of a mail's time on a near server."""

from __future__ import annotations

import re
import smtplib
import ssl
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .connections import Connections, Session, opened
from .limits import SLOT_DELAY, Destination, Throttled
from .routes import Target

# Seconds for the connection and each reply (RFC 5321 4.5.3.2 allows minutes; a worker holds one
# mail's lease meanwhile, so a dead server is given up sooner).
TIMEOUT = 60.0
_STATUS = re.compile(r"^([245])\.(\d{1,3})\.(\d{1,3})\b")


@dataclass(frozen=True)
class Reply:
    """What became of one recipient: the SMTP `code` (0 when no server answered), the RFC 3463 `status`,
    the server's `text`, and the `relay` that answered ("none" if no one did)."""

    code: int
    status: str
    text: str
    relay: str

    @property
    def delivered(self) -> bool:
        return 200 <= self.code < 300

    @property
    def permanent(self) -> bool:
        return 500 <= self.code < 600

    @classmethod
    def of(cls, code: int, message: bytes | str, relay: str) -> Reply:
        text = message.decode("utf-8", "replace") if isinstance(message, bytes) else message
        text = " ".join(text.split())
        found = _STATUS.match(text)
        if found and found.group(1) == str(code)[0]:
            status = found.group(0)
        else:
            status = {2: "2.0.0", 4: "4.0.0", 5: "5.0.0"}.get(code // 100, "4.4.1")
        return cls(code, status, f"{code} {text}" if code else text, relay)


def send(
    targets: Sequence[Target],
    destination: Destination,
    sender: str | None,
    recipients: Sequence[str],
    message: bytes,
    helo: str,
    connections: Connections,
) -> dict[str, Reply] | Throttled:
    """Send `message` to `recipients` through the first target that answers; a reply per recipient.
    A target that cannot be reached, or answers the connection with a failure, passes to the next; if
    none will talk, every recipient gets a passing failure (4.4.1) naming the last error. A session
    `connections` keeps to a target is used first (a new one if it died while idle), and the session is
    kept there after a clean transaction. A new session needs a slot of the destination's connection
    limit and the transaction a mail of its rate: Throttled, and nothing sent, when either is not had in
    time."""
    failure = Reply(0, "4.4.1", "no mail exchanger to connect to", "none")
    for target in targets:
        kept = connections.take(destination.name, target)
        if kept is not None:
            try:
                return _through(connections, destination, kept, sender, recipients, message, True)
            except _Stale:
                connections.drop_session(kept)  # it never answered: nothing of this mail reached it
        slot = connections.slot(destination.name, destination.limit)
        if slot is None:
            return Throttled(SLOT_DELAY, "connections", f"{destination.limit.concurrency} connections open")
        try:
            client = smtplib.SMTP(target.address, target.port, local_hostname=helo, timeout=TIMEOUT)
        except (OSError, smtplib.SMTPException) as error:
            connections.free(slot)
            text = f"connect to {target}: {error or type(error).__name__}"
            failure = Reply(0, "4.4.1", text, str(target))
            continue
        except BaseException:
            connections.free(slot)
            raise
        session = opened(client, target, slot)
        return _through(connections, destination, session, sender, recipients, message, False)
    return dict.fromkeys(recipients, failure)


class _Stale(Exception):
    """A kept session failed its RSET: the server closed it while it was idle."""


def _through(
    connections: Connections,
    destination: Destination,
    session: Session,
    sender: str | None,
    recipients: Sequence[str],
    message: bytes,
    reused: bool,
) -> dict[str, Reply] | Throttled:
    """The transaction on `session`, once the destination's rate allows a mail and while the session
    holds its slot; the session is kept after a clean transaction (or a throttled one), closed
    otherwise."""
    try:
        throttled = destination.send()
        if throttled is None and not connections.holds(session):
            # Its slot was lost while the rate was waited for: no new transaction (limits.py); kept, the
            # session is closed.
            throttled = Throttled(SLOT_DELAY, "connections", "the session's slot lease ran out")
        if throttled is None:
            replies, clean = _transaction(session.client, session.target, sender, recipients, message, reused)
    except _Stale:
        raise
    except BaseException:
        # The store away while counting the rate: the session and its slot are not left open.
        connections.close_session(session)
        raise
    if throttled is not None:
        connections.keep(destination.name, session)
        return throttled
    if clean:
        connections.keep(destination.name, session)
    else:
        connections.close_session(session)
    return replies


def _transaction(
    client: smtplib.SMTP,
    target: Target,
    sender: str | None,
    recipients: Sequence[str],
    message: bytes,
    reused: bool,
) -> tuple[dict[str, Reply], bool]:
    """The replies, and whether the session may carry another mail (no 421, no failure of the session).
    A `reused` session, which carried a mail before, starts with RSET (RFC 5321 4.1.1.5): the envelope
    it may have left open is cleared, and if it fails, _Stale is raised."""
    relay = str(target)
    replies: dict[str, Reply] = {}
    try:
        if not reused:
            _greet(client)
        options = _mail_options(client, sender, recipients, message)
        if options is None:
            refused = f"5.6.7 SMTPUTF8 is required, but was not offered by host {relay}"
            return dict.fromkeys(recipients, Reply.of(553, refused, relay)), True
        commands = [f"MAIL FROM:<{sender or ''}>{options}", *(f"RCPT TO:<{r}>" for r in recipients), "DATA"]
        answers = _exchange(client, ["RSET", *commands] if reused else commands)
        if reused:
            _reset(answers)
        mail = next(answers)
        for recipient in recipients:
            replies[recipient] = Reply.of(*next(answers), relay)
        if mail[0] != 250:
            replies = dict.fromkeys(recipients, Reply.of(*mail, relay))
        accepted = [r for r in recipients if replies[r].delivered]
        code, text = next(answers)  # DATA's
        if code == 354:
            # An empty message ends a DATA the server should have refused (no recipient was accepted).
            client.send(_dot_stuffed(message if accepted else b""))
            code, text = client.getreply()
        for recipient in accepted:
            replies[recipient] = Reply.of(code, text, relay)
    except smtplib.SMTPResponseException as error:
        # A failure of the session (a refused EHLO or STARTTLS): every open recipient shares it.
        reply = Reply.of(error.smtp_code, error.smtp_error, relay)
        return _open_ones(replies, recipients, reply), False
    except (OSError, smtplib.SMTPException) as error:
        reply = Reply(0, "4.4.2", f"lost connection with {relay}: {error or type(error).__name__}", relay)
        return _open_ones(replies, recipients, reply), False
    # 421: the server closes the session.
    return replies, code != 421 and all(reply.code != 421 for reply in replies.values())


def _mail_options(
    client: smtplib.SMTP, sender: str | None, recipients: Sequence[str], message: bytes
) -> str | None:
    """MAIL FROM's parameters: SIZE, BODY=8BITMIME for 8-bit content (RFC 6152) and SMTPUTF8 for addresses
    beyond ASCII (RFC 6531). None when the addresses need SMTPUTF8 and the server does not offer it: the
    mail cannot go there as it is, and bounces (5.6.7), as Postfix's does. 8-bit content goes as it is to
    a server that does not announce 8BITMIME, as Exim sends it: rewriting MIME parts to 7 bits is a
    conversion of its own, and every server met in practice takes 8-bit mail."""
    options = f" SIZE={len(message)}" if client.has_extn("size") else ""
    if not message.isascii() and client.has_extn("8bitmime"):
        options += " BODY=8BITMIME"
    if not all(address.isascii() for address in (sender or "", *recipients)):
        if not client.has_extn("smtputf8"):
            return None
        options += " SMTPUTF8"
        client.command_encoding = "utf-8"  # smtplib sends commands as ASCII unless told
    return options


def _greet(client: smtplib.SMTP) -> None:
    client.ehlo_or_helo_if_needed()
    if client.has_extn("starttls") and not isinstance(client.sock, ssl.SSLSocket):
        # Opportunistic TLS, as Postfix's `smtp_tls_security_level = may`: an MX's certificate is
        # not checked, since a man in the middle could strip STARTTLS from the EHLO reply anyway.
        client.starttls(context=_opportunistic())
        client.ehlo()


def _exchange(client: smtplib.SMTP, commands: list[str]) -> Iterator[tuple[int, bytes]]:
    """The reply to each command, in order. With PIPELINING (RFC 2920) the commands go in one write
    and their replies are read after: one round trip for the envelope instead of one a command."""
    if client.has_extn("pipelining"):
        client.send("".join(f"{command}\r\n" for command in commands))
        for _ in commands:
            yield client.getreply()
    else:
        for command in commands:
            client.send(f"{command}\r\n")
            yield client.getreply()


def _reset(answers: Iterator[tuple[int, bytes]]) -> None:
    try:
        code, _ = next(answers)
    except (OSError, smtplib.SMTPException) as error:
        raise _Stale from error
    if code != 250:
        raise _Stale


def _dot_stuffed(message: bytes) -> bytes:
    """The content as DATA sends it (RFC 5321 4.5.2): a leading dot doubled, then the ending line."""
    stuffed = message.replace(b"\n.", b"\n..")  # a fifth of the regex's time on a 10 KiB mail
    if stuffed.startswith(b"."):
        stuffed = b"." + stuffed
    if stuffed and not stuffed.endswith(b"\r\n"):
        stuffed += b"\r\n"
    return stuffed + b".\r\n"


def _open_ones(replies: dict[str, Reply], recipients: Sequence[str], reply: Reply) -> dict[str, Reply]:
    """`reply` for every recipient without a final answer: those not yet named, and those accepted at
    RCPT whose DATA had no answer (the message may or may not have arrived: it is tried again)."""
    return {r: replies[r] if r in replies and not replies[r].delivered else reply for r in recipients}


def _opportunistic() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context
