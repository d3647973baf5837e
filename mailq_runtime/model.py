"""Value types of the mail queue. Each validates at construction, so the inside trusts its inputs."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from .clock import LATEST, MICROS_PER_SECOND, to_datetime
from .errors import InvalidInput, shown

_QUEUE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LOCAL_PART = rf"(?:{_ATOM}(?:\.{_ATOM})*|\"(?:[^\"\\\r\n]|\\.)*\")"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DOMAIN = rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:.]+\])"
_ADDRESS = re.compile(rf"{_LOCAL_PART}@{_DOMAIN}")
_HEX_ID = re.compile(r"[0-9a-f]{32}")
# One spelling per blob id: the generation in decimal without leading zeros, so that `g01_<hex>` is not
# a second name for `g1_<hex>` (two names for one blob would be two blobs to the GC).
_BLOB_ID = re.compile(r"g(0|[1-9][0-9]{0,17})_([0-9a-f]{64})")
_BLOB_HASH = re.compile(r"[0-9a-f]{64}")
_MAX_GENERATION = 10**18 - 1
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
                f"invalid queue name {shown(value)}: use 1-64 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        return super().__new__(cls, value)


class MailAddress(str):
    """An RFC 5321 mailbox (local-part@domain), without display name or angle brackets."""

    def __new__(cls, value: str) -> MailAddress:
        if not isinstance(value, str) or len(value) > 320 or not _ADDRESS.fullmatch(value):
            raise InvalidInput(f"invalid mail address {shown(value)}")
        return super().__new__(cls, value)

    @property
    def local_part(self) -> str:
        return self.rsplit("@", 1)[0]

    @property
    def domain(self) -> str:
        return self.rsplit("@", 1)[1].lower()


class DomainName(str):
    """A mail domain as an address's right-hand side names it (a host name or an address literal), kept
    in lower case, as domains compare."""

    def __new__(cls, value: str) -> DomainName:
        if not isinstance(value, str) or len(value) > 255 or not re.fullmatch(_DOMAIN, value):
            raise InvalidInput(f"invalid domain {shown(value)}")
        return super().__new__(cls, value.lower())


# SMTP writes the null (bounce) sender as MAIL FROM:<>; where a sender is named as text, so is it.
NULL_SENDER_SPELLINGS = ("", "<>")


def normalise_domains(local_domains: Collection[str]) -> frozenset[str]:
    """The local domains a server or worker is given, each checked and in lower case."""
    if isinstance(local_domains, str) or not local_domains:
        raise InvalidInput(f"local_domains is a non-empty collection of domains, not {shown(local_domains)}")
    # The address grammar is the domain grammar's validator: a bad domain fails as postmaster@<domain>.
    return frozenset(MailAddress(f"postmaster@{domain}").domain for domain in local_domains)


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
            raise InvalidInput(f"invalid {cls.kind} {shown(value)}: expected 32 lowercase hex digits")
        return super().__new__(cls, value)

    @classmethod
    def generate(cls, now_micros: int):
        return cls(f"{now_micros:016x}{next(_SEQUENCE) % 2**64:016x}")


class EnqueueId(_HexId):
    kind = "enqueue id"


def creation_time(identifier: str) -> int | None:
    """When a mailq id (enqueue, message or mailbox id) was made, in microseconds since the epoch, read from
    its first 16 hex digits; None for anything else (a broker message another program published)."""
    if not isinstance(identifier, str) or not _HEX_ID.fullmatch(identifier):
        return None
    return int(identifier[:16], 16)


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
        generation = self.generation
        if (
            isinstance(generation, bool)
            or not isinstance(generation, int)
            or not 0 <= generation <= _MAX_GENERATION
        ):
            raise InvalidInput(f"invalid blob generation {shown(generation)}: expected 0..{_MAX_GENERATION}")
        if not isinstance(self.hash, str) or not _BLOB_HASH.fullmatch(self.hash):
            raise InvalidInput(f"invalid blob hash {shown(self.hash)}: expected 64 lowercase hex digits")

    @classmethod
    def parse(cls, value: str | BlobId) -> BlobId:
        if isinstance(value, BlobId):
            return value
        match = _BLOB_ID.fullmatch(value) if isinstance(value, str) else None
        if match is None:
            raise InvalidInput(
                f"invalid blob id {shown(value)}: expected g<generation>_<64 hex digits>, "
                "the generation without leading zeros"
            )
        # The pattern allows exactly what __post_init__ checks: no need to check the parts again.
        return cls.of_checked(int(match.group(1)), match.group(2))

    @classmethod
    def of_checked(cls, generation: int, hash: str) -> BlobId:
        """The blob id of parts known to be valid (a generation read from the store, a SHA-256 hex digest),
        built without checking them again: it sits on the path of every save, read and release."""
        blob_id = object.__new__(cls)
        object.__setattr__(blob_id, "generation", generation)
        object.__setattr__(blob_id, "hash", hash)
        return blob_id

    def __str__(self) -> str:
        return f"g{self.generation}_{self.hash}"


MIN_PRIORITY, NORMAL_PRIORITY, MAX_PRIORITY = 0, 5, 9


def check_priority(priority: int | None) -> int:
    """A mail's priority: omitted means normal. James clamps a value out of range to the nearest bound;
    here it is refused, since an operator who typed 10 or -1 meant something the queue cannot do."""
    if priority is None:
        return NORMAL_PRIORITY
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not MIN_PRIORITY <= priority <= MAX_PRIORITY
    ):
        raise InvalidInput(
            f"invalid priority {shown(priority)}: expected an integer {MIN_PRIORITY}..{MAX_PRIORITY}"
        )
    return priority


# What a store's integer column holds: the bound of every count and size.
MAX_COUNT = 2**63 - 1
_COUNT = re.compile(r"[0-9]{1,19}")


def parse_count(value: int | str, name: str) -> int:
    """A positive whole number (a size, a bucket count, a pace, a limit ...), from an int or its decimal
    text: the one parser of counts, for the API, the URL options, the command line and the environment."""
    number = None
    if isinstance(value, str) and _COUNT.fullmatch(value.strip()):
        number = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    if number is None or not 1 <= number <= MAX_COUNT:
        raise InvalidInput(f"invalid {name} {shown(value)}: expected a positive integer up to {MAX_COUNT}")
    return number


_DURATION = re.compile(r"([-+]?)([0-9]+)(\.[0-9]+)?\s*(us|ms|s|m|h|d|w|y)?")
_UNIT_MICROS = {
    "us": 1,
    "ms": 1_000,
    "s": MICROS_PER_SECOND,
    "m": 60 * MICROS_PER_SECOND,
    "h": 3600 * MICROS_PER_SECOND,
    "d": 86400 * MICROS_PER_SECOND,
    "w": 604800 * MICROS_PER_SECOND,
    "y": 31557600 * MICROS_PER_SECOND,
}
# The longest duration: well inside the calendar (a delay must still end before the year 9999) and
# inside a signed 64-bit count of microseconds, whatever it is added to.
MAX_DURATION_YEARS = 8000
MAX_DURATION = MAX_DURATION_YEARS * _UNIT_MICROS["y"]


def parse_duration(value: timedelta | int | float | str, name: str = "duration") -> int:
    """A duration in microseconds, from a timedelta, a number of seconds, or text like '90s', '1h', '7d':
    the one parser of durations. Negative, infinite, NaN and longer than MAX_DURATION are refused, and
    `name` (the option or argument) is what the error calls it."""
    micros: int | Decimal | None = None
    if isinstance(value, timedelta):
        micros = value // timedelta(microseconds=1)
    elif isinstance(value, int) and not isinstance(value, bool):
        micros = value * MICROS_PER_SECOND
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInput(f"invalid {name} {shown(value)}: must be finite")
        # Decimal, not float: 1e308 seconds are finite, their microseconds would not be.
        micros = Decimal(value) * MICROS_PER_SECOND
    elif isinstance(value, str):
        match = _DURATION.fullmatch(value.strip())
        if match:
            sign, whole, fraction, unit = match.groups()
            if len(whole.lstrip("0")) > 19:
                # Too long in any unit: no need to build a number of thousands of digits to say so.
                micros = MAX_DURATION + 1
            else:
                micros = Decimal(whole + (fraction or "")) * _UNIT_MICROS[unit or "s"]
            if sign == "-":
                micros = -micros
    if micros is None:
        expected = "30, '90s', '5m', '1h', '7d'" + ("" if isinstance(value, str) else " or a timedelta")
        raise InvalidInput(f"invalid {name} {shown(value)}: expected a duration such as {expected}")
    if micros < 0:
        raise InvalidInput(f"invalid {name} {shown(value)}: must not be negative")
    if micros > MAX_DURATION:
        raise InvalidInput(f"invalid {name} {shown(value)}: longer than {MAX_DURATION_YEARS} years")
    return int(micros)


def delivery_time(now: int, delay: timedelta | int | float | str | None) -> int:
    """When a mail enqueued (or retried) at `now` with `delay` becomes deliverable. A delay of centuries
    is kept; one that would end after the latest instant a time can show (clock.LATEST) is refused."""
    if delay is None:
        return now
    due = now + parse_duration(delay, "delay")
    if due > LATEST:
        raise InvalidInput(
            f"invalid delay {shown(delay)}: the mail would be due after {to_datetime(LATEST):%Y-%m-%d}, "
            "the latest time mailq can represent"
        )
    return due


_HEADER_FIELD = re.compile(rb"[!-9;-~]+[ \t]*:")
_FIRST_LINE = re.compile(rb"[^\r\n]*")


def check_message(message: bytes, max_size: int | None = None) -> bytes:
    """The message as bytes, if the queue and the mailboxes accept it: RFC 5322 bytes opening with a
    header field (line ends and 8-bit bytes as they come), at most `max_size` bytes. The one rule for
    enqueue, for the worker's delivery and for a mailbox append, so that the queue never takes in a mail
    its worker would dead-letter as malformed."""
    if not isinstance(message, bytes | bytearray | memoryview):
        raise InvalidInput(f"a message is raw RFC 5322 bytes, not {type(message).__name__}")
    message = bytes(message)
    if max_size is not None and len(message) > max_size:
        raise InvalidInput(f"message of {len(message)} bytes exceeds the maximum size of {max_size} bytes")
    if not _HEADER_FIELD.match(message):
        first_line = _FIRST_LINE.match(message).group()
        hint = (
            ": an mbox 'From ' separator line, which is not part of the message"
            if message.startswith(b"From ")
            else " (name: value)"
        )
        raise InvalidInput(
            f"malformed message: no header section, its first line {shown(first_line)} is not a header "
            f"field{hint}"
        )
    return message


def split_message(message: bytes) -> tuple[bytes, bytes]:
    """Headers (up to and including the blank line) and body; joining them gives the message back."""
    for separator in (b"\r\n\r\n", b"\n\n"):
        index = message.find(separator)
        if index >= 0:
            cut = index + len(separator)
            return message[:cut], message[cut:]
    return message, b""


@dataclass(frozen=True)
class PerRecipientHeader:
    recipient: MailAddress
    name: str
    value: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "recipient", MailAddress(self.recipient))
        if not self.name or not re.fullmatch(r"[!-9;-~]+", self.name):
            raise InvalidInput(f"invalid header name {shown(self.name)}")
        if not isinstance(self.value, str) or "\r" in self.value or "\n" in self.value:
            raise InvalidInput(f"invalid value for header {shown(self.name)}: no line breaks allowed")


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
            raise InvalidInput(f"invalid mail name {shown(self.name)}: 1-255 printable characters")
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

    @classmethod
    def stored(
        cls, recipients: Sequence[str], message: bytes, sender: str | None, name: str, **optional: Any
    ) -> Mail:
        """A mail read back from the store, as every dequeue does. Its fields were checked when it was
        enqueued, by this or another mailq process, and its attributes have been through JSON since: it is
        built without checking them again, which would cost a dequeue a tenth of its work. The optional
        fields not given take their defaults."""
        mail = object.__new__(cls)
        given = {
            "recipients": tuple(str.__new__(MailAddress, recipient) for recipient in recipients),
            "message": message,
            "sender": None if sender is None else str.__new__(MailAddress, sender),
            "name": name,
            **optional,
        }
        for field_name, default, default_factory in _MAIL_FIELDS:
            value = given.get(field_name, MISSING)
            if value is MISSING:
                value = default if default_factory is MISSING else default_factory()
            object.__setattr__(mail, field_name, value)
        return mail


# Each field of Mail with its default, for `Mail.stored`.
_MAIL_FIELDS = tuple((spec.name, spec.default, spec.default_factory) for spec in fields(Mail))
