"""What a RabbitMQ broker connects to and how it behaves, as one value: deployments.py builds it from a
deployment's amqp:// settings; tests and benchmarks name only what they change."""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...clock import MICROS_PER_SECOND, Clock, system_clock
from ...errors import InvalidInput, shown
from .names import CLASSIC, QUEUE_TYPES


@dataclass(frozen=True)
class BrokerOptions:
    """The nodes (`host`:`port`, then `more_hosts`), the virtual host and credentials, and the broker's
    behaviour; the password is never shown."""

    host: str = "127.0.0.1"
    port: int = 5672
    vhost: str = "/"
    user: str = "guest"
    password: str = field(default="guest", repr=False)
    more_hosts: Sequence[tuple[str, int]] = ()
    queue_type: str = CLASSIC
    clock: Clock = system_clock
    visibility_timeout: int = 300 * MICROS_PER_SECOND
    prefetch: int = 50
    delivery_limit: int = 20
    publish_timeout: float = 30.0
    heartbeat: int = 30
    # A client context (tls.py) for amqps; None for amqp in the clear.
    ssl_context: ssl.SSLContext | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, value in (("prefetch", self.prefetch), ("delivery_limit", self.delivery_limit)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
                raise InvalidInput(f"invalid {name} {shown(value)}: expected an integer 1..65535")
        if self.queue_type not in QUEUE_TYPES:
            expected = ", ".join(QUEUE_TYPES)
            raise InvalidInput(f"invalid queue type {shown(self.queue_type)}: expected one of {expected}")

    @property
    def hosts(self) -> list[tuple[str, int]]:
        return [(self.host, self.port), *self.more_hosts]
