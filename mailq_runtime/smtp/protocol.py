"""One SMTP session: aiosmtpd's parser with the limits and replies a mail operator expects of Postfix.

aiosmtpd parses the commands (read by reader.SessionReader, which also reads DATA's message in blocks);
this subclass adds what it lacks: a command line that ends in a bare LF is refused and the connection
closed (521, as Postfix's `smtpd_forbid_bare_newline`), a NUL in a command gets 500, every 4xx/5xx reply
carries an enhanced status code (ENHANCEDSTATUSCODES is offered), an idle client gets 421 4.4.2 before the
connection closes (RFC 5321 4.5.3.2), and each session event is logged as Postfix logs it. aiosmtpd's own
log, which echoes every command line (AUTH's too), stays quiet.

This module is the one place tied to aiosmtpd's internals (pinned in pyproject.toml): the session's hooks
it overrides and the state a session takes from its server's template. tests/smtp/test_protocol.py holds
both against aiosmtpd's own (a templated session against one made by aiosmtpd's constructor, addresses
against aiosmtpd's `_getaddr`), so they fail when a new aiosmtpd changes them.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import re
from collections.abc import Callable
from typing import Any, cast

from aiosmtpd.smtp import SMTP, TLSSetupException

from ..metrics import SmtpMetrics
from .defaults import DATA_TERMINATION_TIMEOUT
from .handler import client_name
from .reader import BareLineFeed, NulInCommand, SessionReader

log = logging.getLogger("mailq_runtime.smtp")
# aiosmtpd logs each command line at INFO (an AUTH PLAIN's base64 credentials included) and a
# deprecation of its own at each login; the refusals are logged here, with their replies.
logging.getLogger("mail.log").setLevel(logging.ERROR)

# The enhanced status code of each reply aiosmtpd writes without one.
_ENHANCED = {
    "421": "4.7.0",
    "451": "4.3.0",
    "500": "5.5.2",
    "501": "5.5.4",
    "502": "5.5.1",
    "503": "5.5.1",
    "504": "5.5.4",
    "530": "5.7.0",
    "535": "5.7.8",
    "552": "5.3.4",
    "553": "5.1.3",
    "554": "5.7.0",
    "555": "5.5.4",
}
# An address as most clients write it, <local@domain> of dot-atoms of common characters, which aiosmtpd's
# parser (the email package's, a tenth of the event loop's time) would return as written.
_PLAIN_ADDRESS = re.compile(
    # The parser also takes the blanks after it (and a comment, which this leaves to the parser).
    r"<((?:[A-Za-z0-9_+=-]+\.)*[A-Za-z0-9_+=-]+@(?:[A-Za-z0-9-]+\.)*[A-Za-z0-9-]+)>[ \t]*+(?!\()"
)
_HAS_ENHANCED = re.compile(r"[245]\d\d[ -][245]\.\d{1,3}\.\d{1,3}( |$)")


class SessionTemplate:
    """What every session of one server shares, inspected once. aiosmtpd's constructor looks up the
    handler's hooks, its own commands and AUTH mechanisms with `inspect` at every connection (100-190 us,
    and most clients connect once per mail): a session takes the state of one session made by that
    constructor instead, its own commands bound to itself. Made on the server's running loop."""

    def __init__(
        self,
        handler: Any,
        sessions: set[SmtpSession],
        stopping: Callable[[], bool],
        metrics: SmtpMetrics,
        **options: Any,
    ) -> None:
        self.sessions = sessions
        self.stopping = stopping
        self.metrics = metrics
        self.loop = asyncio.get_running_loop()
        self.credentials_known = bool(options.get("authenticator"))
        prototype = SmtpSession.__new__(SmtpSession)
        SMTP.__init__(prototype, handler, loop=self.loop, **options)
        # What StreamReaderProtocol's constructor sets is each connection's own; the rest is aiosmtpd's.
        own = vars(asyncio.StreamReaderProtocol(asyncio.StreamReader(loop=self.loop), print, self.loop))
        self.state = {name: value for name, value in vars(prototype).items() if name not in own}
        self.commands = {name: method.__func__ for name, method in prototype._smtp_methods.items()}
        # A mechanism of the session's own (AUTH PLAIN, LOGIN) is bound to each session, a handler's is not.
        self.mechanisms = dict(prototype._auth_methods)


