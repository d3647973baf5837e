"""Record 23's tables on Cassandra: mailboxes and mailbox_paths, messages, imap_uid_table (the source of
truth), message_id_table (the projection by mailbox and uid) and mailbox_counters (tallies, tallies.py:
each writer's share written whole, so a write whose reply was lost is sent again without counting
twice), in `CassandraMailboxTables`, which has the methods of the embedded store's mailbox tables: the
tables its steps join are read and written through one small DAO a table, the messages table directly.
Each method is one step that commits on its own: `mailbox_writes.py` orders them (record 23's source of truth,
projection, counters; a message's content first and released last), so that none needs another's
transaction.

Lightweight transactions, and why:
- `mailboxes.next_uid`: allocate_uid reads it and sets it one higher IF it still holds what was read,
  retrying from the value a lost race returns (James's uid provider does the same), so UIDs are distinct
  and strictly increase per mailbox across processes. The row is created (IF NOT EXISTS) and deleted
  (IF EXISTS) through Paxos too, so that no plain write can reset next_uid, and an allocation after the
  deletion finds no row and returns None.
- `mailbox_paths`: a user's mailbox name is claimed IF NOT EXISTS, so two creations of one name leave one
  mailbox. A mailbox's row is written before its name is claimed, so a name whose mailbox row is
  missing was left by a deletion that stopped half-way: the next creation takes the name over (IF it
  still names that mailbox).
- `imap_uid_table.flags`: set_source_flags is a compare-and-set (UPDATE ... IF flags = the flags read),
  so that the unseen delta `mailbox_writes.py` counts is exact when two processes change one message's flags
  at once: the loser is told so and reads again. An entry gone meanwhile has no flags to compare, and
  nothing is written.

Everything else is plain writes. What a race or a crash can leave, and why it is harmless:
- set_source_flags's Paxos round can still meet a concurrent plain removal of the entry (the removal
  timestamped before the round's ballot): the flags it writes outlive the deletion as a row without a
  uid, which every read ignores.
- add_to_source_of_truth reads then inserts: two appends of one message id to one mailbox at once may
  both write the entry (the later uid wins) and both count it, the drift that record 23's
  recomputation repairs, as it does the projection row of the uid that lost.
- remove_from_source_of_truth reads the entry then deletes it: two concurrent expunges of one message
  may both return it and both decrement the counters, the drift that record 23's recomputation repairs.
- A share written after its mailbox was deleted (by another process) comes back as a stray row:
  `counters` answers for existing mailboxes only.
- reset_counters cannot compare-and-set the sum of every writer's share (record 23: "counters can't be
  reset in an atomic manner"): it reads, compares with `observed`, and adds the difference to this
  writer's share, so an increment landing in between is kept rather than overwritten.
- A creation that dies before claiming its name leaves a mailbox row nothing names: it is never listed
  or found and holds no message.

The source of truth is read by mailbox through its storage-attached indexes (see schema.py).
"""

from __future__ import annotations

import random
from operator import attrgetter
from typing import NamedTuple

from cassandra import WriteTimeout

from ...errors import StoreUnavailable
from ..records import CounterValues, MailboxRow, MessageRow, Placement, ProjectionRow, UidEntry
from .store import CassandraStore
from .tallies import Change

_MIN_TOKEN, _MAX_TOKEN = -(2**63), 2**63 - 1
# Paxos rounds that time out (the result unknown) before allocate_uid gives up; a lost race is not one.
_UID_TIMEOUTS = 3
_SEEN = "\\Seen"


class UidTaken(NamedTuple):
    applied: bool
    found: int | None  # next_uid found when not applied; None when the mailbox is gone


class NameClaim(NamedTuple):
    applied: bool
    holder: str  # the mailbox the name is claimed for


class UidFlags(NamedTuple):
    uid: int
    flags: str


