"""A mail as the queue stores it: the row of `enqueued_mails`, which is also the message the broker carries
(James's MailReferenceDTO), so a dequeue needs only the broker message and the blobs.

The broker message is a named, versioned record: a JSON object with `"v": 1` and the row's fields by name
(`recipients` and `metadata` as the JSON texts the row holds, which spares a decode and an encode on the
hot path), plus `attempts`. A reader ignores the fields it does not know and fills defaults for the
optional ones it misses, so a field added later never makes a message in flight unreadable; the
positional JSON array of earlier versions is still read, so the mails in flight across an upgrade are
delivered.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Protocol

from .clock import from_datetime, to_datetime
from .model import NORMAL_PRIORITY, BlobId, EnqueueId, Mail, PerRecipientHeader

PAYLOAD_VERSION = 1
_ENCODER = json.JSONEncoder(separators=(",", ":"))
# Mail fields kept in the metadata column as they are; a record that lacks one gets Mail's default.
_OPTIONAL_FIELDS = ("attributes", "state", "error_message", "remote_host", "remote_addr")


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
        metadata = {
            "attributes": mail.attributes,
            "state": mail.state,
            "error_message": mail.error_message,
            "remote_host": mail.remote_host,
            "remote_addr": mail.remote_addr,
            "per_recipient_headers": [[h.recipient, h.name, h.value] for h in mail.per_recipient_headers],
            "last_updated": from_datetime(mail.last_updated),
        }
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
            json.dumps(list(mail.recipients)),
            str(header_blob_id),
            str(body_blob_id),
            json.dumps(metadata),
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
        return _ENCODER.encode(
            {
                "v": PAYLOAD_VERSION,
                "queue": self.queue,
                "slice_start": self.slice_start,
                "bucket": self.bucket,
                "enqueue_id": self.enqueue_id,
                "enqueued_time": self.enqueued_time,
                "next_delivery": self.next_delivery,
                "priority": self.priority,
                "name": self.name,
                "sender": self.sender,
                "recipients": self.recipients,
                "header_blob_id": self.header_blob_id,
                "body_blob_id": self.body_blob_id,
                "metadata": self.metadata,
                "attempts": attempts,
            }
        )

    @classmethod
    def from_payload(cls, payload: str) -> tuple[EnqueuedMail, int]:
        """The mail of a broker message and the deliveries attempted before it was published. Raises
        ValueError (or TypeError) for a message that is not one."""
        record = json.loads(payload)
        if isinstance(record, list):  # the positional row of the versions before the named record
            return cls(*record), 0
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
        return mail, record.get("attempts", 0)

    def to_mail(self, message: bytes) -> Mail:
        metadata = json.loads(self.metadata)
        optional = {key: metadata[key] for key in _OPTIONAL_FIELDS if key in metadata}
        if "per_recipient_headers" in metadata:
            optional["per_recipient_headers"] = tuple(
                PerRecipientHeader(*h) for h in metadata["per_recipient_headers"]
            )
        if "last_updated" in metadata:
            optional["last_updated"] = to_datetime(metadata["last_updated"])
        return Mail(
            recipients=tuple(json.loads(self.recipients)),
            message=message,
            sender=self.sender,
            name=self.name,
            **optional,
        )

    @property
    def recipient_list(self) -> list[str]:
        return json.loads(self.recipients)


class QueueView(Protocol):
    """The tables of records 31 and 32, one implementation per store. Each method commits on its own and
    may be called again after a crash: writes are idempotent or say whether they took effect."""

    def queue_names(self) -> list[str]: ...
    def create_queue(self, queue: str, browse_start: int, now: int) -> None: ...
    def queue_exists(self, queue: str) -> bool: ...
    # The first insert into a queue creates it, browse_start and content_start at the mail's slice.
    def insert(self, mail: EnqueuedMail) -> None: ...
    def mark_deleted(self, queue: str, enqueue_id: str, slice_start: int, bucket: int) -> bool: ...
    def is_live(self, mail: EnqueuedMail) -> bool: ...
    def slices_from(self, queue: str, start: int) -> list[int]: ...
    def live_mails(self, queue: str, slice_start: int) -> list[EnqueuedMail]: ...
    def reschedule(self, mails: list[EnqueuedMail], next_delivery: int) -> None: ...
    def size(self, queue: str, start: int) -> int: ...
    # None until the queue's first enqueue creates it.
    def browse_start(self, queue: str) -> int | None: ...
    def content_start(self, queue: str) -> int | None: ...
    def advance_browse_start(self, queue: str, new_start: int) -> bool: ...
    def mails_before(self, queue: str, start: int, end: int) -> list[str]: ...
    def delete_slices(self, queue: str, start: int, end: int) -> int: ...
    def advance_content_start(self, queue: str, new_start: int) -> None: ...
    def events(self, aggregate: str) -> list[str]: ...
    def append_event(self, aggregate: str, event: str, now: int, position: int) -> bool: ...