class SmtpSession(SMTP):
    """A client's session, made from its server's template; the template's `sessions` is the server's
    register of the live ones (for its limit and its shutdown), which the server adds it to and it leaves
    when its connection is lost; `stopping` tells whether the server is shutting down; `metrics` counts
    its replies and the bytes it receives."""

    local_part_limit = 64  # RFC 5321 4.5.3.1.1

    def __init__(self, template: SessionTemplate) -> None:
        # SMTP.__init__ is not called: its state is the template's (see SessionTemplate).
        reader = SessionReader(limit=self.line_length_limit, loop=template.loop)
        asyncio.StreamReaderProtocol.__init__(self, reader, self._cb_client_connected, template.loop)
        self.__dict__.update(template.state)
        self._smtp_methods = {name: function.__get__(self) for name, function in template.commands.items()}
        self._auth_methods = {
            name: mechanism._replace(method=mechanism.method.__func__.__get__(self))
            if mechanism.is_builtin
            else mechanism
            for name, mechanism in template.mechanisms.items()
        }
        # aiosmtpd keeps these limits on the class: each EHLO of any session would raise MAIL's for all.
        self.command_size_limits = collections.defaultdict(lambda: SMTP.command_size_limit)
        self.credentials_known = template.credentials_known
        self.sessions = template.sessions
        self.stopping = template.stopping
        self.metrics = template.metrics
        self.in_data = False
        self.mails = 0
        self.reply_lines: list[bytes] = []

    def _getaddr(self, arg: str) -> tuple[str | None, str | None]:
        # One MAIL and one RCPT a mail: a plain address is taken as written, any other parsed by aiosmtpd.
        plain = _PLAIN_ADDRESS.match(arg)
        if plain is None:
            return super()._getaddr(arg)
        written = plain.group(1)
        if self.local_part_limit and written.index("@") > self.local_part_limit:
            return None, None
        return written, arg[plain.end() :]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        first = self.transport is None  # STARTTLS makes the connection again, over TLS
        super().connection_made(transport)
        if first:
            log.info("connect from %s", client_name(self.session))

    def connection_lost(self, error: Exception | None) -> None:
        self.sessions.discard(self)
        log.info("disconnect from %s mails=%d", client_name(self.session), self.mails)
        super().connection_lost(error)

    def data_received(self, data: bytes) -> None:
        self.metrics.received.inc(len(data))
        if self.in_data:
            # A DATA block may take 3 minutes (RFC 5321 4.5.3.2.5): the clock runs from the last one.
            self._reset_timeout()
        super().data_received(data)

    def _timeout_cb(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(f"421 4.4.2 {self.hostname} Error: timeout exceeded\r\n".encode())
        log.info(
            "timeout after %s from %s", "DATA" if self.in_data else "a command", client_name(self.session)
        )
        super()._timeout_cb()

    async def _call_handler_hook(self, command: str, *arguments: Any) -> Any:
        if command == "DATA":
            # The mail is whole: its enqueue has the DATA termination's time (RFC 5321 4.5.3.2.6).
            self._reset_timeout(DATA_TERMINATION_TIMEOUT)
        status = await super()._call_handler_hook(command, *arguments)
        if command == "DATA" and isinstance(status, str) and status.startswith("250"):
            self.mails += 1
        return status

    async def smtp_DATA(self, arg: str) -> None:
        # aiosmtpd's, the message read in blocks (SessionReader.read_message) rather than line by line.
        if await self.check_helo_needed() or await self.check_auth_needed("DATA"):
            return
        assert self.envelope is not None
        if not self.envelope.rcpt_tos:
            await self.push("503 Error: need RCPT command")
            return
        if arg:
            await self.push("501 Syntax: DATA")
            return
        await self.push("354 End data with <CR><LF>.<CR><LF>")
        self.in_data = True
        try:
            await self._receive_message()
        finally:
            self.in_data = False
        if self.stopping():
            await self.push(f"421 4.3.2 {self.hostname} Service shutting down")
            self.close()

    async def _receive_message(self) -> None:
        assert self.envelope is not None
        try:
            message = await cast(SessionReader, self._reader).read_message(self.data_size_limit)
        except asyncio.CancelledError:
            # The connection was lost in the middle of DATA.
            self._writer.close()
            raise
        if isinstance(message, str):  # refused: nothing is kept
            await self.push(message)
            self._set_post_data_state()
            return
        self.envelope.content = self.envelope.original_content = message
        status = await self._call_handler_hook("DATA")
        self._set_post_data_state()
        await self.push(status)

    async def push(self, status: str | bytes) -> None:
        if isinstance(status, str) and status[:1] in ("4", "5"):
            if not _HAS_ENHANCED.match(status):
                code, _, text = status.partition(" ")
                enhanced = _ENHANCED.get(code, f"{code[0]}.0.0")
                status = f"{code} {enhanced} {text}".rstrip()
            log.info("NOQUEUE: reject: %s: %s; %s", client_name(self.session), status, _sender(self))
        self.metrics.reply(status)
        line = (
            status.encode("utf-8" if self.enable_SMTPUTF8 else "ascii") if isinstance(status, str) else status
        )
        if line[3:4] == b"-":
            # A line of a multi-line reply (EHLO's seven) goes out in one write with the reply's last line.
            self.reply_lines.append(line + b"\r\n")
            return
        if self.reply_lines:
            line = b"".join(self.reply_lines) + line
            self.reply_lines.clear()
        self._writer.write(line + b"\r\n")
        await self._writer.drain()

    async def handle_exception(self, error: Exception) -> str:
        if isinstance(error, BareLineFeed):
            self.loop.call_soon(self.close)
            return "521 5.5.2 Error: bare <LF> received"
        if isinstance(error, NulInCommand):
            return "500 5.5.2 Error: NUL character in command"
        if isinstance(error, TLSSetupException):
            log.info("TLS handshake failed from %s", client_name(self.session))
            return "454 4.7.0 TLS not available due to local problem"
        # A fault of the server, never the client's: a temporary reply, one log line, the session goes on.
        log.error("%s: internal error: %s: %s", client_name(self.session), type(error).__name__, error)
        return "451 4.3.0 Error: internal error"

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def say_goodbye(self) -> None:
        """A shutting-down server's word to a session not in DATA, which is then closed."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(f"421 4.3.2 {self.hostname} Service shutting down\r\n".encode())
        self.close()


def _sender(session: SmtpSession) -> str:
    envelope = session.envelope
    return f"from=<{'' if envelope is None or envelope.mail_from in (None, '<>') else envelope.mail_from}>"


class Refusal(asyncio.Protocol):
    """A connection over the session limit: 421 4.7.0 and closed, before any command is read."""

    def __init__(self, hostname: str, metrics: SmtpMetrics) -> None:
        self.hostname = hostname
        self.metrics = metrics

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream's transport; uvloop's does not derive from asyncio.Transport, so no isinstance check.
        transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        log.warning("reject: connect from unknown[%s]: too many connections", peer[0] if peer else "?")
        transport.write(f"421 4.7.0 {self.hostname} Error: too many connections\r\n".encode())
        self.metrics.reply("421")
        transport.close()
