"""What the link's channels read of the link (link.py's `Link` is the one implementation): its connection,
its loop and its options. The channels name this protocol rather than the link, which builds them."""

from __future__ import annotations

from typing import Any, Protocol

from ...clock import Clock


class LinkState(Protocol):
    target: str  # host:port, for messages
    prefetch: int
    delivery_limit: int
    clock: Clock
    ioloop: Any  # pika's IOLoop, on the link's thread
    connection: Any  # pika's SelectConnection while one is open, else None
    closing: bool
    refused: str | None  # why RabbitMQ refused the connection as configured, while it does

    def connected(self) -> bool: ...
