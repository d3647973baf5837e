"""Mailboxes, their messages, flags and counters: the denormalised tables of record 23.

No operation assumes a transaction: every table call commits on its own, in record 23's order,

1. `imap_uid_table`, the source of truth (message id, mailbox -> uid, flags);
2. `message_id_table`, the projection that lists a mailbox's messages by uid;
3. `mailbox_counters`, the projection of count and unseen (messages without \\Seen),

which is all the Cassandra store (no multi-table transactions) can do. A process dying between the
writes leaves exactly the inconsistencies record 23 is about: a projection row missing or outdated, a
counter off by the messages in flight. The counter recomputation repairs them from the source of truth;
`faults.FaultInjector` reproduces them in tests. Projection rows are written as copies of the source of
truth at the time of writing, so concurrent flag changes converge instead of racing.

The content comes before a message's first source-of-truth entry and goes after its last one: its blobs
(saved through the deduplicating store, owner = the message id) and its `messages` row are written
first, and released last. A message in a mailbox thus always has its content; a crash in between leaves
content of a message id that no mailbox holds, which the orphan sweep releases (a message id owns its
references while the source of truth places it). `group_writes` may group the writes of one step (the
embedded store's transaction): faster, and never needed for correctness.

UIDs come from an atomic increment of `mailboxes.next_uid` (one `UPDATE ... RETURNING` on the embedded
store, a lightweight transaction on Cassandra), so they are distinct and strictly increase per mailbox
across threads and processes; grouped with the entry that uses it (the embedded store), a uid also
commits in uid order. A message is in one mailbox at a time: there is move, not copy. Two operations
racing on one message are not isolated from each other (as in James on Cassandra): each completes its
own writes, and the recomputation repairs the projections.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import NamedTuple

from .blobs.dedup import DeduplicatingBlobStore, GroupWrites
from .clock import Clock
from .errors import InvalidInput, UnknownMailbox, shown
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
from .model import MAX_COUNT, MailAddress, MailboxId, MessageId, check_message
from .queue import split_message
from .stores.protocols import MailboxTables

INBOX = "INBOX"
DELIMITER = "."
SEEN = "\\Seen"
SYSTEM_FLAGS = ("\\Answered", "\\Deleted", "\\Draft", "\\Flagged", SEEN)
_SYSTEM_FLAGS = {flag.lower(): flag for flag in SYSTEM_FLAGS}
# RFC 3501 flag-keyword = atom: printable ASCII except the atom-specials ( ) { SP % * " \ ]
_KEYWORD = re.compile(r"[!#$&'+,\-./0-9:;<=>?@A-Z\[^_`a-z|}~]{1,100}")
_MAX_NAME_LENGTH = 200


class MailboxName(str):
    """An IMAP mailbox name: segments joined by '.', none empty or padded with blanks, no control
    characters, no LIST wildcards ('%', '*'), no namespace prefix ('#'). INBOX is case-insensitive and
    always spelled INBOX (RFC 3501)."""

    def __new__(cls, value: str) -> MailboxName:
        if not isinstance(value, str) or not value:
            raise InvalidInput(f"invalid mailbox name {shown(value)}: expected a non-empty string")
        problem = None
        if len(value) > _MAX_NAME_LENGTH:
            problem = f"longer than {_MAX_NAME_LENGTH} characters"
        elif not value.isprintable():
            problem = "control characters are not allowed"
        elif "%" in value or "*" in value:
            problem = "'%' and '*' are IMAP LIST wildcards"
        elif value.startswith("#"):
            problem = "'#' starts a namespace"
        segments = value.split(DELIMITER)
        if problem is None and any(not s or s != s.strip() for s in segments):
            problem = f"empty segment or blanks around a {DELIMITER!r}-separated segment"
        if problem is not None:
            raise InvalidInput(f"invalid mailbox name {shown(value)}: {problem}")
        if segments[0].upper() == INBOX:
            segments[0] = INBOX
        return super().__new__(cls, DELIMITER.join(segments))


def parse_flags(flags: Iterable[str]) -> frozenset[str]:
    """Validated flags: the IMAP system flags (any case, stored canonically) and keywords (atoms)."""
    if isinstance(flags, str | bytes):
        raise InvalidInput(f"flags are a collection of flag names, not the single string {shown(flags)}")
    try:
        names = list(flags)
    except TypeError:
        raise InvalidInput(f"flags are a collection of flag names, not {type(flags).__name__}") from None
    parsed = set()
    for flag in names:
        if not isinstance(flag, str):
            raise InvalidInput(f"invalid flag {shown(flag)}: expected a string")
        if flag.startswith("\\"):
            canonical = _SYSTEM_FLAGS.get(flag.lower())
            if canonical is None:
                raise InvalidInput(
                    f"invalid flag {shown(flag)}: system flags are {', '.join(SYSTEM_FLAGS)} "
                    "(\\Recent is the server's to set)"
                )
            parsed.add(canonical)
        elif _KEYWORD.fullmatch(flag):
            parsed.add(flag)
        else:
            raise InvalidInput(
                f"invalid flag {shown(flag)}: a keyword is 1-100 printable ASCII characters without "
                'blanks or any of ( ) {{ % * " \\ ]'
            )
    return frozenset(parsed)


def _stored(flags: frozenset[str]) -> str:
    return " ".join(sorted(flags))


def _loaded(flags: str) -> frozenset[str]:
    return frozenset(flags.split())


def _unseen(flags: frozenset[str]) -> int:
    return 0 if SEEN in flags else 1


def _uid(uid: int) -> int:
    if isinstance(uid, bool) or not isinstance(uid, int) or not 1 <= uid <= MAX_COUNT:
        raise InvalidInput(f"invalid uid {shown(uid)}: expected a positive integer up to {MAX_COUNT}")
    return uid


def _user(user: str) -> MailAddress:
    # Users are compared case-insensitively, as the delivery worker addresses them: one INBOX per person.
    return MailAddress(MailAddress(user).lower())


@dataclass(frozen=True)
class Mailbox:
    id: MailboxId
    user: MailAddress
    name: MailboxName


@dataclass(frozen=True)
class Counters:
    count: int
    unseen: int


@dataclass(frozen=True)
class MessageEntry:
    uid: int
    message_id: MessageId
    flags: frozenset[str]


class Appended(NamedTuple):
    message_id: MessageId
    uid: int


MailboxRef = Mailbox | MailboxId | str


class Mailboxes:
    """The mailbox API. Bad input (an unknown mailbox or uid, an invalid name, flag or message) raises
    before anything is written."""

    def __init__(
        self,
        tables: MailboxTables,
        blobs: DeduplicatingBlobStore,
        clock: Clock,
        max_message_size: int,
        faults: FaultInjector | None = None,
        group_writes: GroupWrites = nullcontext,
    ) -> None:
        self.tables = tables
        self.blobs = blobs
        self.clock = clock
        self.max_message_size = max_message_size
        self.faults = faults or FaultInjector()
        self.group_writes = group_writes

    # mailboxes
    def create(self, user: str, name: str) -> MailboxId:
        user, name = _user(user), MailboxName(name)
        mailbox_id = MailboxId.generate(self.clock())
        if not self.tables.create_mailbox(mailbox_id, user, name):
            raise InvalidInput(f"mailbox {shown(name)} of {user} already exists")
        return mailbox_id

    def get(self, user: str, name: str) -> Mailbox:
        user, name = _user(user), MailboxName(name)
        row = self.tables.find_mailbox(user, name)
        if row is None:
            raise UnknownMailbox(f"unknown mailbox {shown(name)} of {user}")
        return _mailbox(row)

    def get_or_create(self, user: str, name: str) -> MailboxId:
        """The mailbox's id, creating it if missing; safe when several workers race to create it."""
        user, name = _user(user), MailboxName(name)
        row = self.tables.find_mailbox(user, name)
        if row is None:
            # A loser of the race finds the winner's mailbox on the second look.
            self.tables.create_mailbox(MailboxId.generate(self.clock()), user, name)
            row = self.tables.find_mailbox(user, name)
        return MailboxId(row[0])

    # builtins.list in this class: its own `list` method would shadow the type for a type checker.
    def list(self, user: str | None = None) -> builtins.list[Mailbox]:
        return [_mailbox(row) for row in self.tables.mailboxes(None if user is None else _user(user))]

    def scope(self, user: str | None = None, name: str | None = None) -> builtins.list[Mailbox]:
        """The mailboxes a maintenance run is limited to: all (neither given), a user's (`user`), or one
        mailbox of a user (`user` and `name`: a name is only unique per user). An unknown user (one
        without any mailbox) or mailbox is an error."""
        if name is not None and user is None:
            raise InvalidInput(f"mailbox {shown(name)}: give its user too (a mailbox name is per user)")
        if user is None:
            return self.list()
        if name is not None:
            return [self.get(user, name)]
        found = self.list(user)
        if not found:
            raise UnknownMailbox(f"unknown user {_user(user)}: no mailbox")
        return found

    def delete_mailbox(self, mailbox: MailboxRef) -> int:
        """Expunge every message, then drop the mailbox and its counters; returns how many were expunged.

        Half done (a fault while expunging), it can be called again."""
        mailbox_id = self._existing(mailbox)
        expunged = 0
        # The drop happens only in a commit that sees no message left, so a concurrent append either
        # lands before it (and is expunged by the next round), or finds no mailbox to allocate a uid in,
        # or finds the mailbox gone once its entry is written and takes the entry back (`_place`).
        while not self.tables.delete_mailbox(mailbox_id):
            expunged += self._expunge(mailbox_id, self.tables.uids(mailbox_id), strict=False)
        return expunged

    # messages
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
        mailbox_id = self._existing(mailbox)
        flags = parse_flags(flags)
        message = check_message(message, self.max_message_size)
        message_id = MessageId.generate(self.clock()) if message_id is None else MessageId(message_id)
        header, body = split_message(message)
        with self.group_writes():
            for placed_in, placed in self.tables.placements(message_id):
                if placed_in == mailbox_id:
                    return Appended(message_id, placed)
                raise InvalidInput(f"message {message_id} is already in mailbox {placed_in}")
            uid = self._allocate(mailbox_id)
            self.faults.reached(APPEND_AFTER_UID)
            header_blob_id, body_blob_id = self.blobs.save_all(message_id, [header, body])
            self.faults.reached(APPEND_AFTER_CONTENT)
            self.tables.save_message(
                message_id, str(header_blob_id), str(body_blob_id), len(message), self.clock()
            )
            self.faults.reached(APPEND_AFTER_MESSAGE_ROW)
            placed = self._place(message_id, mailbox_id, uid, _stored(flags))
            if placed != uid:  # a racing append of this message id placed it first, and counts it
                return Appended(message_id, placed)
        self.faults.reached(APPEND_AFTER_SOURCE_OF_TRUTH)
        self.tables.project(message_id, mailbox_id)
        self.faults.reached(APPEND_AFTER_PROJECTION)
        self.tables.add_to_counters(mailbox_id, 1, _unseen(flags))
        return Appended(message_id, uid)

    def set_flags(
        self, mailbox: MailboxRef, uid: int, add: Iterable[str] = (), remove: Iterable[str] = ()
    ) -> frozenset[str]:
        """Add then remove flags of the message at `uid`; returns its new flags.

        Crash-safe order: 1. the source of truth, by compare-and-set against the flags read (so the unseen
        delta counted in 3 is exact under concurrent changes: a lost race reads again); 2. the projection;
        3. the counters. A crash after 1 or 2 leaves record 23's inconsistencies, which the counter
        recomputation repairs.
        """
        mailbox_id = self._existing(mailbox)
        uid = _uid(uid)
        add, remove = parse_flags(add), parse_flags(remove)
        if add & remove:
            raise InvalidInput(f"flags both added and removed: {', '.join(sorted(add & remove))}")
        while True:
            message_id, stored = self._entry(mailbox_id, uid)
            old = _loaded(stored)
            new = (old | add) - remove
            if new == old:
                return new
            if self.tables.set_source_flags(message_id, mailbox_id, _stored(new), stored):
                break
        self.faults.reached(FLAG_AFTER_SOURCE_OF_TRUTH)
        self.tables.project(message_id, mailbox_id)
        self.faults.reached(FLAG_AFTER_PROJECTION)
        self.tables.add_to_counters(mailbox_id, 0, _unseen(new) - _unseen(old))
        return new

    def move(self, source: MailboxRef, uid: int, target: MailboxRef) -> int:
        """Move the message at `uid` of `source` to `target`, flags kept; returns its uid in `target`.

        Crash-safe order: 1. the target's source-of-truth entry (with a new uid); 2. the removal of the
        source's; 3. the projections; 4. the counters. The message is never in neither mailbox: a crash
        after 1 leaves it in both, and the move run again finds it in the target and completes;
        after 2 or 3, record 23's inconsistencies, which the counter recomputation repairs.
        """
        source_id, target_id = self._existing(source), self._existing(target)
        uid = _uid(uid)
        if source_id == target_id:
            raise InvalidInput(f"cannot move a message of mailbox {source_id} to itself")
        with self.group_writes():
            message_id, stored = self._entry(source_id, uid)
            new_uid = self._placement(message_id, target_id)  # an earlier move that died half-way
            if new_uid is None:
                new_uid = self._place(message_id, target_id, self._allocate(target_id), stored)
            self.faults.reached(MOVE_AFTER_TARGET)
            self.tables.remove_from_source_of_truth(source_id, uid)
        self.faults.reached(MOVE_AFTER_SOURCE_OF_TRUTH)
        with self.group_writes():
            self.tables.unproject(source_id, uid)
            self.tables.project(message_id, target_id)
        self.faults.reached(MOVE_AFTER_PROJECTION)
        unseen = _unseen(_loaded(stored))
        with self.group_writes():
            self.tables.add_to_counters(source_id, -1, -unseen)
            self.tables.add_to_counters(target_id, 1, unseen)
        return new_uid

    def expunge(self, mailbox: MailboxRef, uids: Iterable[int]) -> int:
        """Remove the messages at `uids`; a message in no mailbox any more releases its blobs.
        Returns how many were removed. An unknown uid among them removes none."""
        mailbox_id = self._existing(mailbox)
        if isinstance(uids, int):
            raise InvalidInput("expunge takes a collection of uids; wrap a single uid in a list")
        return self._expunge(mailbox_id, [_uid(uid) for uid in uids], strict=True)

    def _expunge(self, mailbox_id: MailboxId, uids: builtins.list[int], *, strict: bool) -> int:
        """Crash-safe order: 1. the source of truth; 2. the projection; 3. the counters; 4. for each message
        now in no mailbox, its content (`_discard`). A crash after 1 or 2 leaves record 23's
        inconsistencies, which the counter recomputation repairs; after 3, content that no mailbox holds,
        which the orphan sweep releases."""
        removed: builtins.list[tuple[int, str, frozenset[str]]] = []
        chosen = sorted(set(uids))
        with self.group_writes():
            if strict:
                for uid in chosen:
                    self._entry(mailbox_id, uid)
            for uid in chosen:
                entry = self.tables.remove_from_source_of_truth(mailbox_id, uid)
                if entry is not None:  # None: another operation took it meanwhile
                    removed.append((uid, entry[0], _loaded(entry[1])))
        if not removed:
            return 0
        self.faults.reached(EXPUNGE_AFTER_SOURCE_OF_TRUTH)
        with self.group_writes():
            for uid, _, _ in removed:
                self.tables.unproject(mailbox_id, uid)
        self.faults.reached(EXPUNGE_AFTER_PROJECTION)
        unseen = sum(_unseen(flags) for _, _, flags in removed)
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
        with self.group_writes():
            self.tables.delete_message(owner)
            self.faults.reached(ORPHAN_AFTER_MESSAGE_ROW)
            return self.blobs.release(owner, held)

    def _discard(self, message_id: str) -> int:
        """Drop the content of a message that no mailbox holds; how many references were released.

        Crash-safe order: 1. the `messages` row; 2. the references (deletions appended). A crash after 1
        leaves references whose owner exists nowhere, which the orphan sweep releases."""
        with self.group_writes():
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

    # reads
    def counters(self, mailbox: MailboxRef) -> Counters:
        mailbox_id = self._existing(mailbox)
        row = self.tables.counters(mailbox_id)
        if row is None:  # dropped between the two reads
            raise UnknownMailbox(f"unknown mailbox {mailbox_id}")
        return Counters(*row)

    def list_messages(self, mailbox: MailboxRef) -> builtins.list[MessageEntry]:
        """The mailbox's messages by uid, as the projection `message_id_table` lists them."""
        mailbox_id = self._existing(mailbox)
        return [
            MessageEntry(uid, MessageId(message_id), _loaded(flags))
            for uid, message_id, flags in self.tables.projection(mailbox_id)
        ]

    def read(self, mailbox: MailboxRef, uid: int) -> bytes:
        mailbox_id = self._existing(mailbox)
        message_id, _ = self._entry(mailbox_id, _uid(uid))
        row = self.tables.message(message_id)
        if row is None:  # expunged between the two reads
            raise UnknownMailbox(f"no message with uid {uid} in mailbox {mailbox_id}")
        return self.blobs.read(row[0]) + self.blobs.read(row[1])

    def locate(self, message_id: str) -> dict[MailboxId, int]:
        """Where the source of truth has the message: mailbox id -> uid (empty if nowhere)."""
        return {MailboxId(m): uid for m, uid in self.tables.placements(MessageId(message_id))}

    # repairs (record 23): the counter recomputation calls these with what it found
    def heal_projection(self, mailbox: MailboxRef, message_id: str) -> None:
        """Rewrite the projection entry of `message_id` in `mailbox` from the source of truth."""
        self.tables.heal_projection(self._existing(mailbox), MessageId(message_id))

    def reset_counters(
        self, mailbox: MailboxRef, count: int, unseen: int, *, observed: tuple[int, int] | None
    ) -> bool:
        """Set the counters if they still hold `observed` (None: the row is missing); False if they moved
        meanwhile, which the next recomputation settles."""
        values = (count, unseen, *(() if observed is None else observed))
        if (
            any(isinstance(v, bool) or not isinstance(v, int) for v in values)
            or (observed is not None and len(observed) != 2)
            or count < 0
            or not 0 <= unseen <= count
        ):
            raise InvalidInput(
                f"invalid counters count={count!r} unseen={unseen!r} observed={observed!r}: "
                "expected integers, 0 <= unseen <= count, and observed None or (count, unseen)"
            )
        return self.tables.reset_counters(self._existing(mailbox), count, unseen, observed)

    def recount(self, mailbox: MailboxRef) -> Counters:
        """Count and unseen as the source of truth has them."""
        return Counters(*self.tables.recount(self._existing(mailbox)))

    def sample_drift(self, size: int) -> builtins.list[MailboxId]:
        """Mailboxes, among a random sample of `size`, whose counters differ from a recount."""
        drifting = []
        for mailbox_id in self.tables.sample_mailboxes(size):
            observed = self.tables.counters(mailbox_id)
            if observed is None or Counters(*observed) != Counters(*self.tables.recount(mailbox_id)):
                drifting.append(MailboxId(mailbox_id))
        return drifting

    def _existing(self, mailbox: MailboxRef) -> MailboxId:
        mailbox_id = mailbox.id if isinstance(mailbox, Mailbox) else MailboxId(mailbox)
        if self.tables.mailbox(mailbox_id) is None:
            raise UnknownMailbox(f"unknown mailbox {mailbox_id}")
        return mailbox_id

    def _entry(self, mailbox_id: MailboxId, uid: int) -> tuple[str, str]:
        entry = self.tables.entry(mailbox_id, uid)
        if entry is None:
            raise UnknownMailbox(f"no message with uid {uid} in mailbox {mailbox_id}")
        return entry


def _mailbox(row: tuple[str, str, str]) -> Mailbox:
    return Mailbox(MailboxId(row[0]), MailAddress(row[1]), MailboxName(row[2]))
