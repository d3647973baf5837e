"""The writes of the mailbox API (mailboxes.py), each in record 23's crash-safe order: append, flag, move,
expunge, and the release of an orphan's content."""

from __future__ import annotations

import builtins
from collections.abc import Iterable

from .blobs.dedup import DeduplicatingBlobStore
from .clock import Clock
from .errors import InvalidInput, UnknownMailbox
from .faults import (
    APPEND_AFTER_CONTENT,
    APPEND_AFTER_MESSAGE_ROW,
    APPEND_AFTER_PROJECTION,
    APPEND_AFTER_SOURCE_OF_TRUTH,
    APPEND_AFTER_UID,
    EXPUNGE_AFTER_COUNTERS,
    EXPUNGE_AFTER_MESSAGE_ROW,
    EXPUNGE_AFTER_PROJECTION,
    EXPUNGE_AFTER_SOURCE_OF_TRUTH,
    FLAG_AFTER_PROJECTION,
    FLAG_AFTER_SOURCE_OF_TRUTH,
    MOVE_AFTER_PROJECTION,
    MOVE_AFTER_SOURCE_OF_TRUTH,
    MOVE_AFTER_TARGET,
    ORPHAN_AFTER_MESSAGE_ROW,
    FaultInjector,
)
from .mailbox import (
    Appended,
    MailboxRef,
    MailboxTables,
    check_uid,
    entry_at,
    existing,
    loaded_flags,
    parse_flags,
    stored_flags,
    unseen_count,
)
from .model import MailboxId, MessageId, check_message, split_message
from .unit_of_work import UnitOfWork


