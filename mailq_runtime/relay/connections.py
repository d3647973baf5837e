"""Sessions kept open after a transaction, for the next mail to the same mail exchanger: Postfix's
connection cache (`smtp_connection_cache_on_demand`, kept `smtp_connection_cache_time_limit` = 2 s).

A worker delivers one mail per dequeue; when the next mail goes to the same destination, as in a burst,
it reuses the session instead of a new TCP, EHLO and STARTTLS. The client pipelines an RSET ahead of the
session's next transaction, which proves it alive without a round trip of its own; a session the
server closed while it was idle fails that RSET, and the mail goes through a new one.
One cache per worker thread: a session is used by one transaction at a time."""

from __future__ import annotations

import smtplib
import time

from ..metrics import RELAY_CONNECTIONS
from .routes import Target

# Seconds an idle session is kept, as Postfix's default.
IDLE_LIMIT = 2.0


class Connections:
    def __init__(self, idle_limit: float = IDLE_LIMIT) -> None:
        self.idle_limit = idle_limit
        self._idle: dict[Target, tuple[smtplib.SMTP, float]] = {}

    def take(self, target: Target) -> smtplib.SMTP | None:
        """The idle session to `target`, if one is kept; it is the caller's now."""
        self._close_expired()
        kept = self._idle.pop(target, None)
        return None if kept is None else kept[0]

    def keep(self, target: Target, client: smtplib.SMTP) -> None:
        """Keep `client`, whose last transaction ended cleanly, for the next mail to `target`."""
        previous = self._idle.pop(target, None)
        if previous is not None:
            close(previous[0], target)
        self._idle[target] = (client, time.monotonic() + self.idle_limit)
        self._close_expired()

    def close(self) -> None:
        """QUIT every kept session (the worker stops)."""
        for target, (client, _) in self._idle.items():
            close(client, target)
        self._idle.clear()

    def _close_expired(self) -> None:
        now = time.monotonic()
        for target in [t for t, (_, expires) in self._idle.items() if expires <= now]:
            close(self._idle.pop(target)[0], target)


def opened(target: Target) -> None:
    """Count a new session to `target`, open until it is `close`d."""
    RELAY_CONNECTIONS.labels(str(target)).inc()


def close(client: smtplib.SMTP, target: Target) -> None:
    """QUIT, whose failure changes nothing: the replies that matter are in."""
    try:
        client.quit()
    except (OSError, smtplib.SMTPException):
        client.close()
    RELAY_CONNECTIONS.labels(str(target)).dec()


def drop(client: smtplib.SMTP, target: Target) -> None:
    """Close a session that stopped answering, without a QUIT that would wait for its reply."""
    client.close()
    RELAY_CONNECTIONS.labels(str(target)).dec()
