"""What the runtime contract tests share: a controllable clock, mail builders and the backends they run on.

A backend is everything a contract test needs beyond the public API: opening runtimes on one data
directory, counting the rows of a table (to prove that bad input changed nothing), and losing a broker
message on purpose (to exercise republish). A new backend joins by adding a class here and a param to the
`backend` fixture in conftest.py; the tests themselves do not change.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
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

    def open(self, clock: Clock = system_clock, **options: object) -> Runtime:
        runtime = Runtime.open(self.url(**options), clock=clock)
        self._opened.append(runtime)
        return runtime

    def _db(self) -> sqlite3.Connection:
        return sqlite3.connect(self.data_dir / "mailq.db", timeout=30)

    def count(self, table: str) -> int:
        assert table in TABLES, table
        with self._db() as db:
            return db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]

    def counts(self) -> dict[str, int]:
        return {table: self.count(table) for table in TABLES}

    def rows(self, sql: str, parameters: tuple = ()) -> list[tuple]:
        """Backend-specific inspection, for the tests of the embedded store's own tables."""
        with self._db() as db:
            return db.execute(sql, parameters).fetchall()

    def lose_broker_message(self, queue: str, enqueue_id: str) -> None:
        """What a broker outage can do: the message is gone while the view still holds the mail."""
        with self._db() as db:
            lost = db.execute(
                "DELETE FROM broker_messages WHERE queue = ? AND enqueue_id = ?", (queue, enqueue_id)
            ).rowcount
        assert lost == 1

    def corrupt_broker_message(self, queue: str, enqueue_id: str) -> None:
        """A message whose payload no longer decodes (a bug in another version, a bad manual edit)."""
        with self._db() as db:
            corrupted = db.execute(
                "UPDATE broker_messages SET payload = ? WHERE queue = ? AND enqueue_id = ?",
                ('{"not": "a mail"', queue, enqueue_id),
            ).rowcount
        assert corrupted == 1

    def lose_content(self, blob_id: str) -> None:
        """The blob store lost a blob that is still referenced."""
        with self._db() as db:
            assert db.execute("DELETE FROM blob_content WHERE blob_id = ?", (blob_id,)).rowcount == 1

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
