"""What the mailbox, blob and worker tests check on the embedded store's tables, read with plain SQLite.

`inconsistencies()` is record 23's recomputation in miniature: the counters against a recount from the
source of truth (imap_uid_table), and the projection (message_id_table) against the source of truth.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

AGENT = Path(__file__).with_name("mailbox_agent.py")
# Every table an operation on mailboxes or blobs may write: equal snapshots mean nothing changed.
TABLES = (
    "mailboxes",
    "messages",
    "imap_uid_table",
    "message_id_table",
    "mailbox_counters",
    "blobs",
    "blob_references",
    "blob_deletions",
    "blob_content",
    "generations",
)


def rows(data_dir: Path, sql: str, parameters: tuple = ()) -> list[tuple]:
    connection = sqlite3.connect(data_dir / "mailq.db", timeout=30)
    try:
        return connection.execute(sql, parameters).fetchall()
    finally:
        connection.close()


def snapshot(data_dir: Path) -> dict[str, list[tuple]]:
    return {table: sorted(rows(data_dir, f"SELECT * FROM {table}"), key=repr) for table in TABLES}


@dataclass
class Inconsistencies:
    # mailbox id -> ((count, unseen) in mailbox_counters, (count, unseen) recounted from imap_uid_table)
    counters: dict[str, tuple[tuple[int, int], tuple[int, int]]] = field(default_factory=dict)
    # (mailbox id, uid, message id, flags) rows found only in the source of truth / only in the projection
    missing_from_projection: set[tuple] = field(default_factory=set)
    only_in_projection: set[tuple] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.counters or self.missing_from_projection or self.only_in_projection)


def inconsistencies(data_dir: Path) -> Inconsistencies:
    found = Inconsistencies()
    recounted = dict.fromkeys((m for (m,) in rows(data_dir, "SELECT mailbox_id FROM mailboxes")), (0, 0))
    recounted.update(
        {
            mailbox: (count, unseen)
            for mailbox, count, unseen in rows(
                data_dir,
                "SELECT mailbox_id, COUNT(*), SUM(' ' || flags || ' ' NOT LIKE '% \\Seen %') "
                "FROM imap_uid_table GROUP BY mailbox_id",
            )
        }
    )
    stored = {
        m: (c, u) for m, c, u in rows(data_dir, "SELECT mailbox_id, count, unseen FROM mailbox_counters")
    }
    for mailbox in recounted.keys() | stored.keys():
        if stored.get(mailbox) != recounted.get(mailbox):
            found.counters[mailbox] = (stored.get(mailbox), recounted.get(mailbox))
    source = set(rows(data_dir, "SELECT mailbox_id, uid, message_id, flags FROM imap_uid_table"))
    projection = set(rows(data_dir, "SELECT mailbox_id, uid, message_id, flags FROM message_id_table"))
    found.missing_from_projection = source - projection
    found.only_in_projection = projection - source
    return found


def references(data_dir: Path) -> dict[str, set[str]]:
    """owner -> the blob ids it references."""
    held: dict[str, set[str]] = {}
    for owner, blob_id in rows(data_dir, "SELECT owner, blob_id FROM blob_references"):
        held.setdefault(owner, set()).add(blob_id)
    return held


def assert_message_blobs_referenced(data_dir: Path, left_over: frozenset[str] = frozenset()) -> None:
    """Every stored message's header and body are referenced by its message id, and by nothing else
    of the mailboxes: a message in no mailbox has neither row nor references, unless an operation died
    before releasing them (`left_over`: the orphan sweep's to release)."""
    held = references(data_dir)
    placed = {m for (m,) in rows(data_dir, "SELECT DISTINCT message_id FROM imap_uid_table")}
    messages = rows(data_dir, "SELECT message_id, header_blob_id, body_blob_id FROM messages")
    assert {m for m, _, _ in messages} == placed | left_over
    for message_id, header, body in messages:
        assert held.get(message_id) == {header, body}, message_id


def agent(data_dir: Path, *arguments: object, grouped: bool = True) -> subprocess.Popen:
    """Another process on the same data directory (see mailbox_agent.py); `grouped=False`: every write
    of its core commits alone."""
    flags = [] if grouped else ["--ungrouped"]
    return subprocess.Popen(
        [sys.executable, str(AGENT), f"embedded://{data_dir}", *flags, *map(str, arguments)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def results(processes: list[subprocess.Popen], timeout: float = 60) -> list[str]:
    """Starts the agents' work together once each is ready, then returns the stdout of each, failing the
    test on a non-zero exit or once `timeout` seconds pass."""
    # An agent that failed before it was ready has exited: it gets no go, and communicate() reports it.
    ready = [process for process in processes if process.stdout.readline() == "ready\n"]
    for process in ready:
        process.stdin.write("go\n")
        process.stdin.flush()
    outputs = []
    for process in processes:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            raise
        assert process.returncode == 0, err
        outputs.append(out)
    return outputs
