"""The protocols of the metadata tables: what the core asks of a store, one implementation per store
(stores/embedded/ and stores/cassandra/, a module per record's tables on both, of the same name).

Every method commits on its own, and none needs a transaction around it: the core orders the calls of
each write path so that a crash leaves only what a later step heals, and a call may be made again after
a crash: writes are idempotent or say whether they took effect. The records they pass are in
stores/records.py.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from ..model import BlobId
from .records import (
    BlobDeletion,
    BlobReference,
    CounterValues,
    DeadLetter,
    DeadLetterReason,
    DeadLetterSummary,
    DelayedMail,
    DelayedSummary,
    DeletionRow,
    DeletionSpan,
    DestinationCount,
    DestinationNote,
    DomainBounce,
    EnqueuedMail,
    GenerationStart,
    HeldMail,
    MailboxRow,
    MessageRow,
    Placement,
    ProjectionRow,
    SizedBlob,
    SliceSize,
    Suspension,
    UidEntry,
)


class QueueView(Protocol):
    """The tables of records 31 and 32 (queue_view): enqueued_mails, deleted_mails, browse_start,
    content_start, the per-slice counters and the queue list."""

    def queue_names(self) -> list[str]: ...
    def create_queue(self, queue: str, browse_start: int, now: int) -> None: ...
    def queue_exists(self, queue: str) -> bool: ...
    # The first insert into a queue creates it, browse_start and content_start at the mail's slice.
    def insert(self, mail: EnqueuedMail) -> None: ...
    # `insert` each mail: a store may write them in one call.
    def insert_many(self, mails: Sequence[EnqueuedMail]) -> None: ...
    def mark_deleted(self, queue: str, enqueue_id: str, slice_start: int, bucket: int) -> bool: ...
    # A delivered mail's mark and count, in its slice and by `destinations` (its destination counts'
    # changes, destinations.py), `after_mark` run between them; a store may mark it without a transaction
    # and leave a double count or a missed one (to `recount`, for the slice).
    def mark_done(
        self,
        queue: str,
        enqueue_id: str,
        slice_start: int,
        bucket: int,
        after_mark: Callable[[], None],
        destinations: Sequence[DestinationCount] = (),
    ) -> None: ...
    # Correct the slice's counts from its rows and marks, of what no write in flight can still change (on
    # Cassandra, the epochs that settled: stores/cassandra/queue_view.py); the sum of the corrections'
    # sizes. Run under traffic, it never makes a count wrong.
    def recount(self, queue: str, slice_start: int) -> int: ...
    # `current_slice`: a slice start browse_start cannot be past; a mail from there on is live unless
    # marked, which spares a store the read of browse_start.
    def is_live(self, mail: EnqueuedMail, current_slice: int | None = None) -> bool: ...
    def slices_from(self, queue: str, start: int) -> list[int]: ...
    def live_mails(self, queue: str, slice_start: int) -> list[EnqueuedMail]: ...
    def reschedule(self, mails: list[EnqueuedMail], next_delivery: int) -> None: ...
    def size(self, queue: str, start: int) -> int: ...
    # Each slice from `start` on, in order, with its live mails by its counters.
    def slice_sizes(self, queue: str, start: int) -> list[SliceSize]: ...
    # None until the queue's first enqueue creates it.
    def browse_start(self, queue: str) -> int | None: ...
    def content_start(self, queue: str) -> int | None: ...
    def advance_browse_start(self, queue: str, new_start: int) -> bool: ...
    def mails_before(self, queue: str, start: int, end: int) -> list[str]: ...
    def delete_slices(self, queue: str, start: int, end: int) -> int: ...
    def advance_content_start(self, queue: str, new_start: int) -> None: ...


class ConfigurationEvents(Protocol):
    """The event log of the queue view configuration (configuration): an aggregate's events in order."""

    def events(self, aggregate: str) -> list[str]: ...
    def append_event(self, aggregate: str, event: str, now: int, position: int) -> bool:
        """Append `event` as the aggregate's event number `position` (counted from 0), only if it holds
        exactly `position` events: a compare-and-set in one step (the embedded store's transaction, a
        lightweight transaction on Cassandra). False, and nothing appended, if another event got there."""
        ...


class DeadLetters(Protocol):
    """Dead letters as records of the metadata store (dead_letters), like James's mail repositories: a
    queue's mails that will never be delivered, each with its reason and its broker payload (and so its
    content's blob ids, whose references its enqueue id keeps), until an operator requeues or purges it.

    A letter is keyed by its queue and enqueue id: adding one again replaces it, so dead-lettering is
    idempotent, and a queue's letters are listed by enqueue id, which is enqueue order. `summary` and
    `reasons` read a queue's letters without their payloads, for the overviews an operator reads."""

    def add(self, letter: DeadLetter) -> None: ...
    def list(self, queue: str) -> builtins.list[DeadLetter]: ...
    def get(self, queue: str, enqueue_id: str) -> DeadLetter | None: ...
    def remove(self, queue: str, enqueue_id: str) -> None: ...
    def summary(self, queue: str) -> DeadLetterSummary:
        """How many letters the queue holds and when the longest-kept one died."""
        ...

    def reasons(self, queue: str) -> builtins.list[DeadLetterReason]:
        """The reason and death time of each of the queue's letters."""
        ...