class MailboxesDAO:
    def __init__(self, store: CassandraStore) -> None:
        self.store = store

    def create(self, mailbox_id: str, user: str, name: str) -> None:
        self.store.applied(
            "INSERT INTO mailboxes (mailbox_id, user, name, next_uid) VALUES (?, ?, ?, 1) IF NOT EXISTS",
            (mailbox_id, user, name),
        )

    def get(self, mailbox_id: str):
        return self.store.execute(
            "SELECT user, name, next_uid FROM mailboxes WHERE mailbox_id = ?", (mailbox_id,)
        ).one()

    def get_async(self, mailbox_id: str):
        return self.store.execute_async("SELECT user FROM mailboxes WHERE mailbox_id = ?", (mailbox_id,))

    def existing(self, mailbox_ids: list[str]) -> set[str]:
        results = self.store.execute_all(
            "SELECT mailbox_id FROM mailboxes WHERE mailbox_id IN ?",
            [(mailbox_ids[i : i + 100],) for i in range(0, len(mailbox_ids), 100)],
        )
        return {row.mailbox_id for rows in results for row in rows}

    def take_uid(self, mailbox_id: str, expected: int) -> UidTaken:
        """Set next_uid to expected + 1 if it holds `expected`."""
        row = self.store.applied(
            "UPDATE mailboxes SET next_uid = ? WHERE mailbox_id = ? IF next_uid = ?",
            (expected + 1, mailbox_id, expected),
        )
        return UidTaken(row.applied, getattr(row, "next_uid", None))

    def delete(self, mailbox_id: str) -> None:
        self.store.applied("DELETE FROM mailboxes WHERE mailbox_id = ? IF EXISTS", (mailbox_id,))

    def sample(self, size: int) -> list[str]:
        """Up to `size` mailbox ids from a random point of the token ring on (wrapping around)."""
        if size <= 0:
            return []
        start = random.randint(_MIN_TOKEN, _MAX_TOKEN)
        ids = [
            row.mailbox_id
            for row in self.store.execute(
                "SELECT mailbox_id FROM mailboxes WHERE token(mailbox_id) > ? LIMIT ?", (start, size)
            )
        ]
        if len(ids) < size:
            ids += [
                row.mailbox_id
                for row in self.store.execute(
                    "SELECT mailbox_id FROM mailboxes WHERE token(mailbox_id) <= ? LIMIT ?",
                    (start, size - len(ids)),
                )
            ]
        return ids


class MailboxPathsDAO:
    def __init__(self, store: CassandraStore) -> None:
        self.store = store

    def claim(self, user: str, name: str, mailbox_id: str) -> NameClaim:
        """Claim the name for the mailbox; whether it was, and the mailbox that holds it."""
        row = self.store.applied(
            "INSERT INTO mailbox_paths (user, name, mailbox_id) VALUES (?, ?, ?) IF NOT EXISTS",
            (user, name, mailbox_id),
        )
        return NameClaim(row.applied, mailbox_id if row.applied else row.mailbox_id)

    def take_over(self, user: str, name: str, mailbox_id: str, holder: str) -> bool:
        return self.store.applied(
            "UPDATE mailbox_paths SET mailbox_id = ? WHERE user = ? AND name = ? IF mailbox_id = ?",
            (mailbox_id, user, name, holder),
        ).applied

    def release(self, user: str, name: str, mailbox_id: str) -> None:
        self.store.applied(
            "DELETE FROM mailbox_paths WHERE user = ? AND name = ? IF mailbox_id = ?",
            (user, name, mailbox_id),
        )

    def get(self, user: str, name: str) -> str | None:
        row = self.store.execute(
            "SELECT mailbox_id FROM mailbox_paths WHERE user = ? AND name = ?", (user, name)
        ).one()
        return None if row is None else row.mailbox_id

    def of(self, user: str | None) -> list[MailboxRow]:
        """The user's names, or everyone's, by user and name."""
        if user is None:
            rows = self.store.execute("SELECT user, name, mailbox_id FROM mailbox_paths")
        else:
            rows = self.store.execute(
                "SELECT user, name, mailbox_id FROM mailbox_paths WHERE user = ?", (user,)
            )
        return sorted(
            (MailboxRow(row.mailbox_id, row.user, row.name) for row in rows), key=attrgetter("user", "name")
        )