class MessageWrites:
    def __init__(
        self,
        tables: MailboxTables,
        blobs: DeduplicatingBlobStore,
        clock: Clock,
        max_message_size: int,
        faults: FaultInjector,
        work: UnitOfWork,
    ) -> None:
        self.tables = tables
        self.blobs = blobs
        self.clock = clock
        self.max_message_size = max_message_size
        self.faults = faults
        self.work = work

    def append(
        self, mailbox: MailboxRef, message: bytes, flags: Iterable[str] = (), *, message_id: str | None = None
    ) -> Appended:
        """Store the message in the mailbox with the next uid.

        With `message_id`, appending is idempotent: if that message is in the mailbox already, nothing is
        written and its existing uid is returned. (A message in another mailbox is an error: no copies.)

        Crash-safe order: 1. a uid; 2. the content (owner = the message id); 3. the `messages` row; 4. the
        source of truth; 5. the projection; 6. the counters. A crash after 1 leaves a gap in the uids;
        after 2 or 3, content no mailbox holds: appending the same message id again completes the append
        (the delivery worker does), else the orphan sweep releases it; after 4 or 5, record 23's
        inconsistencies, which the counter recomputation repairs.
        """
        mailbox_id = existing(self.tables, mailbox)
        flags = parse_flags(flags)
        message = check_message(message, self.max_message_size)
        message_id = MessageId.generate(self.clock()) if message_id is None else MessageId(message_id)
        with self.work.writes():
            for placed_in, placed in self.tables.placements(message_id):
                if placed_in == mailbox_id:
                    return Appended(message_id, placed)
                raise InvalidInput(f"message {message_id} is already in mailbox {placed_in}")
            uid = self._allocate(mailbox_id)
            placed = self._store(message_id, mailbox_id, uid, message, stored_flags(flags))
        if placed != uid:  # a racing append of this message id placed it first, and counts it
            return Appended(message_id, placed)
        self._list(message_id, mailbox_id, unseen_count(flags))
        return Appended(message_id, uid)

    def append_unplaced(self, mailbox_id: MailboxId, message: bytes, message_id: MessageId) -> None:
        """`append` without flags of a message id that the source of truth placed nowhere when the caller
        read it, to a mailbox it read: the delivery of a mail's copy, which looks for the copy anywhere
        first. Neither is read again: a mailbox gone meanwhile has no uid to allocate (UnknownMailbox,
        nothing written), and a racing append of the copy to it is `_place`'s to find, as in `append`."""
        message = check_message(message, self.max_message_size)
        with self.work.writes():
            uid = self._allocate(mailbox_id)
            placed = self._store(message_id, mailbox_id, uid, message, "")
        if placed == uid:
            self._list(message_id, mailbox_id, 1)

    def _store(
        self, message_id: MessageId, mailbox_id: MailboxId, uid: int, message: bytes, flags: str
    ) -> int:
        """`append`'s steps 2 to 4 after the uid; the uid the message holds in the mailbox."""
        self.faults.reached(APPEND_AFTER_UID)
        header, body = split_message(message)
        header_blob_id, body_blob_id = self.blobs.save_all(message_id, [header, body])
        self.faults.reached(APPEND_AFTER_CONTENT)
        self.tables.save_message(
            message_id, str(header_blob_id), str(body_blob_id), len(message), self.clock()
        )
        self.faults.reached(APPEND_AFTER_MESSAGE_ROW)
        return self._place(message_id, mailbox_id, uid, flags)

    def _list(self, message_id: MessageId, mailbox_id: MailboxId, unseen: int) -> None:
        """`append`'s steps 5 and 6 after the source of truth."""
        self.faults.reached(APPEND_AFTER_SOURCE_OF_TRUTH)
        self.tables.project(message_id, mailbox_id)
        self.faults.reached(APPEND_AFTER_PROJECTION)
        self.tables.add_to_counters(mailbox_id, 1, unseen)

    def set_flags(
        self, mailbox: MailboxRef, uid: int, add: Iterable[str] = (), remove: Iterable[str] = ()
    ) -> frozenset[str]:
        """Add then remove flags of the message at `uid`; returns its new flags.

        Crash-safe order: 1. the source of truth, by compare-and-set against the flags read (so the unseen
        delta counted in 3 is exact under concurrent changes: a lost race reads again); 2. the projection;
        3. the counters. A crash after 1 or 2 leaves record 23's inconsistencies, which the counter
        recomputation repairs.
        """
        mailbox_id = existing(self.tables, mailbox)
        uid = check_uid(uid)
        add, remove = parse_flags(add), parse_flags(remove)
        if add & remove:
            raise InvalidInput(f"flags both added and removed: {', '.join(sorted(add & remove))}")
        while True:
            message_id, stored = entry_at(self.tables, mailbox_id, uid)
            old = loaded_flags(stored)
            new = (old | add) - remove
            if new == old:
                return new
            if self.tables.set_source_flags(message_id, mailbox_id, stored_flags(new), stored):
                break
        self.faults.reached(FLAG_AFTER_SOURCE_OF_TRUTH)
        self.tables.project(message_id, mailbox_id)
        self.faults.reached(FLAG_AFTER_PROJECTION)
        self.tables.add_to_counters(mailbox_id, 0, unseen_count(new) - unseen_count(old))
        return new

    def move(self, source: MailboxRef, uid: int, target: MailboxRef) -> int:
        """Move the message at `uid` of `source` to `target`, flags kept; returns its uid in `target`.

        Crash-safe order: 1. the target's source-of-truth entry (with a new uid); 2. the removal of the
        source's; 3. the projections; 4. the counters. The message is never in neither mailbox: a crash
        after 1 leaves it in both, and the move run again finds it in the target and completes;
        after 2 or 3, record 23's inconsistencies, which the counter recomputation repairs.
        """
        source_id, target_id = existing(self.tables, source), existing(self.tables, target)
        uid = check_uid(uid)
        if source_id == target_id:
            raise InvalidInput(f"cannot move a message of mailbox {source_id} to itself")
        with self.work.writes():
            message_id, stored = entry_at(self.tables, source_id, uid)
            new_uid = self._placement(message_id, target_id)  # an earlier move that died half-way
            if new_uid is None:
                new_uid = self._place(message_id, target_id, self._allocate(target_id), stored)
            self.faults.reached(MOVE_AFTER_TARGET)
            self.tables.remove_from_source_of_truth(source_id, uid)
        self.faults.reached(MOVE_AFTER_SOURCE_OF_TRUTH)
        with self.work.writes():
            self.tables.unproject(source_id, uid)
            self.tables.project(message_id, target_id)
        self.faults.reached(MOVE_AFTER_PROJECTION)
        unseen = unseen_count(loaded_flags(stored))
        with self.work.writes():
            self.tables.add_to_counters(source_id, -1, -unseen)
            self.tables.add_to_counters(target_id, 1, unseen)
        return new_uid

    def expunge(self, mailbox: MailboxRef, uids: Iterable[int]) -> int:
        """Remove the messages at `uids`; a message in no mailbox any more releases its blobs.
        Returns how many were removed. An unknown uid among them removes none."""
        mailbox_id = existing(self.tables, mailbox)
        if isinstance(uids, int):
            raise InvalidInput("expunge takes a collection of uids; wrap a single uid in a list")
        return self.expunge_uids(mailbox_id, [check_uid(uid) for uid in uids], strict=True)

    def expunge_uids(self, mailbox_id: MailboxId, uids: builtins.list[int], *, strict: bool) -> int:
        """Crash-safe order: 1. the source of truth; 2. the projection; 3. the counters; 4. for each message
        now in no mailbox, its content (`_discard`). A crash after 1 or 2 leaves record 23's
        inconsistencies, which the counter recomputation repairs; after 3, content that no mailbox holds,
        which the orphan sweep releases."""
        removed: builtins.list[tuple[int, str, frozenset[str]]] = []
        chosen = sorted(set(uids))
        with self.work.writes():
            if strict:
                for uid in chosen:
                    entry_at(self.tables, mailbox_id, uid)
            for uid in chosen:
                entry = self.tables.remove_from_source_of_truth(mailbox_id, uid)
                if entry is not None:  # None: another operation took it meanwhile
                    removed.append((uid, entry[0], loaded_flags(entry[1])))
        if not removed:
            return 0
        self.faults.reached(EXPUNGE_AFTER_SOURCE_OF_TRUTH)
        with self.work.writes():
            for uid, _, _ in removed:
                self.tables.unproject(mailbox_id, uid)
        self.faults.reached(EXPUNGE_AFTER_PROJECTION)
        unseen = sum(unseen_count(flags) for _, _, flags in removed)
        self.tables.add_to_counters(mailbox_id, -len(removed), -unseen)
        self.faults.reached(EXPUNGE_AFTER_COUNTERS)
        for _, message_id, _ in removed:
            self._discard(message_id)
        return len(removed)

    def release_orphan(self, owner: str) -> int:
        """Release the content of an owner that the orphan sweep found nowhere: a message id whose append
        or expunge died half-way, or an enqueue id whose enqueue did. Returns how many references were
        released.

        The sweep's scan may be older than what it found, so this checks again: an owner with a
        reference of a generation not yet eligible may be in the middle of a write, and a message id a
        mailbox holds is not an orphan; both are left alone (0).

        Crash-safe order: 1. the owner's `messages` row, if any; 2. its references (deletions appended).
        A crash after 1 leaves references the next sweep releases.
        """
        held = self.blobs.references_of(owner)
        newest_eligible = self.blobs.generations.current() - 2
        if not held or any(b.generation > newest_eligible for b in held) or self.tables.placements(owner):
            return 0
        with self.work.writes():
            self.tables.delete_message(owner)
            self.faults.reached(ORPHAN_AFTER_MESSAGE_ROW)
            return self.blobs.release(owner, held)

    def _discard(self, message_id: str) -> int:
        """Drop the content of a message that no mailbox holds; how many references were released.

        Crash-safe order: 1. the `messages` row; 2. the references (deletions appended). A crash after 1
        leaves references whose owner exists nowhere, which the orphan sweep releases."""
        with self.work.writes():
            if self.tables.placements(message_id):
                return 0
            self.tables.delete_message(message_id)
            self.faults.reached(EXPUNGE_AFTER_MESSAGE_ROW)
            return self.blobs.release(message_id)

    def _allocate(self, mailbox_id: MailboxId) -> int:
        uid = self.tables.allocate_uid(mailbox_id)
        if uid is None:
            raise UnknownMailbox(f"mailbox {mailbox_id} was deleted")
        return uid

    def _placement(self, message_id: str, mailbox_id: MailboxId) -> int | None:
        """The message's uid in the mailbox; None if it is not there."""
        return dict(self.tables.placements(message_id)).get(mailbox_id)

    def _place(self, message_id: str, mailbox_id: MailboxId, uid: int, flags: str) -> int:
        """Add the message to the mailbox's source of truth at `uid`; returns the uid it holds there (that
        of a racing placement of the same message, if that one came first). A mailbox deleted meanwhile
        gets its entry taken back, and the caller UnknownMailbox: the deletion checks for entries only
        once, so one written after that check must not stay."""
        while not self.tables.add_to_source_of_truth(message_id, mailbox_id, uid, flags):
            placed = self._placement(message_id, mailbox_id)
            if placed is not None:
                return placed
        if self.tables.mailbox(mailbox_id) is None:
            self.tables.remove_from_source_of_truth(mailbox_id, uid)
            raise UnknownMailbox(f"mailbox {mailbox_id} was deleted")
        return uid
