"""The I/O side of the RabbitMQ broker (broker.py): one thread owning the AMQP connection and every
channel on it, the publishes it carries until confirmed (publish_channel.py), and the consumers it feeds
(consumer_channels.py).

Only this thread touches pika's connection and channels (pika is not thread-safe). Callers hand it work
through `Link.submit` (one `add_callback_threadsafe` wake-up for however many commands are waiting) and
wait on a `Waiter`, or, for deliveries, on their consumer's condition.
"""

from __future__ import annotations

import logging
import random
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import pika
import pika.exceptions
from pika.adapters.select_connection import IOLoop

from ...clock import Clock
from ...errors import BrokerRefused, BrokerUnavailable
from ...tls import certificate_refused
from .consumer_channels import ConsumerChannels
from .messages import describe
from .publish_channel import PublishChannel
from .waits import BACKOFF_FIRST, BACKOFF_MAX

log = logging.getLogger(__package__)
# pika logs every lost or refused connection at ERROR, with a traceback, from several of its modules. The
# link logs one line per event itself, so pika's lines stay for an operator who sets pika's level.
if logging.getLogger("pika").level == logging.NOTSET:
    logging.getLogger("pika").setLevel(logging.CRITICAL)


class Link(threading.Thread):
    """The I/O thread: the connection, and on it the confirming publish channel (`publishing`) and the
    consumers' channels (`consuming`). Every method but `submit` runs on this thread."""

    def __init__(
        self,
        parameters: list[pika.ConnectionParameters],
        target: str,
        prefetch: int,
        delivery_limit: int,
        clock: Clock,
    ) -> None:
        super().__init__(name=f"mailq-rabbitmq {target}", daemon=True)
        self.parameters = parameters
        self.attempts = random.randrange(len(parameters))  # processes spread over the nodes
        self.target = target
        self.prefetch = prefetch
        self.delivery_limit = delivery_limit
        self.clock = clock
        self.ioloop = IOLoop()
        self.commands: deque[Callable[[], None]] = deque()
        self.wake_lock = threading.Lock()
        self.wake_pending = False
        self.connection: Any = None
        self.closing = False
        self.stopped = False
        self.failures = 0
        self.reconnect_timer: Any = None
        # Read by callers: why the last connection failed (and pika's error, which callers' errors are
        # chained to), and whether RabbitMQ refused the login or the virtual host (waiting for it is of no
        # use then).
        self.error: str | None = None
        self.failure: BaseException | None = None
        self.refused: str | None = None
        # Whether the last connection was lost or could not be opened, until one opens: a publish then
        # fails at once instead of waiting for a confirmation that cannot come.
        self.down = False
        self.publishing = PublishChannel(self)
        self.consuming = ConsumerChannels(self, self.publishing)

    # Callers' side.

    def submit(self, command: Callable[[], None]) -> None:
        self.commands.append(command)
        with self.wake_lock:
            if self.wake_pending:
                return
            self.wake_pending = True
        self.ioloop.add_callback_threadsafe(self._run_commands)

    def run(self) -> None:
        self.ioloop.add_callback_threadsafe(self._connect)
        while not self.stopped:
            try:
                self.ioloop.start()
            except Exception:
                # A bug in one callback must not end the thread every publisher and consumer depends on.
                log.exception("RabbitMQ at %s: error in the I/O thread", self.target)
        self.ioloop.close()

    # The I/O thread's side.

    def _run_commands(self) -> None:
        with self.wake_lock:
            self.wake_pending = False
        while self.commands:
            command = self.commands.popleft()
            try:
                command()
            except Exception:
                log.exception("RabbitMQ at %s: error in the I/O thread", self.target)

    def _connect(self) -> None:
        self.reconnect_timer = None
        if self.closing:
            return
        # Each attempt the next node: a connection lost with its node is made again to another.
        parameters = self.parameters[self.attempts % len(self.parameters)]
        self.attempts += 1
        self.connection = pika.SelectConnection(
            parameters,
            on_open_callback=self._on_open,
            on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_closed,
            custom_ioloop=self.ioloop,
        )

    def _retry_later(self) -> None:
        delay = min(BACKOFF_FIRST * 2**self.failures, BACKOFF_MAX)
        self.failures += 1
        # Jittered, so that the processes a broker restart disconnected do not all come back at once.
        self.reconnect_timer = self.ioloop.call_later(delay * random.uniform(0.5, 1.0), self._connect)

    def _on_open(self, connection: Any) -> None:
        if self.failures:
            log.warning("RabbitMQ at %s: connected again", self.target)
        self.failures = 0
        self.error = self.refused = self.failure = None
        self.down = False
        self.consuming.watch_idle()
        self.publishing.open()
        self.consuming.open_wanted()

    def _on_open_error(self, connection: Any, error: BaseException) -> None:
        self.connection = None
        if self.closing:
            self._stop_loop()
            return
        self.error, self.failure = describe(error), error
        self.down = True
        if self.failures == 0:
            log.warning("RabbitMQ at %s: cannot connect (%s), retrying", self.target, self.error)
        # Refused logins and certificates: waiting for them does not help, the configuration must change.
        if isinstance(
            error, pika.exceptions.ProbableAuthenticationError | pika.exceptions.ProbableAccessDeniedError
        ) or certificate_refused(error):
            self.refused = self.error
            self.publishing.fail_waiting(BrokerRefused(f"RabbitMQ at {self.target}: {self.refused}"))
            self.consuming.wake_all()
        self._retry_later()

    def _on_closed(self, connection: Any, reason: BaseException) -> None:
        self.connection = None
        self.publishing.channel = None
        self.down = True
        # The callers' publishes that were unconfirmed fail now rather than at their timeout: the queue
        # keeps each mail as a delayed mail due at once (a copy RabbitMQ did take is a duplicate, which
        # the view's deletion mark absorbs). The I/O thread's own copies are dropped, as their originals
        # come again.
        lost = BrokerUnavailable(f"the connection to RabbitMQ at {self.target} was lost ({describe(reason)})")
        lost.__cause__ = reason
        self.publishing.fail_waiting(lost)
        self.consuming.connection_lost()
        if self.closing:
            self._stop_loop()
            return
        self.error, self.failure = describe(reason), reason
        log.warning("RabbitMQ at %s: connection lost (%s), reconnecting", self.target, self.error)
        self._retry_later()

    def connected(self) -> bool:
        return self.connection is not None and self.connection.is_open and not self.closing

    # Closing.

    def stop(self) -> None:
        self.closing = True
        self.publishing.fail_waiting(BrokerUnavailable(f"the broker of RabbitMQ at {self.target} is closed"))
        self.consuming.stop()
        if self.reconnect_timer is not None:
            self.ioloop.remove_timeout(self.reconnect_timer)
        if self.connection is None or self.connection.is_closed:
            self._stop_loop()
            return
        # The close callback stops the loop; this bounds the wait for a broker that does not answer.
        self.ioloop.call_later(5.0, self._stop_loop)
        try:
            self.connection.close()
        except pika.exceptions.ConnectionWrongStateError:
            pass  # already closing: its close callback comes

    def _stop_loop(self) -> None:
        self.stopped = True
        self.ioloop.stop()
