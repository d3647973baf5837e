"""The named records the store protocols (stores/protocols.py) pass, one store's answer read the same as the
other's: a row of a table, or a few figures a store counts.

The row of `enqueued_mails`, `EnqueuedMail`, is also the message the broker carries (James's
MailReferenceDTO), so a dequeue needs only the broker message and the blobs. That message is a named,
versioned record: a JSON object with `"v": 1` and the row's fields by name (`recipients` and `metadata` as
the JSON texts the row holds, which spares a decode and an encode on the hot path), plus `attempts`. A
reader ignores the fields it does not know and fills defaults for the optional ones it misses, so a field
added later never makes a message in flight unreadable; the positional JSON array of earlier versions is
still read, so the mails in flight across an upgrade are delivered.

The records of few fields are NamedTuples, so a caller that unpacks one reads it as the tuple it was.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import NamedTuple

from ..clock import from_datetime, to_datetime
from ..model import NORMAL_PRIORITY, BlobId, EnqueueId, Mail, PerRecipientHeader

PAYLOAD_VERSION = 1
# Mail fields kept in the metadata column as they are; a record that lacks one gets Mail's default.
_OPTIONAL_FIELDS = ("attributes", "state", "error_message", "remote_host", "remote_addr")
_SCAN = json.JSONDecoder().scan_once


def _json(value: object) -> str:
    """`json.dumps(value)`, to the character: quicker for the text, integers and None that a mail's
    fields hold (a JSONEncoder builds its encoder anew at every call, which costs more than encoding a
    whole payload)."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return encode_basestring_ascii(value)
    if type(value) is int:
        return repr(value)
    return json.dumps(value)


def _decoded(text: str) -> object:
    """`json.loads(text)`, without its Python layers for the text this module wrote: one JSON value, with
    nothing around it. Anything else goes to json.loads, which reads it or says what is wrong."""
    try:
        value, end = _SCAN(text, 0)
        if end == len(text):
            return value
    except (StopIteration, TypeError):
        pass
    return json.loads(text)


@dataclass(frozen=True)
class EnqueuedMail:
    queue: str
    slice_start: int
    bucket: int
    enqueue_id: EnqueueId
    enqueued_time: int
    next_delivery: int
    priority: int
    name: str
    sender: str | None
    recipients: str  # JSON list
    header_blob_id: str
    body_blob_id: str
    metadata: str  # JSON object

    @classmethod
    def of(
        cls,
        mail: Mail,
        queue: str,
        enqueue_id: EnqueueId,
        enqueued_time: int,
        next_delivery: int,
        priority: int,
        slice_start: int,
        bucket: int,
        header_blob_id: BlobId,
        body_blob_id: BlobId,
    ) -> EnqueuedMail:
        # The texts json.dumps would write for the list of recipients and the metadata object.
        recipients = "[" + ", ".join(map(_json, mail.recipients)) + "]"
        headers = [[h.recipient, h.name, h.value] for h in mail.per_recipient_headers]
        metadata = (
            f'{{"attributes": {_json(mail.attributes) if mail.attributes else "{}"}, '
            f'"state": {_json(mail.state)}, "error_message": {_json(mail.error_message)}, '
            f'"remote_host": {_json(mail.remote_host)}, "remote_addr": {_json(mail.remote_addr)}, '
            f'"per_recipient_headers": {_json(headers) if headers else "[]"}, '
            f'"last_updated": {_json(from_datetime(mail.last_updated))}}}'
        )
        return cls(
            queue,
            slice_start,
            bucket,
            enqueue_id,
            enqueued_time,
            next_delivery,
            priority,
            mail.name,
            mail.sender,
            recipients,
            str(header_blob_id),
            str(body_blob_id),
            metadata,
        )

    def row(self) -> tuple:
        return (
            self.queue,
            self.slice_start,
            self.bucket,
            self.enqueue_id,
            self.enqueued_time,
            self.next_delivery,
            self.priority,
            self.name,
            self.sender,
            self.recipients,
            self.header_blob_id,
            self.body_blob_id,
            self.metadata,
        )

    @classmethod
    def from_row(cls, row: tuple) -> EnqueuedMail:
        return cls(*row)

    def to_payload(self, attempts: int = 0) -> str:
        """The broker message; `attempts` counts the deliveries before this message was published (a
        retry after a delay publishes the mail anew, and the count goes on)."""
        # What json.dumps(<the record>, separators=(",", ":")) writes, field by field.
        return (
            f'{{"v":{PAYLOAD_VERSION},"queue":{_json(self.queue)},"slice_start":{_json(self.slice_start)},'
            f'"bucket":{_json(self.bucket)},"enqueue_id":{_json(self.enqueue_id)},'
            f'"enqueued_time":{_json(self.enqueued_time)},"next_delivery":{_json(self.next_delivery)},'
            f'"priority":{_json(self.priority)},"name":{_json(self.name)},"sender":{_json(self.sender)},'
            f'"recipients":{_json(self.recipients)},"header_blob_id":{_json(self.header_blob_id)},'
            f'"body_blob_id":{_json(self.body_blob_id)},"metadata":{_json(self.metadata)},'
            f'"attempts":{_json(attempts)}}}'
        )

    @classmethod
    def from_payload(cls, payload: str) -> BrokerMessage:
        """The mail of a broker message and the deliveries attempted before it was published. Raises
        ValueError (or TypeError) for a message that is not one."""
        record = _decoded(payload)
        if isinstance(record, list):  # the positional row of the versions before the named record
            return BrokerMessage(cls(*record), 0)
        if not isinstance(record, dict) or not isinstance(record.get("v"), int) or record["v"] < 1:
            raise ValueError("not a mail record: no version")
        try:
            mail = cls(
                record["queue"],
                record["slice_start"],
                record["bucket"],
                record["enqueue_id"],
                record["enqueued_time"],
                record.get("next_delivery", record["enqueued_time"]),
                record.get("priority", NORMAL_PRIORITY),
                record["name"],
                record.get("sender"),
                record["recipients"],
                record["header_blob_id"],
                record["body_blob_id"],
                record.get("metadata", "{}"),
            )
        except KeyError as missing:
            raise ValueError(f"mail record without {missing}") from None
        return BrokerMessage(mail, record.get("attempts", 0))

    def to_mail(self, message: bytes) -> Mail:
        metadata = _decoded(self.metadata)
        optional = {key: metadata[key] for key in _OPTIONAL_FIELDS if key in metadata}
        if "per_recipient_headers" in metadata:
            optional["per_recipient_headers"] = tuple(
                PerRecipientHeader(*h) for h in metadata["per_recipient_headers"]
            )
        if "last_updated" in metadata:
            optional["last_updated"] = to_datetime(metadata["last_updated"])
        return Mail.stored(_decoded(self.recipients), message, self.sender, self.name, **optional)

    @property
    def recipient_list(self) -> list[str]:
        return json.loads(self.recipients)


