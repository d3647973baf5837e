"""The named hooks of the contract suite: what a test asks of a deployment that no user API shows.

Tests observe through what a user has (the queue's browse, size, overview and dead letters, the
mailboxes, `Runtime.blobs`, the generations, the CLI). A few states stay out of their sight: what a crash
left half-written, the broker's messages and leases, record 39's bookkeeping, the projection and the
counters of record 23 beside their source of truth. `Probes` names each such question once, and the hooks
that damage a deployment on purpose; every deployment's backend (backends.py) answers them in its own
terms, and nothing else in the tests reads SQL or CQL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class QueueRows:
    """A queue's rows in the view (record 31): the `enqueued_mails` rows by slice start, the buckets
    holding them, its `deleted_mails` marks and the slices it keeps counters of."""

    slices: dict[int, int]  # slice start -> rows
    buckets: frozenset[int]
    deletion_marks: int
    counted_slices: list[int]

    def rows(self, *, slices_before: int | None = None) -> int:
        """The view rows, all or those of the slices starting before a moment."""
        return sum(n for start, n in self.slices.items() if slices_before is None or start < slices_before)


@dataclass(frozen=True)
class BlobState:
    """Record 39's bookkeeping: blob rows with their generation, references (owner, blob id, generation)
    in the order they were written, deletions (blob id, generation, GC iteration) with repeats, and the
    blob ids whose content the blob store holds."""

    blobs: dict[str, int]
    references: list[tuple[str, str, int]]
    deletions: list[tuple[str, int, int]] = field(default_factory=list)
    contents: frozenset[str] = frozenset()

    def held(self) -> dict[str, set[str]]:
        """owner -> the blob ids it references."""
        held: dict[str, set[str]] = {}
        for owner, blob_id, _ in self.references:
            held.setdefault(owner, set()).add(blob_id)
        return held

    def referenced(self) -> set[str]:
        return {blob_id for _, blob_id, _ in self.references}

    def deleted(self) -> list[str]:
        """The blob id of every deletion, repeated ones included."""
        return sorted(blob_id for blob_id, _, _ in self.deletions)


@dataclass(frozen=True)
class MailboxState:
    """Record 23's tables side by side: the mailbox ids, (mailbox id, uid, message id, flags) of the
    source of truth and of the projection, the stored counters (count, unseen) by mailbox, and each
    stored message's (header, body) blob ids."""

    mailboxes: set[str]
    source_of_truth: set[tuple[str, int, str, str]]
    projection: set[tuple[str, int, str, str]]
    counters: dict[str, tuple[int, int]]
    messages: dict[str, tuple[str, str]]

    def placed(self) -> set[str]:
        """The message ids the source of truth places in a mailbox."""
        return {message_id for _, _, message_id, _ in self.source_of_truth}


class Probes(Protocol):
    """The questions a test asks of a deployment beyond the public API, and the damage it does on purpose."""

    # Observing -----------------------------------------------------------------------------------------

    def exists(self) -> bool:
        """Whether anything of the deployment's store is there."""

    def state(self) -> object:
        """Everything the deployment holds, comparable: equal before and after means nothing changed."""

    def broker_messages(self) -> int:
        """How many messages the broker holds, deliverable or leased, over every queue."""

    def leases(self) -> list[tuple]:
        """Who may deliver what from when, for every message the broker holds: equal before and after
        means no lease was taken, extended or given back."""

    def queue_rows(self, queue: str) -> QueueRows: ...

    def blob_state(self) -> BlobState: ...

    def mailbox_state(self) -> MailboxState: ...

    def uids_in_write_order(self, mailbox_id: str) -> list[int]:
        """A mailbox's uids in the source of truth, in the order they were written."""

    # Damaging ------------------------------------------------------------------------------------------

    def lose_broker_message(self, queue: str, enqueue_id: str) -> None:
        """What a broker outage can do: the message is gone while the view still holds the mail."""

    def corrupt_broker_message(self, queue: str, enqueue_id: str) -> None:
        """A message whose payload no longer decodes (a bug in another version, a bad manual edit)."""

    def lose_content(self, blob_id: str) -> None:
        """The blob store lost a blob's content."""

    def damage_blob_rows(self, *, lose: str | None = None, add: tuple[str, int] | None = None) -> None:
        """A blob's row gone while its references stay (`lose`), or a (blob id, generation) row that
        nothing references nor deleted (`add`)."""

    def add_reference(self, owner: str, blob_id: str, generation: int) -> None:
        """A reference written behind the blob store's back (to a blob collected, say)."""

    def miscount_slice(self, queue: str, slice_start: int, extra: int) -> None:
        """A slice's counter of enqueued mails is off by `extra`."""

    def move_starts(
        self, queue: str, *, browse_start: int | None = None, content_start: int | None = None
    ) -> None:
        """A queue's browse_start and content_start set to any moment, live mails or not."""

    def lose_counters(self, mailbox_id: str) -> None:
        """A mailbox's counters read as none."""

    def put_projection_entry(self, mailbox_id: str, uid: int, message_id: str, flags: str) -> None:
        """A projection entry written (or overwritten) directly, ignoring the source of truth."""

    def as_older_version(self, lacking: str) -> None:
        """The store as an older version of mailq left it: without the table `lacking` names, or without
        the column of a `table.column` (its rows kept)."""
