"""Value types of the mail queue. Each validates at construction, so the inside trusts its inputs."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from .clock import LATEST, MICROS_PER_SECOND
from .errors import InvalidInput

_QUEUE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LOCAL_PART = rf"(?:{_ATOM}(?:\.{_ATOM})*|\"(?:[^\"\\\r\n]|\\.)*\")"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DOMAIN = rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:.]+\])"
_ADDRESS = re.compile(rf"{_LOCAL_PART}@{_DOMAIN}")
_HEX_ID = re.compile(r"[0-9a-f]{32}")
_BLOB_ID = re.compile(r"g([0-9]{1,18})_([0-9a-f]{64})")
# The low half of generated ids: a counter from a random start, not fresh random bits, so two ids made in
# one microsecond (a coarse or injected clock) still sort in the order they were made, while the random
# start keeps the ids of different processes apart (a forked child draws a new start).
_SEQUENCE = itertools.count()


def _restart_sequence() -> None:
    global _SEQUENCE
    _SEQUENCE = itertools.count(int.from_bytes(os.urandom(8), "big"))


_restart_sequence()
os.register_at_fork(after_in_child=_restart_sequence)


class QueueName(str):
    """A queue name: letters, digits, '.', '_' and '-', starting with a letter or digit, at most 64."""

    def __new__(cls, value: str) -> QueueName:
        if not isinstance(value, str) or not _QUEUE_NAME.fullmatch(value):
            raise InvalidInput(
                f"invalid queue name {value!r}: use 1-64 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        return super().__new__(cls, value)


class MailAddress(str):
    """An RFC 5321 mailbox (local-part@domain), without display name or angle brackets."""

    def __new__(cls, value: str) -> MailAddress:
        if not isinstance(value, str) or len(value) > 320 or not _ADDRESS.fullmatch(value):
            raise InvalidInput(f"invalid mail address {value!r}")
        return super().__new__(cls, value)

    @property
    def local_part(self) -> str:
        return self.rsplit("@", 1)[0]

    @property
    def domain(self) -> str:
        return self.rsplit("@", 1)[1].lower()


# SMTP writes the null (bounce) sender as MAIL FROM:<>; where a sender is named as text, so is it.
NULL_SENDER_SPELLINGS = ("", "<>")


def address_key(address: str) -> tuple[str, str]:
    """What makes two addresses the same mailbox, as James's MailAddress equality has it: the local part
    exactly (RFC 5321 leaves its case to the receiving host), the domain in any case."""
    local_part, _, domain = address.rpartition("@")
    return local_part, domain.lower()


class _HexId(str):
    """A 32-hex-digit id whose first 16 digits are the creation time: ids sort in creation order."""

    kind = "id"

    def __new__(cls, value: str):
        if not isinstance(value, str) or not _HEX_ID.fullmatch(value):
            raise InvalidInput(f"invalid {cls.kind} {value!r}: expected 32 lowercase hex digits")
        return super().__new__(cls, value)

    @classmethod
    def generate(cls, now_micros: int):
        return cls(f"{now_micros:016x}{next(_SEQUENCE) % 2**64:016x}")


class EnqueueId(_HexId):
    kind = "enqueue id"


class MessageId(_HexId):
    kind = "message id"


class MailboxId(_HexId):
    kind = "mailbox id"


@dataclass(frozen=True, order=True)
class BlobId:
    """Record 39's blob id: the reference generation plus the SHA-256 of the content, `g7_<hex>`."""

    generation: int
    hash: str

    def __post_init__(self) -> None:
        if not isinstance(self.generation, int) or self.generation < 0:
            raise InvalidInput(f"invalid blob generation {self.generation!r}")
        if not isinstance(self.hash, str) or not re.fullmatch(r"[0-9a-f]{64}", self.hash):
            raise InvalidInput(f"invalid blob hash {self.hash!r}: expected 64 lowercase hex digits")

    @classmethod
    def parse(cls, value: str | BlobId) -> BlobId:
        if isinstance(value, BlobId):
            return value
        match = _BLOB_ID.fullmatch(value) if isinstance(value, str) else None
        if match is None:
            raise InvalidInput(f"invalid blob id {value!r}: expected g<generation>_<64 hex digits>")
        return cls(int(match.group(1)), match.group(2))

    def __str__(self) -> str:
        return f"g{self.generation}_{self.hash}"