class ImapUidDAO:
    """imap_uid_table, the source of truth. A row without a uid is not an entry (see the module)."""

    def __init__(self, store: CassandraStore) -> None:
        self.store = store

    def of_message(self, message_id: str) -> list[Placement]:
        rows = self.store.execute(
            "SELECT mailbox_id, uid FROM imap_uid_table WHERE message_id = ?", (message_id,)
        )
        return [Placement(row.mailbox_id, row.uid) for row in rows if row.uid is not None]

    def get(self, message_id: str, mailbox_id: str):
        row = self.store.execute(
            "SELECT uid, flags FROM imap_uid_table WHERE message_id = ? AND mailbox_id = ?",
            (message_id, mailbox_id),
        ).one()
        return None if row is None or row.uid is None else row

    def at(self, mailbox_id: str, uid: int) -> UidEntry | None:
        row = self.store.execute(
            "SELECT message_id, flags FROM imap_uid_table WHERE mailbox_id = ? AND uid = ?", (mailbox_id, uid)
        ).one()
        return None if row is None else UidEntry(row.message_id, row.flags)

    def of_mailbox(self, mailbox_id: str) -> list[UidFlags]:
        """The mailbox's entries, in no particular order."""
        rows = self.store.execute("SELECT uid, flags FROM imap_uid_table WHERE mailbox_id = ?", (mailbox_id,))
        return [UidFlags(row.uid, row.flags) for row in rows if row.uid is not None]

    def add(self, message_id: str, mailbox_id: str, uid: int, flags: str) -> None:
        self.store.execute(
            "INSERT INTO imap_uid_table (message_id, mailbox_id, uid, flags) VALUES (?, ?, ?, ?)",
            (message_id, mailbox_id, uid, flags),
        )

    def set_flags(self, message_id: str, mailbox_id: str, flags: str, expected: str) -> bool:
        return self.store.applied(
            "UPDATE imap_uid_table SET flags = ? WHERE message_id = ? AND mailbox_id = ? IF flags = ?",
            (flags, message_id, mailbox_id, expected),
        ).applied

    def remove(self, message_id: str, mailbox_id: str) -> None:
        self.store.execute(
            "DELETE FROM imap_uid_table WHERE message_id = ? AND mailbox_id = ?", (message_id, mailbox_id)
        )


class MessageIdDAO:
    """message_id_table, the projection by mailbox and uid."""

    def __init__(self, store: CassandraStore) -> None:
        self.store = store

    def put(self, mailbox_id: str, uid: int, message_id: str, flags: str) -> None:
        self.store.execute(
            "INSERT INTO message_id_table (mailbox_id, uid, message_id, flags) VALUES (?, ?, ?, ?)",
            (mailbox_id, uid, message_id, flags),
        )

    def remove(self, mailbox_id: str, uids: list[int]) -> None:
        self.store.execute(
            "DELETE FROM message_id_table WHERE mailbox_id = ? AND uid IN ?", (mailbox_id, uids)
        )

    def remove_mailbox(self, mailbox_id: str) -> None:
        self.store.execute("DELETE FROM message_id_table WHERE mailbox_id = ?", (mailbox_id,))

    def of_mailbox(self, mailbox_id: str) -> list[ProjectionRow]:
        rows = self.store.execute(
            "SELECT uid, message_id, flags FROM message_id_table WHERE mailbox_id = ?", (mailbox_id,)
        )
        return [ProjectionRow(row.uid, row.message_id, row.flags) for row in rows]

    def uids_of(self, mailbox_id: str, message_id: str) -> list[int]:
        # Filtering inside one partition: it reads that mailbox's projection only.
        rows = self.store.execute(
            "SELECT uid FROM message_id_table WHERE mailbox_id = ? AND message_id = ? ALLOW FILTERING",
            (mailbox_id, message_id),
        )
        return [row.uid for row in rows]


class MailboxCountersDAO:
    def __init__(self, store: CassandraStore) -> None:
        self.store = store
        self.tally = store.tallies.tally("mailbox_counters", ("mailbox_id",), ("count", "unseen"))

    def add(self, mailbox_id: str, count: int, unseen: int) -> None:
        self.store.tallies.add([Change(self.tally, (mailbox_id,), (count, unseen))])

    def get_async(self, mailbox_id: str):
        return self.store.execute_async(
            "SELECT count, unseen FROM mailbox_counters WHERE mailbox_id = ?", (mailbox_id,)
        )

    def delete(self, mailbox_id: str) -> None:
        self.store.tallies.forget(self.tally, lambda key: key == (mailbox_id,))
        self.store.execute("DELETE FROM mailbox_counters WHERE mailbox_id = ?", (mailbox_id,))


