"""What the RabbitMQ broker's parts share: its options, the I/O thread started by the first use, and whether
the broker is closed."""

from __future__ import annotations

import threading

import pika

from ...errors import BrokerRefused, BrokerUnavailable
from .link import Link
from .options import BrokerOptions


class Session:
    def __init__(
        self, parameters: list[pika.ConnectionParameters], target: str, options: BrokerOptions
    ) -> None:
        self.parameters = parameters
        self.target = target
        self.options = options
        self.clock = options.clock
        self.closed = False
        self._link: Link | None = None
        self._link_lock = threading.Lock()

    def started(self) -> Link:
        """The I/O thread, started by the first use: opening a runtime to read it connects nowhere."""
        link = self._link
        if link is None:
            with self._link_lock:
                self.usable()
                if self._link is None:
                    options = self.options
                    self._link = Link(
                        self.parameters, self.target, options.prefetch, options.delivery_limit, self.clock
                    )
                    self._link.start()
                link = self._link
        return link

    def usable(self) -> None:
        if self.closed:
            raise BrokerUnavailable(f"the broker of RabbitMQ at {self.target} is closed")
        self.not_refused()

    def not_refused(self) -> None:
        link = self._link
        if link is not None and link.refused is not None:
            raise BrokerRefused(f"RabbitMQ at {self.target}: {link.refused}")

    def close(self) -> None:
        """Stop the I/O thread (see RabbitMQBroker.close)."""
        with self._link_lock:
            if self.closed:
                return
            self.closed = True
            link = self._link
        if link is not None:
            link.submit(link.stop)
            link.join(timeout=15)
