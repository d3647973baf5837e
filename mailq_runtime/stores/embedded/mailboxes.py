"""Record 23's tables on the embedded store: mailboxes, messages, imap_uid_table (the source of truth),
message_id_table (the projection by mailbox and uid) and mailbox_counters.

Each method is one SQLite transaction of its own (joining the caller's group of writes, if any):
`mailbox_writes.py` orders them so that none needs another's transaction.
"""

from __future__ import annotations

from ..records import CounterValues, MailboxRow, MessageRow, Placement, ProjectionRow, UidEntry
from .store import EmbeddedStore


class EmbeddedMailboxTables:
    def __init__(self, store: EmbeddedStore) -> None:
        self.store = store

    # mailboxes
    def create_mailbox(self, mailbox_id: str, user: str, name: str) -> bool:
        """Insert the mailbox and its zero counters; False if the user already has a mailbox of that name."""
        with self.store.transaction() as db:
            created = db.execute(
                "INSERT OR IGNORE INTO mailboxes (mailbox_id, user, name) VALUES (?, ?, ?)",
                (mailbox_id, user, name),
            ).rowcount
            if created:
                db.execute(
                    "INSERT INTO mailbox_counters (mailbox_id, count, unseen) VALUES (?, 0, 0)", (mailbox_id,)
                )
        return bool(created)

    def find_mailbox(self, user: str, name: str) -> MailboxRow | None:
        row = self.store.read_one(
            "SELECT mailbox_id, user, name FROM mailboxes WHERE user = ? AND name = ?", (user, name)
        )
        return None if row is None else MailboxRow(*row)

    def mailbox(self, mailbox_id: str) -> MailboxRow | None:
        row = self.store.read_one(
            "SELECT mailbox_id, user, name FROM mailboxes WHERE mailbox_id = ?", (mailbox_id,)
        )
        return None if row is None else MailboxRow(*row)

    def mailboxes(self, user: str | None) -> list[MailboxRow]:
        if user is None:
            rows = self.store.read("SELECT mailbox_id, user, name FROM mailboxes ORDER BY user, name")
        else:
            rows = self.store.read(
                "SELECT mailbox_id, user, name FROM mailboxes WHERE user = ? ORDER BY name", (user,)
            )
        return [MailboxRow(*row) for row in rows]

    def allocate_uid(self, mailbox_id: str) -> int | None:
        """The mailbox's next uid, taken atomically; None if the mailbox does not exist (any more)."""
        with self.store.transaction() as db:
            row = db.execute(
                "UPDATE mailboxes SET next_uid = next_uid + 1 WHERE mailbox_id = ? RETURNING next_uid - 1",
                (mailbox_id,),
            ).fetchone()
        return None if row is None else row[0]

    def delete_mailbox(self, mailbox_id: str) -> bool:
        """Drop the mailbox, its counters and any projection rows left by earlier faults, but only once the
        source of truth holds none of its messages; False (and nothing changed) otherwise."""
        with self.store.transaction() as db:
            left = db.execute("SELECT 1 FROM imap_uid_table WHERE mailbox_id = ? LIMIT 1", (mailbox_id,))
            if left.fetchone():
                return False
            db.execute("DELETE FROM message_id_table WHERE mailbox_id = ?", (mailbox_id,))
            db.execute("DELETE FROM mailbox_counters WHERE mailbox_id = ?", (mailbox_id,))
            db.execute("DELETE FROM mailboxes WHERE mailbox_id = ?", (mailbox_id,))
        return True

    # messages: the content's blob ids, kept while the message is in at least one mailbox
    def save_message(
        self, message_id: str, header_blob_id: str, body_blob_id: str, size: int, now: int
    ) -> None:
        with self.store.transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO messages "
                "(message_id, header_blob_id, body_blob_id, size, internal_date) VALUES (?, ?, ?, ?, ?)",
                (message_id, header_blob_id, body_blob_id, size, now),
            )

    def message(self, message_id: str) -> MessageRow | None:
        row = self.store.read_one(
            "SELECT header_blob_id, body_blob_id, size, internal_date FROM messages WHERE message_id = ?",
            (message_id,),
        )
        return None if row is None else MessageRow(*row)

    def delete_message(self, message_id: str) -> None:
        with self.store.transaction() as db:
            db.execute("DELETE FROM messages WHERE message_id = ?", (message_id,))

    # imap_uid_table: the source of truth
    def placements(self, message_id: str) -> list[Placement]:
        """Every mailbox holding the message, with its uid there."""
        rows = self.store.read(
            "SELECT mailbox_id, uid FROM imap_uid_table WHERE message_id = ?", (message_id,)
        )
        return [Placement(*row) for row in rows]

    def entry(self, mailbox_id: str, uid: int) -> UidEntry | None:
        row = self.store.read_one(
            "SELECT message_id, flags FROM imap_uid_table WHERE mailbox_id = ? AND uid = ?", (mailbox_id, uid)
        )
        return None if row is None else UidEntry(*row)

    def uids(self, mailbox_id: str) -> list[int]:
        return [
            uid
            for (uid,) in self.store.read(
                "SELECT uid FROM imap_uid_table WHERE mailbox_id = ? ORDER BY uid", (mailbox_id,)
            )
        ]

    def add_to_source_of_truth(self, message_id: str, mailbox_id: str, uid: int, flags: str) -> bool:
        with self.store.transaction() as db:
            return bool(
                db.execute(
                    "INSERT OR IGNORE INTO imap_uid_table (message_id, mailbox_id, uid, flags) "
                    "VALUES (?, ?, ?, ?)",
                    (message_id, mailbox_id, uid, flags),
                ).rowcount
            )

    def set_source_flags(self, message_id: str, mailbox_id: str, flags: str, expected: str) -> bool:
        """Compare-and-set in one statement: False, and nothing written, if the flags are no longer
        `expected` (or the entry is gone)."""
        with self.store.transaction() as db:
            return bool(
                db.execute(
                    "UPDATE imap_uid_table SET flags = ? "
                    "WHERE message_id = ? AND mailbox_id = ? AND flags = ?",
                    (flags, message_id, mailbox_id, expected),
                ).rowcount
            )

    def remove_from_source_of_truth(self, mailbox_id: str, uid: int) -> UidEntry | None:
        """Remove the entry at this uid; the entry, or None if there was none."""
        with self.store.transaction() as db:
            row = db.execute(
                "DELETE FROM imap_uid_table WHERE mailbox_id = ? AND uid = ? RETURNING message_id, flags",
                (mailbox_id, uid),
            ).fetchone()
        return None if row is None else UidEntry(*row)

    # message_id_table: the projection by mailbox and uid
    def project(self, message_id: str, mailbox_id: str) -> None:
        """Write the projection row as a copy of the source of truth *now*: a concurrent flag change
        committed in between is copied rather than overwritten with an older value. A source entry gone in
        the meantime writes nothing."""
        with self.store.transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO message_id_table (mailbox_id, uid, message_id, flags) "
                "SELECT mailbox_id, uid, message_id, flags FROM imap_uid_table "
                "WHERE message_id = ? AND mailbox_id = ?",
                (message_id, mailbox_id),
            )

    def unproject(self, mailbox_id: str, uid: int) -> None:
        with self.store.transaction() as db:
            db.execute("DELETE FROM message_id_table WHERE mailbox_id = ? AND uid = ?", (mailbox_id, uid))

    def projection(self, mailbox_id: str) -> list[ProjectionRow]:
        """The mailbox's rows, by uid."""
        rows = self.store.read(
            "SELECT uid, message_id, flags FROM message_id_table WHERE mailbox_id = ? ORDER BY uid",
            (mailbox_id,),
        )
        return [ProjectionRow(*row) for row in rows]

    # mailbox_counters
    def add_to_counters(self, mailbox_id: str, count: int, unseen: int) -> None:
        # UPDATE, not upsert: a late increment for a deleted mailbox must not bring its counters back.
        with self.store.transaction() as db:
            db.execute(
                "UPDATE mailbox_counters SET count = count + ?, unseen = unseen + ? WHERE mailbox_id = ?",
                (count, unseen, mailbox_id),
            )

    def counters(self, mailbox_id: str) -> CounterValues | None:
        row = self.store.read_one(
            "SELECT count, unseen FROM mailbox_counters WHERE mailbox_id = ?", (mailbox_id,)
        )
        return None if row is None else CounterValues(*row)

    # repairs of the counter recomputation (record 23)
    def heal_projection(self, mailbox_id: str, message_id: str) -> None:
        """Make the projection of this message in this mailbox a copy of the source of truth: rewritten if
        outdated or missing, removed if the source of truth has no such entry."""
        with self.store.transaction() as db:
            db.execute(
                "DELETE FROM message_id_table WHERE mailbox_id = ? AND message_id = ? AND uid NOT IN "
                "(SELECT uid FROM imap_uid_table WHERE message_id = ? AND mailbox_id = ?)",
                (mailbox_id, message_id, message_id, mailbox_id),
            )
            self.project(message_id, mailbox_id)

    def reset_counters(
        self, mailbox_id: str, count: int, unseen: int, observed: CounterValues | None
    ) -> bool:
        """Compare-and-set: only if the counters still hold `observed` (None: no counters row yet)."""
        with self.store.transaction() as db:
            if observed is None:
                cursor = db.execute(
                    "INSERT OR IGNORE INTO mailbox_counters (mailbox_id, count, unseen) "
                    "SELECT mailbox_id, ?, ? FROM mailboxes WHERE mailbox_id = ?",
                    (count, unseen, mailbox_id),
                )
            else:
                cursor = db.execute(
                    "UPDATE mailbox_counters SET count = ?, unseen = ? "
                    "WHERE mailbox_id = ? AND count = ? AND unseen = ?",
                    (count, unseen, mailbox_id, *observed),
                )
            return bool(cursor.rowcount)

    def sample_mailboxes(self, size: int) -> list[str]:
        return [
            m
            for (m,) in self.store.read("SELECT mailbox_id FROM mailboxes ORDER BY random() LIMIT ?", (size,))
        ]

    def recount(self, mailbox_id: str) -> CounterValues:
        """The counters as the source of truth has them."""
        return CounterValues(
            *self.store.read_one(
                "SELECT COUNT(*), COALESCE(SUM(instr(' ' || flags || ' ', ' \\Seen ') = 0), 0) "
                "FROM imap_uid_table WHERE mailbox_id = ?",
                (mailbox_id,),
            )
        )
