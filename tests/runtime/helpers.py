"""What the runtime contract tests share: a controllable clock, mail builders and the backends they run on.

A backend is everything a contract test needs beyond the public API, as James's contracts take hooks:
opening runtimes on one deployment, named probes that read its logical tables (row counts, whole tables
to prove that bad input changed nothing, the references of an owner, the lease state, ...) and hooks that
damage it on purpose (lose a broker message or a blob's content, corrupt a message). Tests read no SQL:
the embedded backend answers the probes with SQL here, and nowhere else. A new backend joins by adding a
class with the same methods here and a param to the `backend` fixture in conftest.py; the tests
themselves do not change.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from urllib.parse import urlencode

from mailq_runtime import Mail, Runtime
from mailq_runtime.clock import MICROS_PER_SECOND, Clock, system_clock

AGENT = Path(__file__).with_name("agent.py")
# The tables whose row counts tell whether an operation changed anything.
TABLES = (
    "queues",
    "enqueued_mails",
    "deleted_mails",
    "slice_counters",
    "browse_start",
    "content_start",
    "configuration_events",
    "broker_messages",
    "dead_letters",
    "delayed_mails",
    "blobs",
    "blob_references",
    "blob_deletions",
    "blob_content",
    "generations",
    "mailboxes",
    "messages",
    "message_id_table",
    "imap_uid_table",
    "mailbox_counters",
)


class FakeClock:
    """Microseconds since the epoch that move only when the test says so. Starts on a whole hour,
    so slice boundaries fall on round numbers whatever the slice window."""

    def __init__(self, start_seconds: int = 1_700_002_800) -> None:
        self.now = start_seconds * MICROS_PER_SECOND

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> int:
        self.now += round(seconds * MICROS_PER_SECOND)
        return self.now


def make_mail(
    name: str | None = None,
    *,
    sender: str | None = "sender@example.com",
    recipients: tuple[str, ...] = ("rcpt@example.com",),
    body: bytes = b"Hello.\r\n",
    **fields,
) -> Mail:
    message = b"Subject: test\r\nFrom: sender@example.com\r\n\r\n" + body
    if name is not None:
        fields["name"] = name
    return Mail(recipients=recipients, message=message, sender=sender, **fields)


class EmbeddedBackend:
    """The embedded default: one SQLite file in a data directory."""

    name = "embedded"

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._opened: list[Runtime] = []

    def url(self, **options: object) -> str:
        query = urlencode(options)
        return f"embedded://{self.data_dir}" + (f"?{query}" if query else "")

    def open(self, clock: Clock = system_clock, *, group_writes: bool = True, **options: object) -> Runtime:
        """A runtime on the backend; `group_writes=False` makes every write of the core commit alone."""
        runtime = Runtime.open(self.url(**options), clock=clock, create=True, group_writes=group_writes)
        self._opened.append(runtime)
        return runtime

    def _execute(self, sql: str, parameters: tuple = ()) -> tuple[list[tuple], int]:
        """The rows a statement returns, and how many it changed (committed)."""
        with closing(sqlite3.connect(self.data_dir / "mailq.db", timeout=30)) as db, db:
            cursor = db.execute(sql, parameters)
            return cursor.fetchall(), cursor.rowcount

    def rows(self, sql: str, parameters: tuple = ()) -> list[tuple]:
        """The embedded store's own SQL: what the probes below read with, not for the tests."""
        return self._execute(sql, parameters)[0]

    # Probes: the logical tables, by their names --------------------------------------------------------

    def exists(self) -> bool:
        """Whether anything of the deployment's store is there (a data dir, a keyspace)."""
        return self.data_dir.exists()

    def count(self, table: str) -> int:
        assert table in TABLES, table
        return self.rows(f"SELECT COUNT(*) FROM {table}")[0][0]

    def counts(self) -> dict[str, int]:
        return {table: self.count(table) for table in TABLES}

    def table(self, table: str) -> list[tuple]:
        """Every row of a table, in a fixed order: equal before and after means nothing changed."""
        assert table in TABLES, table
        return sorted(self.rows(f"SELECT * FROM {table}"), key=repr)

    # the queue view and the broker

    def mail_rows(self, queue: str, *, slices_before: int | None = None) -> int:
        """`enqueued_mails` rows of a queue (in the slices starting before a moment)."""
        if slices_before is None:
            return self.rows("SELECT COUNT(*) FROM enqueued_mails WHERE queue = ?", (queue,))[0][0]
        return self.rows(
            "SELECT COUNT(*) FROM enqueued_mails WHERE queue = ? AND slice_start < ?", (queue, slices_before)
        )[0][0]

    def deleted_marks(self, queue: str) -> int:
        """`deleted_mails` rows of a queue."""
        return self.rows("SELECT COUNT(*) FROM deleted_mails WHERE queue = ?", (queue,))[0][0]

    def buckets(self, queue: str) -> set[int]:
        """The buckets holding a queue's `enqueued_mails` rows."""
        return {
            bucket for (bucket,) in self.rows("SELECT bucket FROM enqueued_mails WHERE queue = ?", (queue,))
        }

    def mail_blobs(self, enqueue_id: str) -> tuple[str, str]:
        """The header and body blob ids of a mail's view row."""
        (blobs,) = self.rows(
            "SELECT header_blob_id, body_blob_id FROM enqueued_mails WHERE enqueue_id = ?", (enqueue_id,)
        )
        return blobs

    def lease_state(self) -> list[tuple]:
        """Who may deliver what from when, for every message the broker holds: equal before and after
        means no lease was taken, extended or given back."""
        return self.rows("SELECT id, lease, available_at FROM broker_messages ORDER BY id")

    # blobs (record 39)

    def references_of(self, owner: str) -> list[str]:
        return sorted(
            b for (b,) in self.rows("SELECT blob_id FROM blob_references WHERE owner = ?", (owner,))
        )

    def references(self) -> dict[str, set[str]]:
        """owner -> the blob ids it references."""
        held: dict[str, set[str]] = {}
        for owner, blob_id in self.rows("SELECT owner, blob_id FROM blob_references"):
            held.setdefault(owner, set()).add(blob_id)
        return held

    def references_in_write_order(self) -> list[tuple[str, str]]:
        """(owner, blob id) of every reference, in the order they were written."""
        return self.rows("SELECT owner, blob_id FROM blob_references ORDER BY rowid")

    def blob_references(self) -> list[tuple[str, str, int]]:
        """(owner, blob id, generation) of every reference."""
        return sorted(self.rows("SELECT owner, blob_id, generation FROM blob_references"))

    def blobs(self) -> list[tuple[str, int]]:
        """(blob id, generation) of every row of `blobs`."""
        return sorted(self.rows("SELECT blob_id, generation FROM blobs"))

    def blob_deletions(self) -> list[tuple[str, int, int]]:
        """(blob id, generation, GC iteration) of every deletion."""
        return sorted(self.rows("SELECT blob_id, generation, gc_iteration FROM blob_deletions"))

    def contents(self) -> list[str]:
        """The blob ids whose content the blob store holds."""
        return sorted(b for (b,) in self.rows("SELECT blob_id FROM blob_content"))

    def generations(self, kind: str) -> list[int]:
        """The numbers emitted of `reference_generation` or `gc_iteration`, in order."""
        return [
            n for (n,) in self.rows("SELECT number FROM generations WHERE kind = ? ORDER BY number", (kind,))
        ]

    # mailboxes (record 23)

    def mailbox_ids(self) -> set[str]:
        return {m for (m,) in self.rows("SELECT mailbox_id FROM mailboxes")}

    def messages(self) -> dict[str, tuple[str, str]]:
        """message id -> its (header, body) blob ids, for every stored message."""
        return {
            m: (h, b)
            for m, h, b in self.rows("SELECT message_id, header_blob_id, body_blob_id FROM messages")
        }

    def source_of_truth(self) -> set[tuple[str, int, str, str]]:
        """(mailbox id, uid, message id, flags) of every `imap_uid_table` entry."""
        return set(self.rows("SELECT mailbox_id, uid, message_id, flags FROM imap_uid_table"))

    def projection(self) -> set[tuple[str, int, str, str]]:
        """(mailbox id, uid, message id, flags) of every `message_id_table` entry."""
        return set(self.rows("SELECT mailbox_id, uid, message_id, flags FROM message_id_table"))

    def stored_counters(self) -> dict[str, tuple[int, int]]:
        """mailbox id -> (count, unseen) as `mailbox_counters` holds them."""
        return {m: (c, u) for m, c, u in self.rows("SELECT mailbox_id, count, unseen FROM mailbox_counters")}

    def uids_in_write_order(self, mailbox_id: str) -> list[int]:
        """A mailbox's uids in the source of truth, in the order they were written."""
        return [
            uid
            for (uid,) in self.rows(
                "SELECT uid FROM imap_uid_table WHERE mailbox_id = ? ORDER BY rowid", (mailbox_id,)
            )
        ]

    # Hooks that damage the deployment on purpose -------------------------------------------------------

    def lose_broker_message(self, queue: str, enqueue_id: str) -> None:
        """What a broker outage can do: the message is gone while the view still holds the mail."""
        lost = self._execute(
            "DELETE FROM broker_messages WHERE queue = ? AND enqueue_id = ?", (queue, enqueue_id)
        )[1]
        assert lost == 1

    def corrupt_broker_message(self, queue: str, enqueue_id: str) -> None:
        """A message whose payload no longer decodes (a bug in another version, a bad manual edit)."""
        corrupted = self._execute(
            "UPDATE broker_messages SET payload = ? WHERE queue = ? AND enqueue_id = ?",
            ('{"not": "a mail"', queue, enqueue_id),
        )[1]
        assert corrupted == 1

    def lose_content(self, blob_id: str) -> None:
        """The blob store lost a blob that is still referenced."""
        assert self._execute("DELETE FROM blob_content WHERE blob_id = ?", (blob_id,))[1] == 1

    # Record 39's and record 23's tables, for the crash-order tests.
    def blob_rows(self) -> set[str]:
        """The blob ids of `blobs`."""
        return {blob_id for (blob_id,) in self.rows("SELECT blob_id FROM blobs")}

    def blob_contents(self) -> set[str]:
        """The blob ids whose content the blob store holds."""
        return {blob_id for (blob_id,) in self.rows("SELECT blob_id FROM blob_content")}

    def deletions(self) -> list[str]:
        """The blob id of every deletion, repeated ones included."""
        return sorted(blob_id for (blob_id,) in self.rows("SELECT blob_id FROM blob_deletions"))

    def agent(self, *arguments: str, **options: object) -> subprocess.Popen:
        """Another process working on the same queue (see agent.py)."""
        return subprocess.Popen(
            [sys.executable, str(AGENT), self.url(**options), *arguments],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def close(self) -> None:
        for runtime in self._opened:
            runtime.close()
