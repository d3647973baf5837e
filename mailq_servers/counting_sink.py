"""An SMTP sink that measures what remote delivery's per-destination limits bound: the sessions open at
once and when each mail arrived. smtp-sink (smtp_sink.py) logs neither, so the limits' tests and
benchmark take mail with this small aiosmtpd server instead, in a thread of their own process.

It takes every mail; `data_wait` seconds before answering DATA make sessions overlap, so that a
concurrency limit binds."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

from .base import HOST


class _Counts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open = 0
        self.most = 0
        self.arrivals: list[float] = []  # time.time() of each mail taken
        self.recipients: list[str] = []
        self.mail_options: list[list[str]] = []  # MAIL FROM's parameters, a list a mail


class _CountingSMTP(SMTP):
    def __init__(self, counts: _Counts, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.counts = counts

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        with self.counts.lock:
            self.counts.open += 1
            self.counts.most = max(self.counts.most, self.counts.open)
        super().connection_made(transport)

    def connection_lost(self, error: Exception | None) -> None:
        with self.counts.lock:
            self.counts.open -= 1
        super().connection_lost(error)


class _Handler:
    def __init__(self, counts: _Counts, data_wait: float) -> None:
        self.counts = counts
        self.data_wait = data_wait

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        if self.data_wait:
            await asyncio.sleep(self.data_wait)
        with self.counts.lock:
            self.counts.arrivals.append(time.time())
            self.counts.recipients.extend(envelope.rcpt_tos)
            self.counts.mail_options.append(list(envelope.mail_options))
        return "250 2.0.0 Ok: queued"


class _Controller(Controller):
    def __init__(self, counts: _Counts, handler: _Handler, host: str, port: int, smtputf8: bool) -> None:
        super().__init__(handler, hostname=host, port=port, ready_timeout=20)
        self.counts = counts
        self.smtputf8 = smtputf8

    def factory(self) -> SMTP:
        return _CountingSMTP(self.counts, self.handler, hostname="sink.test", enable_SMTPUTF8=self.smtputf8)


class CountingSink:
    """The sink's figures so far: `most_sessions` open at once, the `arrivals` of the mails (time.time(),
    in order) and their `recipients`."""

    def __init__(self, counts: _Counts) -> None:
        self._counts = counts

    @property
    def most_sessions(self) -> int:
        return self._counts.most

    @property
    def arrivals(self) -> list[float]:
        with self._counts.lock:
            return list(self._counts.arrivals)

    @property
    def recipients(self) -> list[str]:
        with self._counts.lock:
            return list(self._counts.recipients)

    @property
    def mail_options(self) -> list[list[str]]:
        with self._counts.lock:
            return list(self._counts.mail_options)

    def most_in_a_second(self) -> int:
        """The most mails that arrived within one second of the clock (as a rate's windows are cut)."""
        seconds: dict[int, int] = {}
        for arrival in self.arrivals:
            seconds[int(arrival)] = seconds.get(int(arrival), 0) + 1
        return max(seconds.values(), default=0)


@contextmanager
def counting_sink(
    port: int, *, host: str = HOST, data_wait: float = 0.0, smtputf8: bool = False
) -> Iterator[CountingSink]:
    """The sink on `host`:`port` until the block ends (announcing SMTPUTF8 if `smtputf8`); what it counted
    stays readable after."""
    counts = _Counts()
    controller = _Controller(counts, _Handler(counts, data_wait), host, port, smtputf8)
    controller.start()
    # start() proves the server up with a session of its own: not one to count.
    deadline = time.monotonic() + 10
    while counts.open and time.monotonic() < deadline:
        time.sleep(0.01)
    with counts.lock:
        counts.most = counts.open
    try:
        yield CountingSink(counts)
    finally:
        controller.stop()