class BrokerMessage(NamedTuple):
    mail: EnqueuedMail
    attempts: int  # deliveries attempted before the message was published


class SliceSize(NamedTuple):
    slice_start: int
    size: int  # live mails by the slice's counters


@dataclass(frozen=True)
class DeadLetter:
    queue: str
    enqueue_id: str
    reason: str
    died_at: int
    payload: str


@dataclass(frozen=True)
class DeadLetterSummary:
    count: int
    oldest_died_at: int | None  # None when there is none


class DeadLetterReason(NamedTuple):
    reason: str
    died_at: int


@dataclass(frozen=True)
class DelayedMail:
    queue: str
    enqueue_id: str
    due: int
    priority: int
    payload: str


class HeldMail(NamedTuple):
    """A mail an operator holds (held_mails). `payload` is the broker payload of its last delivery that
    a consumer parked here instead of delivering it (None until one is parked), which its release hands
    back; `parks` counts those parkings, the version a release's compare-and-set checks."""

    queue: str
    enqueue_id: str
    held_at: int
    parks: int
    payload: str | None


class DestinationCount(NamedTuple):
    """Mails of one destination domain in one state, enqueued in the slot starting at `slot`: a change
    of the count when written, the count when read (destination_counters)."""

    domain: str
    # "queued": never retried; "deferred": waiting for a retry (or its first delay); "held": by an operator
    state: str
    slot: int
    mails: int


class DestinationNote(NamedTuple):
    """The last failure remote delivery met at a destination domain, and when it tries next (None: it
    bounced, no retry is due)."""

    domain: str
    error: str
    noted_at: int
    next_attempt: int | None


class Suspension(NamedTuple):
    """A destination domain an operator suspended: remote delivery defers its mails until `until`."""

    domain: str
    until: int


class DomainBounce(NamedTuple):
    """An operator's bounce of a destination domain: remote delivery returns to their senders, with
    `reason`, the mails for it enqueued up to `until` (the bounce's time, or the end of its window)."""

    domain: str
    reason: str
    until: int


@dataclass(frozen=True)
class DelayedSummary:
    waiting: int  # due after `now`
    oldest_waiting: str | None  # the smallest enqueue id among them
    next_due: int | None
    fallen_due: int  # due at `now` or earlier, not handed to the broker yet


class GenerationStart(NamedTuple):
    """A reference generation or GC iteration, as its event in `generations`."""

    number: int
    started_at: int


class SizedBlob(NamedTuple):
    blob_id: BlobId
    size: int


class BlobReference(NamedTuple):
    owner: str
    generation: int


class BlobDeletion(NamedTuple):
    deleted_at: int
    gc_iteration: int
    owner: str | None  # None in rows written before deletions named their owner


class DeletionRow(NamedTuple):
    """One row of `blob_deletions`, by its key."""

    blob_id: BlobId
    deleted_at: int


class DeletionSpan(NamedTuple):
    count: int
    oldest: int | None  # deleted_at; None when count is 0
    newest: int | None


class MailboxRow(NamedTuple):
    mailbox_id: str
    user: str
    name: str


class MessageRow(NamedTuple):
    header_blob_id: str
    body_blob_id: str
    size: int
    internal_date: int  # when the message was stored (microseconds), IMAP's INTERNALDATE


class Placement(NamedTuple):
    """Where the source of truth puts a message: its mailbox and its uid there."""

    mailbox_id: str
    uid: int


class UidEntry(NamedTuple):
    """What the source of truth holds at a mailbox's uid."""

    message_id: str
    flags: str  # space-separated, sorted


class ProjectionRow(NamedTuple):
    """A row of `message_id_table`."""

    uid: int
    message_id: str
    flags: str


class CounterValues(NamedTuple):
    count: int
    unseen: int