class CassandraMailboxTables:
    def __init__(self, store: CassandraStore) -> None:
        self.store = store
        self.mailbox_rows = MailboxesDAO(store)
        self.paths = MailboxPathsDAO(store)
        self.source = ImapUidDAO(store)
        self.projections = MessageIdDAO(store)
        self.mailbox_counters = MailboxCountersDAO(store)

    # mailboxes
    def create_mailbox(self, mailbox_id: str, user: str, name: str) -> bool:
        """Create the mailbox with zero counters; False if the user already has a mailbox of that name
        (this one, from an earlier call, included: a call repeated after a crash completes it)."""
        self.mailbox_rows.create(mailbox_id, user, name)
        self.mailbox_counters.add(mailbox_id, 0, 0)
        claimed, holder = self.paths.claim(user, name, mailbox_id)
        if claimed or holder == mailbox_id:
            return claimed
        if self.mailbox_rows.get(holder) is None and self.paths.take_over(user, name, mailbox_id, holder):
            return True
        # Nothing names this mailbox, so nothing can have used it.
        self.mailbox_rows.delete(mailbox_id)
        self.mailbox_counters.delete(mailbox_id)
        return False

    def find_mailbox(self, user: str, name: str) -> MailboxRow | None:
        mailbox_id = self.paths.get(user, name)
        if mailbox_id is None or self.mailbox_rows.get(mailbox_id) is None:
            return None
        return MailboxRow(mailbox_id, user, name)

    def mailbox(self, mailbox_id: str) -> MailboxRow | None:
        row = self.mailbox_rows.get(mailbox_id)
        return None if row is None else MailboxRow(mailbox_id, row.user, row.name)

    def mailboxes(self, user: str | None) -> list[MailboxRow]:
        named = self.paths.of(user)
        existing = self.mailbox_rows.existing([mailbox.mailbox_id for mailbox in named])
        return [mailbox for mailbox in named if mailbox.mailbox_id in existing]

    def allocate_uid(self, mailbox_id: str) -> int | None:
        """The mailbox's next uid, taken atomically; None if the mailbox does not exist (any more)."""
        row = self.mailbox_rows.get(mailbox_id)
        expected = None if row is None else row.next_uid
        timeouts = 0
        while expected is not None:
            try:
                applied, found = self.mailbox_rows.take_uid(mailbox_id, expected)
            except StoreUnavailable as error:
                if not isinstance(error.__cause__, WriteTimeout):
                    raise
                # Unknown whether this round took the uid: read again and take a later one (a gap).
                timeouts += 1
                if timeouts > _UID_TIMEOUTS:
                    raise
                row = self.mailbox_rows.get(mailbox_id)
                expected = None if row is None else row.next_uid
                continue
            if applied:
                return expected
            expected = found
        return None

    def delete_mailbox(self, mailbox_id: str) -> bool:
        """Drop the mailbox, its counters and any projection rows left by earlier faults, but only once the
        source of truth holds none of its messages; False (and nothing changed) otherwise."""
        if self.source.of_mailbox(mailbox_id):
            return False
        row = self.mailbox_rows.get(mailbox_id)
        self.mailbox_rows.delete(mailbox_id)  # first: from here on, no uid can be allocated in it
        self.projections.remove_mailbox(mailbox_id)
        self.mailbox_counters.delete(mailbox_id)
        if row is not None:
            self.paths.release(row.user, row.name, mailbox_id)
        return True

    # messages: the content's blob ids, kept while the message is in at least one mailbox
    def save_message(
        self, message_id: str, header_blob_id: str, body_blob_id: str, size: int, now: int
    ) -> None:
        self.store.execute(
            "INSERT INTO messages (message_id, header_blob_id, body_blob_id, size, internal_date) "
            "VALUES (?, ?, ?, ?, ?)",
            (message_id, header_blob_id, body_blob_id, size, now),
        )

    def message(self, message_id: str) -> MessageRow | None:
        row = self.store.execute(
            "SELECT header_blob_id, body_blob_id, size, internal_date FROM messages WHERE message_id = ?",
            (message_id,),
        ).one()
        if row is None:
            return None
        return MessageRow(row.header_blob_id, row.body_blob_id, row.size, row.internal_date)

    def delete_message(self, message_id: str) -> None:
        self.store.execute("DELETE FROM messages WHERE message_id = ?", (message_id,))

    # imap_uid_table: the source of truth
    def placements(self, message_id: str) -> list[Placement]:
        """Every mailbox holding the message, with its uid there."""
        return self.source.of_message(message_id)

    def entry(self, mailbox_id: str, uid: int) -> UidEntry | None:
        return self.source.at(mailbox_id, uid)

    def uids(self, mailbox_id: str) -> list[int]:
        return sorted(uid for uid, _ in self.source.of_mailbox(mailbox_id))

    def add_to_source_of_truth(self, message_id: str, mailbox_id: str, uid: int, flags: str) -> bool:
        """Add the entry unless the message has one in this mailbox already (then False, nothing written)."""
        if self.source.get(message_id, mailbox_id) is not None:
            return False
        self.source.add(message_id, mailbox_id, uid, flags)
        return True

    def set_source_flags(self, message_id: str, mailbox_id: str, flags: str, expected: str) -> bool:
        """Compare-and-set, a lightweight transaction: False, and nothing written, if the flags are no
        longer `expected` (or the entry is gone)."""
        return self.source.set_flags(message_id, mailbox_id, flags, expected)

    def remove_from_source_of_truth(self, mailbox_id: str, uid: int) -> UidEntry | None:
        """Remove the entry at this uid; the entry, or None if there was none."""
        entry = self.source.at(mailbox_id, uid)
        if entry is not None:
            self.source.remove(entry.message_id, mailbox_id)
        return entry

    # message_id_table: the projection by mailbox and uid
    def project(self, message_id: str, mailbox_id: str) -> None:
        """Write the projection row as a copy of the source of truth as read now; a source entry gone in
        the meantime writes nothing."""
        source = self.source.get(message_id, mailbox_id)
        if source is not None:
            self.projections.put(mailbox_id, source.uid, message_id, source.flags)

    def unproject(self, mailbox_id: str, uid: int) -> None:
        self.projections.remove(mailbox_id, [uid])

    def projection(self, mailbox_id: str) -> list[ProjectionRow]:
        """The mailbox's rows, by uid."""
        return self.projections.of_mailbox(mailbox_id)

    # mailbox_counters
    def add_to_counters(self, mailbox_id: str, count: int, unseen: int) -> None:
        self.mailbox_counters.add(mailbox_id, count, unseen)

    def counters(self, mailbox_id: str) -> CounterValues | None:
        """The counters of an existing mailbox; None if the mailbox or its counters row is missing."""
        counters = self.mailbox_counters.get_async(mailbox_id)
        mailbox = self.mailbox_rows.get_async(mailbox_id)
        shares = list(counters.result())
        if mailbox.result().one() is None or not shares:
            return None
        return CounterValues(
            sum(share.count or 0 for share in shares), sum(share.unseen or 0 for share in shares)
        )

    # repairs of the counter recomputation (record 23)
    def heal_projection(self, mailbox_id: str, message_id: str) -> None:
        """Make the projection of this message in this mailbox a copy of the source of truth: rewritten if
        outdated or missing, removed if the source of truth has no such entry."""
        source = self.source.get(message_id, mailbox_id)
        stale = [
            uid
            for uid in self.projections.uids_of(mailbox_id, message_id)
            if source is None or uid != source.uid
        ]
        if stale:
            self.projections.remove(mailbox_id, stale)
        if source is not None:
            self.projections.put(mailbox_id, source.uid, message_id, source.flags)

    def reset_counters(
        self, mailbox_id: str, count: int, unseen: int, observed: CounterValues | None
    ) -> bool:
        """Set the counters if they still hold `observed` (None: no counters row yet), by adding the
        difference; False if they moved meanwhile or the mailbox is gone."""
        if self.mailbox_rows.get(mailbox_id) is None or self.counters(mailbox_id) != observed:
            return False
        base_count, base_unseen = (0, 0) if observed is None else observed
        self.mailbox_counters.add(mailbox_id, count - base_count, unseen - base_unseen)
        return True

    def sample_mailboxes(self, size: int) -> list[str]:
        return self.mailbox_rows.sample(size)

    def recount(self, mailbox_id: str) -> CounterValues:
        """The counters as the source of truth has them."""
        entries = self.source.of_mailbox(mailbox_id)
        return CounterValues(len(entries), sum(1 for _, flags in entries if _SEEN not in flags.split()))
