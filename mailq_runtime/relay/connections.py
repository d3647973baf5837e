"""Sessions kept open after a transaction, for the next mail to the same mail exchanger: Postfix's
connection cache (`smtp_connection_cache_on_demand`, kept `smtp_connection_cache_time_limit` = 2 s).

A worker delivers one mail per dequeue; when the next mail goes to the same destination, as in a burst,
it reuses the session instead of a new TCP, EHLO and STARTTLS. The client pipelines an RSET ahead of the
session's next transaction, which proves it alive without a round trip of its own; a session the
server closed while it was idle fails that RSET, and the mail goes through a new one.
One cache per worker thread: a session is used by one transaction at a time. Each session holds a slot
of its destination's connection limit (limits.py) from its opening to its close, kept idle or not; a
session is kept for its destination only, so another domain at the same exchanger opens its own."""

from __future__ import annotations

import smtplib
import time
from dataclasses import dataclass

from ..metrics import RELAY_CONNECTIONS
from .limits import Limit, Limiter, Slot
from .routes import Target

# Seconds an idle session is kept, as Postfix's default.
IDLE_LIMIT = 2.0


@dataclass(frozen=True)
class Session:
    """An SMTP session to `target`, holding `slot` of its destination."""

    client: smtplib.SMTP
    target: Target
    slot: Slot


class Connections:
    """The sessions of one worker thread, their slots taken from `limiter` (None: no limits)."""

    def __init__(self, limiter: Limiter | None = None, idle_limit: float = IDLE_LIMIT) -> None:
        self.limiter = limiter
        self.idle_limit = idle_limit
        self._idle: dict[tuple[str, Target], tuple[Session, float]] = {}

    def take(self, destination: str, target: Target) -> Session | None:
        """The idle session to `target` for `destination`, if one is kept and still holds its slot (a
        session whose slot was lost is closed instead: limits.py); it is the caller's now."""
        self.close_expired()
        kept = self._idle.pop((destination, target), None)
        return None if kept is None else kept[0]

    def holds(self, session: Session) -> bool:
        """Whether `session` may start a transaction: its slot is still its own (limits.py)."""
        return self.limiter is None or self.limiter.holds(session.slot)

    def slot(self, destination: str, limit: Limit) -> Slot | None:
        """A slot for a new session to `destination`, None if none came free in time. This worker's own
        idle sessions are closed first, past their idle limit: one of them may hold the slot wanted."""
        self.close_expired()
        if self.limiter is None:
            return Slot(destination)
        return self.limiter.slot(destination, limit)

    def free(self, slot: Slot) -> None:
        """Give back a slot whose session never opened."""
        if self.limiter is not None:
            self.limiter.free(slot)

    def keep(self, destination: str, session: Session) -> None:
        """Keep `session`, whose last transaction ended cleanly, for the next mail to its target; one
        whose slot's lease ran out is closed instead."""
        previous = self._idle.pop((destination, session.target), None)
        if previous is not None:
            self.close_session(previous[0])
        if not self.holds(session):
            self.close_session(session)
        else:
            self._idle[destination, session.target] = (session, time.monotonic() + self.idle_limit)
        self.close_expired()

    def close(self) -> None:
        """QUIT every kept session (the worker stops)."""
        for session, _ in self._idle.values():
            self.close_session(session)
        self._idle.clear()

    def close_expired(self) -> None:
        """Close the sessions idle past the idle limit, freeing their slots, and those whose slot was lost
        (its lease ran out: another worker may hold it now)."""
        now = time.monotonic()
        ended = [
            key for key, (session, expires) in self._idle.items() if expires <= now or not self.holds(session)
        ]
        for key in ended:
            self.close_session(self._idle.pop(key)[0])

    def close_session(self, session: Session) -> None:
        """QUIT, whose failure changes nothing: the replies that matter are in; then the slot is free."""
        try:
            session.client.quit()
        except (OSError, smtplib.SMTPException):
            session.client.close()
        self._closed(session)

    def drop_session(self, session: Session) -> None:
        """Close a session that stopped answering, without a QUIT that would wait for its reply."""
        session.client.close()
        self._closed(session)

    def _closed(self, session: Session) -> None:
        RELAY_CONNECTIONS.labels(str(session.target)).dec()
        self.free(session.slot)


def opened(client: smtplib.SMTP, target: Target, slot: Slot) -> Session:
    """Count a new session to `target`, open until it is closed."""
    RELAY_CONNECTIONS.labels(str(target)).inc()
    return Session(client, target, slot)
