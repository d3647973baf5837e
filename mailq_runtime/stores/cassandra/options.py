"""What a CassandraStore connects to and how, as one value that refuses a bad keyspace, consistency level,
credentials or replication: deployments.py builds it from a deployment's cassandra:// settings; tests and
benchmarks name only what they change. The password is never shown."""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from cassandra import ConsistencyLevel

from ...errors import InvalidInput
from .schema import validate_replication

DEFAULT_REPLICATION = {"class": "SimpleStrategy", "replication_factor": 1}
_KEYSPACE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,47}")


@dataclass(frozen=True)
class CassandraOptions:
    contact_points: Sequence[str]
    keyspace: str
    port: int = 9042
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    local_datacenter: str | None = None
    consistency: str = "LOCAL_QUORUM"
    # Used only where the store creates the keyspace.
    replication: Mapping[str, object] = field(default_factory=lambda: dict(DEFAULT_REPLICATION))
    request_timeout: float = 30.0
    # A client context (tls.py) for a cluster that speaks TLS; None for one in the clear.
    ssl_context: ssl.SSLContext | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.keyspace, str) or not _KEYSPACE.fullmatch(self.keyspace):
            raise InvalidInput(
                f"invalid keyspace name {self.keyspace!r}: "
                "1-48 letters, digits or '_', starting with a letter"
            )
        level = self.consistency_level
        if level is None or level in (ConsistencyLevel.SERIAL, ConsistencyLevel.LOCAL_SERIAL):
            raise InvalidInput(
                f"invalid consistency level {self.consistency!r}: one of ONE, QUORUM, LOCAL_QUORUM, ALL ..."
            )
        if (self.username is None) != (self.password is None):
            raise InvalidInput("give both a Cassandra username and a password, or neither")
        validate_replication(self.replication)

    @property
    def consistency_level(self) -> int | None:
        """The driver's level of `consistency`; None for a name it does not know."""
        name = self.consistency.upper() if isinstance(self.consistency, str) else ""
        return ConsistencyLevel.name_to_value.get(name)

    @property
    def serial_consistency_level(self) -> int:
        """The level of lightweight transactions' Paxos round: LOCAL_SERIAL beside a LOCAL_ level."""
        local = self.consistency.upper().startswith("LOCAL_")
        return ConsistencyLevel.LOCAL_SERIAL if local else ConsistencyLevel.SERIAL
