"""`mailq smtp`'s listener: sessions up to a limit, the threads of their blocking store calls, and a
shutdown that stops accepting, lets the sessions in DATA finish (bounded), then closes the rest."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import uvloop

from ..errors import InvalidInput
from ..metrics import SmtpMetrics
from ..runtime import Runtime
from .access import Authenticator
from .calls import BlockingCalls
from .defaults import COMMAND_TIMEOUT
from .handler import RECEIVED_RESERVE, MailHandler, Policy
from .protocol import Refusal, SessionTemplate, SmtpSession

log = logging.getLogger("mailq_runtime.smtp")

Address = tuple[str, int]
T = TypeVar("T")


@dataclass(frozen=True)
class ServerOptions:
    """How the server runs; `drain` bounds the wait for sessions in DATA at shutdown, in seconds."""

    policy: Policy
    queue: str = "spool"
    tls: ssl.SSLContext | None = None
    credentials: Mapping[str, bytes] = field(default_factory=dict)
    max_sessions: int = 100
    timeout: float = COMMAND_TIMEOUT
    drain: float = 30.0
    threads: int = 8
    reuse_port: bool = False


def default_hostname() -> str:
    return socket.getfqdn()


def run(main: Awaitable[T]) -> T:
    """Run the server's coroutine on uvloop (libuv's loop): the session's work is mostly the event
    loop's, accepting, reading and writing, which it does in C at about half the stdlib loop's cost."""
    return uvloop.run(main)


class SmtpServer:
    """The ESMTP server of one runtime's queue (created by the first mail accepted into it)."""

    def __init__(self, runtime: Runtime, options: ServerOptions) -> None:
        self.options = options
        self.calls = BlockingCalls(options.threads, "mailq-smtp")
        queue = runtime.queue(options.queue)
        self.handler = MailHandler(queue, runtime.mailboxes, options.policy, self.calls)
        # The SIZE offered: the queue's limit less the room of the Received header the server adds.
        self.size_limit = max(queue.max_message_size - RECEIVED_RESERVE, 1)
        self.sessions: set[SmtpSession] = set()
        self.stopping = False
        self.sessions_served = 0
        # Named by the address bound, so set by `serve` before any session, and the sessions' template.
        self.metrics: SmtpMetrics
        self.template: SessionTemplate

    def _protocol(self) -> asyncio.Protocol:
        hostname = self.options.policy.hostname
        self.metrics.sessions.inc()
        if self.stopping or len(self.sessions) >= self.options.max_sessions:
            return Refusal(hostname, self.metrics)
        session = SmtpSession(self.template)
        # Counted from now, not from its connection_made: the accept loop may make several at once.
        self.sessions.add(session)
        self.sessions_served += 1
        return session

    def _session_template(self) -> SessionTemplate:
        credentials = self.options.credentials
        return SessionTemplate(
            self.handler,
            self.sessions,
            lambda: self.stopping,
            self.metrics,
            timeout=self.options.timeout,
            hostname=self.options.policy.hostname,
            ident="mailq ESMTP",
            data_size_limit=self.size_limit,
            enable_SMTPUTF8=True,
            tls_context=self.options.tls,
            auth_require_tls=True,
            authenticator=Authenticator(credentials) if credentials else None,
        )

    async def serve(self, address: Address, stop: asyncio.Event, ready: Callable[[Address], None]) -> None:
        """Listen on `address` (port 0: any free one), call `ready` with the address bound, serve until
        `stop` is set, then shut down."""
        host, port = address
        loop = asyncio.get_running_loop()
        try:
            server = await loop.create_server(
                self._protocol, host, port, reuse_address=True, reuse_port=self.options.reuse_port or None
            )
        except OSError as error:
            self.calls.shutdown()
            raise InvalidInput(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
        bound = server.sockets[0].getsockname()[:2]
        self.metrics = SmtpMetrics(
            f"[{bound[0]}]:{bound[1]}" if ":" in bound[0] else f"{bound[0]}:{bound[1]}"
        )
        self.template = self._session_template()
        log.info("listening on %s:%d, queue %s", bound[0], bound[1], self.options.queue)
        ready((bound[0], bound[1]))
        try:
            await stop.wait()
        finally:
            await self._shut_down(server)

    async def _shut_down(self, server: asyncio.Server) -> None:
        self.stopping = True
        server.close()
        loop = asyncio.get_running_loop()
        for session in list(self.sessions):
            if not session.in_data:
                session.say_goodbye()
        deadline = loop.time() + self.options.drain
        while any(session.in_data for session in self.sessions) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        cut = [session for session in self.sessions if session.in_data]
        if cut:
            log.warning(
                "shutdown: %d sessions still in DATA after %.0f s are closed", len(cut), self.options.drain
            )
        for session in list(self.sessions):
            session.say_goodbye()
        # Their connection_lost, which logs each disconnect, runs on this loop: let it before it ends.
        deadline = loop.time() + 5
        while self.sessions and loop.time() < deadline:
            await asyncio.sleep(0.01)
        # An enqueue under way finishes: its mail may be durable, and the store stays whole.
        await loop.run_in_executor(None, self.calls.shutdown)
        log.info("stopped: %d sessions, %d mails accepted", self.sessions_served, self.handler.accepted)
