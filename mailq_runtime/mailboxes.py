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
references while the source of truth places it). The deployment's unit of work may group the writes of one
step (the embedded store's transaction): faster, and never needed for correctness.

UIDs come from an atomic increment of `mailboxes.next_uid` (one `UPDATE ... RETURNING` on the embedded
store, a lightweight transaction on Cassandra), so they are distinct and strictly increase per mailbox
across threads and processes; grouped with the entry that uses it (the embedded store), a uid also
commits in uid order. A message is in one mailbox at a time: there is move, not copy. Two operations
racing on one message are not isolated from each other (as in James on Cassandra): each completes its
own writes, and the recomputation repairs the projections.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable

from .blobs.dedup import DeduplicatingBlobStore
from .clock import Clock
from .errors import InvalidInput, UnknownMailbox, shown
from .faults import FaultInjector
from .mailbox import (
    INBOX,
    Appended,
    Counters,
    Mailbox,
    MailboxName,
    MailboxRef,
    MailboxTables,
    MessageEntry,
    MessageSummary,
    check_uid,
    entry_at,
    existing,
    loaded_flags,
    mailbox_of,
    user_address,
)
from .mailbox_writes import MessageWrites
from .model import MailboxId, MessageId
from .unit_of_work import UNGROUPED, UnitOfWork


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
        work: UnitOfWork = UNGROUPED,
    ) -> None:
        self.tables = tables
        self.blobs = blobs
        self.clock = clock
        self.faults = faults or FaultInjector()
        self.writes = MessageWrites(tables, blobs, clock, max_message_size, self.faults, work)

    # mailboxes
    def create(self, user: str, name: str) -> MailboxId:
        user, name = user_address(user), MailboxName(name)
        mailbox_id = MailboxId.generate(self.clock())
        if not self.tables.create_mailbox(mailbox_id, user, name):
            raise InvalidInput(f"mailbox {shown(name)} of {user} already exists")
        return mailbox_id

    def get(self, user: str, name: str) -> Mailbox:
        user, name = user_address(user), MailboxName(name)
        row = self.tables.find_mailbox(user, name)
        if row is None:
            raise UnknownMailbox(f"unknown mailbox {shown(name)} of {user}")
        return mailbox_of(row)

    def get_or_create(self, user: str, name: str) -> MailboxId:
        """The mailbox's id, creating it if missing; safe when several workers race to create it."""
        user, name = user_address(user), MailboxName(name)
        row = self.tables.find_mailbox(user, name)
        if row is None:
            # A loser of the race finds the winner's mailbox on the second look.
            self.tables.create_mailbox(MailboxId.generate(self.clock()), user, name)
            row = self.tables.find_mailbox(user, name)
        return MailboxId(row[0])

    def has_user(self, user: str) -> bool:
        """Whether `user` is a local user: one with a mailbox (`mailq users add` gives one an INBOX). The
        one definition that `mailq smtp` refuses recipients by and the worker bounces them by."""
        return bool(self.tables.mailboxes(user_address(user)))

    def delivery_inbox(self, user: str) -> MailboxId | None:
        """The INBOX that mail for `user` goes to; None when `user` is not a local user (`has_user`). A
        user whose INBOX was deleted gets a new one."""
        row = self.tables.find_mailbox(user_address(user), INBOX)
        if row is not None:
            return MailboxId(row[0])
        return self.get_or_create(user, INBOX) if self.has_user(user) else None

    # builtins.list in this class: its own `list` method would shadow the type for a type checker.
    def list(self, user: str | None = None) -> builtins.list[Mailbox]:
        return [
            mailbox_of(row) for row in self.tables.mailboxes(None if user is None else user_address(user))
        ]

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
            raise UnknownMailbox(f"unknown user {user_address(user)}: no mailbox")
        return found

    def delete_mailbox(self, mailbox: MailboxRef) -> int:
        """Expunge every message, then drop the mailbox and its counters; returns how many were expunged.

        Half done (a fault while expunging), it can be called again."""
        mailbox_id = existing(self.tables, mailbox)
        expunged = 0
        # The drop happens only in a commit that sees no message left, so a concurrent append either
        # lands before it (and is expunged by the next round), or finds no mailbox to allocate a uid in,
        # or finds the mailbox gone once its entry is written and takes the entry back (`_place`).
        while not self.tables.delete_mailbox(mailbox_id):
            expunged += self.writes.expunge_uids(mailbox_id, self.tables.uids(mailbox_id), strict=False)
        return expunged

    # messages
    def append(
        self, mailbox: MailboxRef, message: bytes, flags: Iterable[str] = (), *, message_id: str | None = None
    ) -> Appended:
        return self.writes.append(mailbox, message, flags, message_id=message_id)

    def set_flags(
        self, mailbox: MailboxRef, uid: int, add: Iterable[str] = (), remove: Iterable[str] = ()
    ) -> frozenset[str]:
        return self.writes.set_flags(mailbox, uid, add, remove)

    def move(self, source: MailboxRef, uid: int, target: MailboxRef) -> int:
        return self.writes.move(source, uid, target)

    def expunge(self, mailbox: MailboxRef, uids: Iterable[int]) -> int:
        return self.writes.expunge(mailbox, uids)

    def release_orphan(self, owner: str) -> int:
        return self.writes.release_orphan(owner)

    # reads
    def counters(self, mailbox: MailboxRef) -> Counters:
        mailbox_id = existing(self.tables, mailbox)
        row = self.tables.counters(mailbox_id)
        if row is None:  # dropped between the two reads
            raise UnknownMailbox(f"unknown mailbox {mailbox_id}")
        return Counters(*row)

    def list_messages(self, mailbox: MailboxRef) -> builtins.list[MessageEntry]:
        """The mailbox's messages by uid, as the projection `message_id_table` lists them."""
        mailbox_id = existing(self.tables, mailbox)
        return [
            MessageEntry(uid, MessageId(message_id), loaded_flags(flags))
            for uid, message_id, flags in self.tables.projection(mailbox_id)
        ]

    def summaries(self, mailbox: MailboxRef) -> builtins.list[MessageSummary]:
        """The mailbox's messages by uid (`list_messages`), each with its size, arrival and header section;
        one that is expunged while they are read is left out."""
        summaries = []
        for entry in self.list_messages(mailbox):
            row = self.tables.message(entry.message_id)
            if row is not None:
                summary = MessageSummary(
                    entry.uid,
                    entry.message_id,
                    entry.flags,
                    row.size,
                    row.internal_date,
                    self.blobs.read(row.header_blob_id),
                )
                summaries.append(summary)
        return summaries

    def read(self, mailbox: MailboxRef, uid: int, *, header_only: bool = False) -> bytes:
        mailbox_id = existing(self.tables, mailbox)
        message_id, _ = entry_at(self.tables, mailbox_id, check_uid(uid))
        row = self.tables.message(message_id)
        if row is None:  # expunged between the two reads
            raise UnknownMailbox(f"no message with uid {uid} in mailbox {mailbox_id}")
        header = self.blobs.read(row.header_blob_id)
        return header if header_only else header + self.blobs.read(row.body_blob_id)

    def locate(self, message_id: str) -> dict[MailboxId, int]:
        """Where the source of truth has the message: mailbox id -> uid (empty if nowhere)."""
        return {MailboxId(m): uid for m, uid in self.tables.placements(MessageId(message_id))}

    # repairs (record 23): the counter recomputation calls these with what it found
    def heal_projection(self, mailbox: MailboxRef, message_id: str) -> None:
        """Rewrite the projection entry of `message_id` in `mailbox` from the source of truth."""
        self.tables.heal_projection(existing(self.tables, mailbox), MessageId(message_id))

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
        return self.tables.reset_counters(existing(self.tables, mailbox), count, unseen, observed)

    def recount(self, mailbox: MailboxRef) -> Counters:
        """Count and unseen as the source of truth has them."""
        return Counters(*self.tables.recount(existing(self.tables, mailbox)))

    def sample_drift(self, size: int) -> builtins.list[MailboxId]:
        """Mailboxes, among a random sample of `size`, whose counters differ from a recount."""
        drifting = []
        for mailbox_id in self.tables.sample_mailboxes(size):
            observed = self.tables.counters(mailbox_id)
            if observed is None or Counters(*observed) != Counters(*self.tables.recount(mailbox_id)):
                drifting.append(MailboxId(mailbox_id))
        return drifting