class DelayedMails(Protocol):
    """Delayed mails as records of the metadata store (delayed_mails), so that every broker offers delays
    of any length and a working flush: a mail is held here, keyed by its due time, until a publisher hands
    it to the broker (`queue.publisher.publish_due`). A delayed mail is keyed by (queue, due, enqueue id): the
    same mail delayed again (a retry) is a second record."""

    def add(self, mail: DelayedMail) -> None:
        """Hold the mail until `mail.due`; adding it again changes nothing."""
        ...

    def due(self, queue: str, now: int, limit: int) -> list[DelayedMail]:
        """At most `limit` of the queue's mails due at `now` or earlier, by due time then enqueue id:
        what the publisher publishes next."""
        ...

    def remove(self, mail: DelayedMail) -> None:
        """Drop the mail once published (nothing if absent), so publishing is at-least-once."""
        ...

    def get(self, queue: str, due: int, enqueue_id: str) -> DelayedMail | None:
        """The mail delayed until `due`, if it still waits (one key's read)."""
        ...

    def all(self, queue: str) -> list[DelayedMail]:
        """Every mail the queue holds, in the order of `due`, for a flush."""
        ...

    def summary(self, queue: str, now: int) -> DelayedSummary:
        """How many wait (due after `now`), the smallest enqueue id (the oldest mail) among them and the
        next due time, and how many fell due and wait for a publisher, counted by the store without
        reading the payloads."""
        ...


class HeldMails(Protocol):
    """The mails an operator holds (held_mails), keyed by queue and enqueue id. A held mail stays in the
    view; a consumer that receives it parks its payload here and acks it (`park`), and its release hands
    the payload back. `park` and `release` are compare-and-sets on `parks`, so a release never drops a
    payload a consumer parked after the release read the row."""

    def hold(self, queue: str, enqueue_id: str, now: int) -> bool:
        """Hold the mail; False, and nothing written, if it is held already."""
        ...

    def get(self, queue: str, enqueue_id: str) -> HeldMail | None: ...
    def any_held(self, queue: str) -> bool:
        """Whether the queue has a held row at all."""
        ...

    def park(self, held: HeldMail, payload: str) -> bool:
        """Keep `payload` in the held row, only if its `parks` is still `held.parks`."""
        ...

    def release(self, held: HeldMail) -> bool:
        """Drop the held row, only if its `parks` is still `held.parks`."""
        ...

    def list(self, queue: str) -> builtins.list[HeldMail]: ...


class Destinations(Protocol):
    """Per destination domain (destination_counters, destination_notes): a queue's mails by state and
    enqueue-time slot, counted as they move (never read from the mails), and remote delivery's last
    failure there, and the domains an operator suspended or bounced (destination_suspensions,
    destination_bounces). Counts are changed by adding; a count that reaches 0 may be dropped. Beside
    them, the slots and send windows of remote delivery's per-destination limits."""

    def count(self, queue: str, changes: Sequence[DestinationCount]) -> None: ...
    def counts(self, queue: str) -> list[DestinationCount]: ...
    def note(self, queue: str, note: DestinationNote) -> None: ...
    def notes(self, queue: str) -> list[DestinationNote]: ...
    def suspend(self, queue: str, suspension: Suspension) -> None: ...
    def resume(self, queue: str, domain: str) -> None: ...
    def suspensions(self, queue: str) -> list[Suspension]: ...
    def bounce(self, queue: str, bounce: DomainBounce) -> None: ...
    def bounces(self, queue: str) -> list[DomainBounce]: ...
    # Remote delivery's limits (relay/limits.py), per destination whatever the queue: connection slots
    # (destination_slots) and mails per window (destination_sends), each taken by a conditional write.
    def take_slot(self, destination: str, slots: int, holder: str, now: int, lease: int) -> int | None:
        """One of the destination's slots 0..`slots`-1 that no one holds (or whose lease ended), now
        `holder`'s until `now` + `lease`; None when all are held."""
        ...

    def renew_slot(self, destination: str, slot: int, holder: str, now: int, lease: int) -> bool:
        """Extend `holder`'s lease of the slot to `now` + `lease`; False if it is no longer `holder`'s."""
        ...

    def free_slot(self, destination: str, slot: int, holder: str) -> None: ...
    def take_send(self, destination: str, window: int, length: int, mails: int) -> bool:
        """Count one more mail in the destination's window starting at `window` (`length` long), only
        while it counts fewer than `mails`."""
        ...


