"""A mail as the queue stores it: the row of `enqueued_mails`, which is also the message the broker carries
(James's MailReferenceDTO), so a dequeue needs only the broker message and the blobs."""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from .clock import from_datetime, to_datetime
from .model import BlobId, EnqueueId, Mail, PerRecipientHeader


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

    def to_payload(self) -> str:
        return json.dumps(self.row())

    @classmethod
    def from_payload(cls, payload: str) -> EnqueuedMail:
        return cls(*json.loads(payload))

    def to_mail(self, message: bytes) -> Mail:
        metadata = json.loads(self.metadata)
        return Mail(
            recipients=tuple(json.loads(self.recipients)),
            message=message,
            sender=self.sender,
            name=self.name,
            attributes=metadata["attributes"],
            state=metadata["state"],
            error_message=metadata["error_message"],
            remote_host=metadata["remote_host"],
            remote_addr=metadata["remote_addr"],
            per_recipient_headers=tuple(PerRecipientHeader(*h) for h in metadata["per_recipient_headers"]),
            last_updated=to_datetime(metadata["last_updated"]),
        )

    @property
    def recipient_list(self) -> list[str]:
        return json.loads(self.recipients)


class QueueView(Protocol):
    """The tables of records 31 and 32, one implementation per store."""

    def transaction(self): ...
    def turn(self) -> AbstractContextManager: ...
    def queue_names(self) -> list[str]: ...
    def create_queue(self, queue: str, browse_start: int, now: int) -> None: ...
    def queue_exists(self, queue: str) -> bool: ...
    # The first insert into a queue creates it, browse_start and content_start at the mail's slice.
    def insert(self, mail: EnqueuedMail) -> None: ...
    def mark_deleted(self, queue: str, enqueue_id: str, slice_start: int) -> bool: ...
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