MIN_PRIORITY, NORMAL_PRIORITY, MAX_PRIORITY = 0, 5, 9


def clamp_priority(priority: int | None) -> int:
    """James's rule: omitted means normal, out-of-range values are clamped to the nearest bound."""
    if priority is None:
        return NORMAL_PRIORITY
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidInput(
            f"invalid priority {priority!r}: expected an integer {MIN_PRIORITY}..{MAX_PRIORITY}"
        )
    return max(MIN_PRIORITY, min(MAX_PRIORITY, priority))


_DURATION = re.compile(r"(-?[0-9]+(?:\.[0-9]+)?)\s*(us|ms|s|m|h|d|w|y)?")
_UNIT_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31557600}


def parse_duration(value: timedelta | int | float | str, default_unit: str = "s") -> int:
    """A duration in microseconds, from a timedelta, a number of seconds, or text like '90s', '1h', '7d'."""
    if isinstance(value, timedelta):
        return value // timedelta(microseconds=1)
    if isinstance(value, bool):
        raise InvalidInput(f"invalid duration {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise InvalidInput(f"invalid duration {value!r}: must be finite")
        return int(value * MICROS_PER_SECOND)
    if isinstance(value, str):
        match = _DURATION.fullmatch(value.strip())
        if match:
            seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2) or default_unit]
            return int(seconds * MICROS_PER_SECOND)
    raise InvalidInput(
        f"invalid duration {value!r}: expected e.g. 30, '90s', '5m', '1h', '7d' or a timedelta"
    )


def delivery_time(now: int, delay: timedelta | int | float | str | None) -> int:
    """When a mail enqueued at `now` with `delay` becomes deliverable: negative means now, far is clamped."""
    if delay is None:
        return now
    micros = parse_duration(delay)
    return min(now + max(micros, 0), LATEST)


@dataclass(frozen=True)
class PerRecipientHeader:
    recipient: MailAddress
    name: str
    value: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "recipient", MailAddress(self.recipient))
        if not self.name or not re.fullmatch(r"[!-9;-~]+", self.name):
            raise InvalidInput(f"invalid header name {self.name!r}")
        if not isinstance(self.value, str) or "\r" in self.value or "\n" in self.value:
            raise InvalidInput(f"invalid value for header {self.name!r}: no line breaks allowed")


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Mail:
    """A mail in transit: the SMTP envelope, the raw RFC 5322 message and what the server knows of it."""

    recipients: tuple[MailAddress, ...]
    message: bytes
    sender: MailAddress | None = None  # None is the null (bounce) sender
    name: str = field(default_factory=lambda: f"mail-{os.urandom(8).hex()}")
    attributes: Mapping[str, Any] = field(default_factory=dict)
    state: str = "root"
    error_message: str | None = None
    remote_host: str = "localhost"
    remote_addr: str = "127.0.0.1"
    per_recipient_headers: tuple[PerRecipientHeader, ...] = ()
    last_updated: datetime = field(default_factory=_now)

    def __post_init__(self) -> None:
        if isinstance(self.recipients, str) or not self.recipients:
            raise InvalidInput("a mail needs at least one recipient")
        object.__setattr__(self, "recipients", tuple(MailAddress(r) for r in self.recipients))
        if self.sender is not None:
            object.__setattr__(self, "sender", MailAddress(self.sender))
        if not isinstance(self.message, bytes | bytearray | memoryview):
            raise InvalidInput(f"a message is raw RFC 5322 bytes, not {type(self.message).__name__}")
        object.__setattr__(self, "message", bytes(self.message))
        if not self.message:
            raise InvalidInput("malformed message: it is empty")
        name = self.name
        if not isinstance(name, str) or not name or len(name) > 255 or not name.isprintable():
            raise InvalidInput(f"invalid mail name {self.name!r}: 1-255 printable characters")
        try:
            attributes = json.loads(json.dumps(dict(self.attributes), allow_nan=False))
        except (TypeError, ValueError) as error:
            raise InvalidInput(f"mail attributes must be a JSON-serialisable mapping: {error}") from None
        object.__setattr__(self, "attributes", attributes)
        object.__setattr__(
            self,
            "per_recipient_headers",
            tuple(
                h if isinstance(h, PerRecipientHeader) else PerRecipientHeader(*h)
                for h in self.per_recipient_headers
            ),
        )
        if self.last_updated.tzinfo is None:
            raise InvalidInput("last_updated must carry a timezone")