class BlobTables(Protocol):
    """Record 39's tables (blobs): generations, blobs, blob_references and blob_deletions."""

    def current(self, kind: str) -> int | None: ...
    def emit(self, kind: str, number: int, now: int) -> bool:
        """Append event `number` of `kind`; False if it was emitted already (by a racing rotation)."""
        ...

    def history(self, kind: str) -> list[GenerationStart]: ...
    def sizes(self, blob_ids: Iterable[BlobId]) -> dict[BlobId, int]:
        """The size of each blob that has a row in `blobs`."""
        ...

    def add_blobs(self, blobs: Sequence[SizedBlob], now: int) -> None:
        """Rows in `blobs`, those present already kept as they are."""
        ...

    def add_references(self, owner: str, blob_ids: Sequence[BlobId]) -> None:
        """The owner's references to the blobs; those present already are kept."""
        ...

    def add_references_of(self, references: Sequence[tuple[str, Sequence[BlobId]]]) -> None:
        """`add_references` for each owner and its blobs: a store may write them in one call."""
        ...

    def references_of(self, owner: str) -> list[BlobId]: ...
    def referenced(self, blob_ids: Sequence[BlobId]) -> set[BlobId]:
        """Those of the blobs that at least one reference names (looked up by blob id)."""
        ...

    def add_deletions(self, owner: str, blob_ids: Sequence[BlobId], gc_iteration: int, now: int) -> None:
        """Append one deletion a blob id, naming the owner that released it (repeated ones too: the GC
        counts blob ids, not deletions)."""
        ...

    def remove_references(self, owner: str, blob_ids: Sequence[BlobId]) -> None: ...
    def deletion_backlog(self, max_generation: int, newly_eligible_above: int, since: int) -> DeletionSpan:
        """The deletions of generations up to `max_generation` that were appended after `since`, or all
        of a generation above `newly_eligible_above`."""
        ...

    def forget(self, blob_ids: Iterable[BlobId]) -> None:
        """Drop the blobs' rows from `blobs` and `blob_deletions`."""
        ...

    def retire_deletions(self, rows: Sequence[DeletionRow]) -> None:
        """Drop exactly these deletion rows, in the blob id's generation; the blob's other deletion rows
        stay."""
        ...

    def references_to(self, blob_id: BlobId) -> list[BlobReference]:
        """Every reference to the blob, by owner (looked up by blob id)."""
        ...

    def deletions_of(self, blob_id: BlobId) -> list[BlobDeletion]:
        """Every deletion row of the blob, oldest first."""
        ...


class MailboxTables(Protocol):
    """Record 23's tables (mailboxes): mailboxes, messages, imap_uid_table (the source of truth),
    message_id_table (the projection by mailbox and uid) and mailbox_counters."""

    def create_mailbox(self, mailbox_id: str, user: str, name: str) -> bool: ...
    def find_mailbox(self, user: str, name: str) -> MailboxRow | None: ...
    def mailbox(self, mailbox_id: str) -> MailboxRow | None: ...
    def mailboxes(self, user: str | None) -> list[MailboxRow]: ...
    def allocate_uid(self, mailbox_id: str) -> int | None: ...
    def delete_mailbox(self, mailbox_id: str) -> bool: ...
    def save_message(
        self, message_id: str, header_blob_id: str, body_blob_id: str, size: int, now: int
    ) -> None: ...
    def message(self, message_id: str) -> MessageRow | None: ...
    def delete_message(self, message_id: str) -> None: ...
    def placements(self, message_id: str) -> list[Placement]: ...
    def entry(self, mailbox_id: str, uid: int) -> UidEntry | None: ...
    def uids(self, mailbox_id: str) -> list[int]: ...
    def add_to_source_of_truth(self, message_id: str, mailbox_id: str, uid: int, flags: str) -> bool: ...
    def set_source_flags(self, message_id: str, mailbox_id: str, flags: str, expected: str) -> bool:
        """Compare-and-set: the entry's flags become `flags` only if they still are `expected`."""
        ...

    def remove_from_source_of_truth(self, mailbox_id: str, uid: int) -> UidEntry | None: ...
    def project(self, message_id: str, mailbox_id: str) -> None: ...
    def unproject(self, mailbox_id: str, uid: int) -> None: ...
    def projection(self, mailbox_id: str) -> list[ProjectionRow]: ...
    def add_to_counters(self, mailbox_id: str, count: int, unseen: int) -> None: ...
    def counters(self, mailbox_id: str) -> CounterValues | None: ...
    def heal_projection(self, mailbox_id: str, message_id: str) -> None: ...
    def reset_counters(
        self, mailbox_id: str, count: int, unseen: int, observed: CounterValues | None
    ) -> bool: ...
    def sample_mailboxes(self, size: int) -> builtins.list[str]: ...
    def recount(self, mailbox_id: str) -> CounterValues: ...
