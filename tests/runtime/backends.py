"""The deployments the runtime contract suite runs on, each with the probes and hooks its tests need.

A backend is everything a contract test needs beyond the public API, as James's contracts take hooks:
opening runtimes on one deployment, named probes that read its logical tables (row counts, whole tables
to prove that bad input changed nothing, the references of an owner, the lease state, ...) and hooks that
damage it on purpose (lose a broker message or a blob's content, corrupt a message). Tests read no SQL or
CQL: each backend answers the probes in its own terms here, and nowhere else. A new deployment joins by
adding a class with the same methods and a param to the `backend` fixture in conftest.py; the tests
themselves do not change.

- `EmbeddedBackend`: the embedded default, one SQLite file in a data directory.
- `CassandraBackend`: Cassandra for the metadata, S3 for the content, on the harness's servers
  (mailq_servers), with the embedded broker in a directory of the test's own.
- `RabbitMQBackend`: the same with RabbitMQ as the broker, in a virtual host of the test's own.
"""

from __future__ import annotations

import secrets
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote, urlencode

import pika
import pika.exceptions
import pytest

from mailq_runtime import Runtime
from mailq_runtime.brokers.rabbitmq import rabbitmq_queues
from mailq_runtime.clock import Clock, system_clock
from mailq_runtime.stores.cassandra.schema import TABLES as CASSANDRA_TABLES
from mailq_servers.urls import distributed_url

if TYPE_CHECKING:
    from botocore.client import BaseClient
    from cassandra.cluster import Session
    from cassandra.query import PreparedStatement

    from mailq_servers.cassandra import CassandraServer
    from mailq_servers.rabbitmq import RabbitMQServer, Vhosts
    from mailq_servers.s3 import S3Server

AGENT = Path(__file__).with_name("agent.py")
# The logical tables every deployment has: probes and hooks name these.
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


class Backend:
    """What every deployment's backend shares: opening runtimes on its URL, other processes on it, and
    the embedded broker's probes (the only broker built so far, in `broker_dir`)."""

    name: str
    # Whether one operation's writes commit together (group_writes): only then does commit order follow
    # the order the core decided things in (uids, references).
    groups_writes: bool
    # Whether the broker gives a consumer's mails back as soon as it dies, not once their leases end.
    leases_end_with_their_consumer = False
    # Whether the broker tells which messages are leased (in flight), not only how many wait.
    broker_knows_leases = True
    # The start of the NoStore message of an open where nothing was created yet (a regex).
    missing_store: str
    # Every table the deployment has, the logical ones (TABLES) among them.
    tables: tuple[str, ...]
    # How many random operations a model-checking test runs: each browses the whole queue, which costs
    # a few milliseconds on SQLite and one read per slice and bucket on Cassandra.
    model_steps: int

    def __init__(self, broker_dir: Path) -> None:
        self.broker_dir = broker_dir
        self._opened: list[Runtime] = []

    def url(self, **options: object) -> str:
        raise NotImplementedError

    def open(self, clock: Clock = system_clock, *, group_writes: bool = True, **options: object) -> Runtime:
        """A runtime on the backend; `group_writes=False` makes every write of the core commit alone."""
        runtime = Runtime.open(self.url(**options), clock=clock, create=True, group_writes=group_writes)
        self._opened.append(runtime)
        return runtime

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

    def count(self, table: str) -> int:
        raise NotImplementedError

    def counts(self) -> dict[str, int]:
        return {table: self.count(table) for table in TABLES}

    # The embedded broker: its table in the SQLite file of its directory

    def _broker_sql(self, sql: str, parameters: tuple = ()) -> tuple[list[tuple], int]:
        """The rows a statement returns, and how many it changed (committed)."""
        with closing(sqlite3.connect(self.broker_dir / "mailq.db", timeout=30)) as db, db:
            cursor = db.execute(sql, parameters)
            return cursor.fetchall(), cursor.rowcount

    def _broker_messages(self) -> list[tuple]:
        if not (self.broker_dir / "mailq.db").exists():
            return []
        return self._broker_sql("SELECT * FROM broker_messages")[0]

    def lease_state(self) -> list[tuple]:
        """Who may deliver what from when, for every message the broker holds: equal before and after
        means no lease was taken, extended or given back."""
        return self._broker_sql("SELECT id, lease, available_at FROM broker_messages ORDER BY id")[0]

    def lose_broker_message(self, queue: str, enqueue_id: str) -> None:
        """What a broker outage can do: the message is gone while the view still holds the mail."""
        lost = self._broker_sql(
            "DELETE FROM broker_messages WHERE queue = ? AND enqueue_id = ?", (queue, enqueue_id)
        )[1]
        assert lost == 1

    def corrupt_broker_message(self, queue: str, enqueue_id: str) -> None:
        """A message whose payload no longer decodes (a bug in another version, a bad manual edit)."""
        corrupted = self._broker_sql(
            "UPDATE broker_messages SET payload = ? WHERE queue = ? AND enqueue_id = ?",
            ('{"not": "a mail"', queue, enqueue_id),
        )[1]
        assert corrupted == 1

    # Probes derived from the ones each backend answers

    def references(self) -> dict[str, set[str]]:
        """owner -> the blob ids it references."""
        held: dict[str, set[str]] = {}
        for owner, blob_id, _ in self.blob_references():
            held.setdefault(owner, set()).add(blob_id)
        return held

    def references_of(self, owner: str) -> list[str]:
        return sorted(self.references().get(owner, ()))

    def blob_references(self) -> list[tuple[str, str, int]]:
        """(owner, blob id, generation) of every reference."""
        raise NotImplementedError

    def blob_rows(self) -> set[str]:
        """The blob ids of `blobs`."""
        return {blob_id for blob_id, _ in self.blobs()}

    def blobs(self) -> list[tuple[str, int]]:
        raise NotImplementedError

    def contents(self) -> list[str]:
        raise NotImplementedError

    def blob_contents(self) -> set[str]:
        """The blob ids whose content the blob store holds."""
        return set(self.contents())

    def deletions(self) -> list[str]:
        """The blob id of every deletion, repeated ones included."""
        return sorted(blob_id for blob_id, _, _ in self.blob_deletions())

    def blob_deletions(self) -> list[tuple[str, int, int]]:
        raise NotImplementedError


class EmbeddedBackend(Backend):
    """The embedded default: one SQLite file in a data directory, the broker's table in it too."""

    name = "embedded"
    groups_writes = True
    tables = TABLES
    model_steps = 500

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir)
        self.data_dir = data_dir
        self.missing_store = f"no mailq data in {data_dir}"

    def url(self, **options: object) -> str:
        query = urlencode(options)
        return f"embedded://{self.data_dir}" + (f"?{query}" if query else "")

    def elsewhere(self) -> EmbeddedBackend:
        """A backend of the same deployment where nothing was created."""
        return EmbeddedBackend(self.data_dir.with_name(self.data_dir.name + "-elsewhere"))

    def rows(self, sql: str, parameters: tuple = ()) -> list[tuple]:
        """The embedded store's own SQL: what the probes below read with, not for the tests."""
        return self._broker_sql(sql, parameters)[0]

    # Probes: the logical tables, by their names --------------------------------------------------------

    def exists(self) -> bool:
        """Whether anything of the deployment's store is there."""
        return self.data_dir.exists()

    def count(self, table: str) -> int:
        assert table in TABLES, table
        return self.rows(f"SELECT COUNT(*) FROM {table}")[0][0]

    def table(self, table: str) -> list[tuple]:
        """Every row of a table, in a fixed order: equal before and after means nothing changed."""
        assert table in TABLES, table
        return sorted(self.rows(f"SELECT * FROM {table}"), key=repr)

    # the queue view

    def mail_rows(self, queue: str, *, slices_before: int | None = None) -> int:
        """`enqueued_mails` rows of a queue (in the slices starting before a moment)."""
        if slices_before is None:
            return self.rows("SELECT COUNT(*) FROM enqueued_mails WHERE queue = ?", (queue,))[0][0]
        return self.rows(
            "SELECT COUNT(*) FROM enqueued_mails WHERE queue = ? AND slice_start < ?", (queue, slices_before)
        )[0][0]

    def counted_slices(self, queue: str) -> list[int]:
        """The slices of a queue that `slice_counters` holds counters of."""
        return [
            s
            for (s,) in self.rows(
                "SELECT slice_start FROM slice_counters WHERE queue = ? ORDER BY 1", (queue,)
            )
        ]

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

    # blobs (record 39)

    def references_in_write_order(self) -> list[tuple[str, str]]:
        """(owner, blob id) of every reference, in the order they were written."""
        return self.rows("SELECT owner, blob_id FROM blob_references ORDER BY rowid")

    def blob_references(self) -> list[tuple[str, str, int]]:
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

    def lose_content(self, blob_id: str) -> None:
        """The blob store lost a blob that is still referenced."""
        assert self._broker_sql("DELETE FROM blob_content WHERE blob_id = ?", (blob_id,))[1] == 1

    def miscount_slice(self, queue: str, slice_start: int, extra: int) -> None:
        """A slice's counter of enqueued mails is off by `extra`."""
        assert (
            self._broker_sql(
                "UPDATE slice_counters SET enqueued = enqueued + ? WHERE queue = ? AND slice_start = ?",
                (extra, queue, slice_start),
            )[1]
            == 1
        )

    def move_browse_start(self, queue: str, browse_start: int) -> None:
        """A queue's browse_start set to any moment, live mails or not."""
        self._broker_sql("UPDATE browse_start SET browse_start = ? WHERE queue = ?", (browse_start, queue))

    def move_content_start(self, queue: str, content_start: int) -> None:
        """A queue's content_start set to any moment."""
        self._broker_sql("UPDATE content_start SET content_start = ? WHERE queue = ?", (content_start, queue))

    def miscount_unseen(self, mailbox_id: str, extra: int) -> None:
        """A mailbox's unseen counter is off by `extra`."""
        sql = "UPDATE mailbox_counters SET unseen = unseen + ? WHERE mailbox_id = ?"
        assert self._broker_sql(sql, (extra, mailbox_id))[1] == 1

    def lose_counters(self, mailbox_id: str) -> None:
        """A mailbox's counters row is gone."""
        assert self._broker_sql("DELETE FROM mailbox_counters WHERE mailbox_id = ?", (mailbox_id,))[1] == 1

    def put_projection_entry(self, mailbox_id: str, uid: int, message_id: str, flags: str) -> None:
        """A `message_id_table` entry written (or overwritten) directly, ignoring the source of truth."""
        self._broker_sql(
            "INSERT OR REPLACE INTO message_id_table (mailbox_id, uid, message_id, flags) "
            "VALUES (?, ?, ?, ?)",
            (mailbox_id, uid, message_id, flags),
        )


@dataclass
class CassandraS3:
    """The harness's Cassandra and S3 servers, and one probe session and client on them for the whole
    test session (connecting costs more than most probes)."""

    cassandra_server: CassandraServer
    s3_server: S3Server
    session: Session
    s3: BaseClient
    # Probes prepare the same few statements in every test: a round trip each time, saved here.
    prepared: dict[str, PreparedStatement] = field(default_factory=dict)

    def prepare(self, cql: str) -> PreparedStatement:
        statement = self.prepared.get(cql)
        if statement is None:
            statement = self.prepared[cql] = self.session.prepare(cql)
        return statement


class CassandraBackend(Backend):
    """Cassandra + S3 on the harness's servers. The tests of a session share one keyspace and one bucket:
    each test starts with every table emptied and its own key prefix in the bucket, so nothing it finds
    was written by another."""

    name = "cassandra"
    groups_writes = False
    model_steps = 60
    tables = (*TABLES, *sorted(set(CASSANDRA_TABLES) - set(TABLES)))

    def __init__(self, broker_dir: Path, servers: CassandraS3, keyspace: str, bucket: str) -> None:
        super().__init__(broker_dir)
        self.servers = servers
        self.keyspace = keyspace
        self.bucket = bucket
        self.prefix = f"t{secrets.token_hex(4)}/"
        self.missing_store = f"no keyspace '{keyspace}' in Cassandra"
        self.session = servers.session
        self.s3 = servers.s3

    def url(self, **options: object) -> str:
        return distributed_url(
            self.servers.cassandra_server,
            self.servers.s3_server,
            self.keyspace,
            self.bucket,
            **{"broker": f"embedded:{self.broker_dir}", "s3_prefix": self.prefix, **options},
        )

    def elsewhere(self) -> CassandraBackend:
        """A backend of the same deployment where nothing was created: a keyspace no one made."""
        return CassandraBackend(
            self.broker_dir.with_name(self.broker_dir.name + "-elsewhere"),
            self.servers,
            f"{self.keyspace}_elsewhere",
            self.bucket,
        )

    def empty(self) -> None:
        """Empty every table that holds anything (TRUNCATE costs tens of milliseconds, a partition-wise
        delete would leave tombstones that shadow the next test's writes timestamped in a fake clock's
        past). Counters are truncated whatever a read shows: the clean-up's deletions hide them from
        reads, yet a deleted counter cannot be counted again."""
        known = self.session.execute(
            "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = %s", (self.keyspace,)
        )
        if known.one() is None:
            return
        # All at once: a round trip each, one after the other, cost a busy test run minutes.
        looks = {
            name: self.session.execute_async(f"SELECT * FROM {self.keyspace}.{name} LIMIT 1")
            for name, cql in CASSANDRA_TABLES.items()
            if " counter" not in cql
        }
        full = [name for name, look in looks.items() if look.result().one() is not None]
        counters = [name for name in CASSANDRA_TABLES if name not in looks]
        truncations = [
            self.session.execute_async(f"TRUNCATE {self.keyspace}.{name}", timeout=120)
            for name in full + counters
        ]
        for truncation in truncations:
            truncation.result()

    def _rows(self, cql: str, parameters: tuple = ()) -> list[tuple]:
        # Prepared: a plain statement's markers are %s, not the ? the probes write.
        statement = self.servers.prepare(cql.replace("FROM ", f"FROM {self.keyspace}.", 1))
        return [tuple(row) for row in self.session.execute(statement, parameters)]

    # Probes: the logical tables, by their names --------------------------------------------------------

    def exists(self) -> bool:
        """Whether anything of the deployment's store is there: the keyspace, or the broker's directory."""
        self.session.cluster.refresh_schema_metadata()
        return self.keyspace in self.session.cluster.metadata.keyspaces or self.broker_dir.exists()

    def count(self, table: str) -> int:
        return len(self.table(table))

    def table(self, table: str) -> list[tuple]:
        """Every row of a table, in a fixed order: equal before and after means nothing changed."""
        assert table in self.tables, table
        if table == "broker_messages":
            rows = self._broker_messages()
        elif table == "blob_content":
            rows = [(key, etag) for key, etag in self._objects()]
        else:
            rows = self._rows(f"SELECT * FROM {table}")
        return sorted(rows, key=repr)

    def _objects(self) -> list[tuple[str, str]]:
        """(blob id, ETag) of every object under this test's prefix."""
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
        try:
            return [
                (item["Key"].removeprefix(self.prefix), item["ETag"])
                for page in pages
                for item in page.get("Contents", ())
            ]
        except self.s3.exceptions.NoSuchBucket:
            return []

    # the queue view

    def mail_rows(self, queue: str, *, slices_before: int | None = None) -> int:
        """`enqueued_mails` rows of a queue (in the slices starting before a moment)."""
        starts = [
            start
            for (start,) in self._rows(
                "SELECT slice_start FROM enqueued_mails WHERE queue = ? ALLOW FILTERING", (queue,)
            )
        ]
        return sum(slices_before is None or start < slices_before for start in starts)

    def counted_slices(self, queue: str) -> list[int]:
        """The slices of a queue that `slice_counters` holds counters of."""
        return sorted(
            {s for (s,) in self._rows("SELECT slice_start FROM slice_counters WHERE queue = ?", (queue,))}
        )

    def deleted_marks(self, queue: str) -> int:
        """`deleted_mails` rows of a queue."""
        return len(
            self._rows("SELECT enqueue_id FROM deleted_mails WHERE queue = ? ALLOW FILTERING", (queue,))
        )

    def buckets(self, queue: str) -> set[int]:
        """The buckets holding a queue's `enqueued_mails` rows."""
        return {
            b
            for (b,) in self._rows(
                "SELECT bucket FROM enqueued_mails WHERE queue = ? ALLOW FILTERING", (queue,)
            )
        }

    def mail_blobs(self, enqueue_id: str) -> tuple[str, str]:
        """The header and body blob ids of a mail's view row."""
        (blobs,) = self._rows(
            "SELECT header_blob_id, body_blob_id FROM enqueued_mails WHERE enqueue_id = ? ALLOW FILTERING",
            (enqueue_id,),
        )
        return blobs

    # blobs (record 39)

    def references_in_write_order(self) -> list[tuple[str, str]]:
        """(owner, blob id) of every reference, in the order of their write timestamps."""
        rows = self._rows("SELECT owner, blob_id, writetime(generation) FROM blob_references")
        return [(owner, blob_id) for owner, blob_id, _ in sorted(rows, key=lambda row: row[2])]

    def blob_references(self) -> list[tuple[str, str, int]]:
        return sorted(self._rows("SELECT owner, blob_id, generation FROM blob_references"))

    def blobs(self) -> list[tuple[str, int]]:
        return sorted(self._rows("SELECT blob_id, generation FROM blobs"))

    def blob_deletions(self) -> list[tuple[str, int, int]]:
        return sorted(self._rows("SELECT blob_id, generation, gc_iteration FROM blob_deletions"))

    def contents(self) -> list[str]:
        return sorted(blob_id for blob_id, _ in self._objects())

    def generations(self, kind: str) -> list[int]:
        return sorted(n for (n,) in self._rows("SELECT number FROM generations WHERE kind = ?", (kind,)))

    # mailboxes (record 23)

    def mailbox_ids(self) -> set[str]:
        return {m for (m,) in self._rows("SELECT mailbox_id FROM mailboxes")}

    def messages(self) -> dict[str, tuple[str, str]]:
        return {
            m: (h, b)
            for m, h, b in self._rows("SELECT message_id, header_blob_id, body_blob_id FROM messages")
        }

    def source_of_truth(self) -> set[tuple[str, int, str, str]]:
        return set(self._rows("SELECT mailbox_id, uid, message_id, flags FROM imap_uid_table"))

    def projection(self) -> set[tuple[str, int, str, str]]:
        return set(self._rows("SELECT mailbox_id, uid, message_id, flags FROM message_id_table"))

    def stored_counters(self) -> dict[str, tuple[int, int]]:
        """mailbox id -> (count, unseen) as `mailbox_counters` holds them; a counter never written reads
        as 0, as Cassandra's counters do."""
        stored = dict.fromkeys(self.mailbox_ids(), (0, 0))
        stored.update(
            {
                m: (c or 0, u or 0)
                for m, c, u in self._rows("SELECT mailbox_id, count, unseen FROM mailbox_counters")
            }
        )
        return stored

    def uids_in_write_order(self, mailbox_id: str) -> list[int]:
        """A mailbox's uids in the source of truth, in the order of their write timestamps."""
        rows = self._rows(
            "SELECT uid, writetime(flags) FROM imap_uid_table WHERE mailbox_id = ?", (mailbox_id,)
        )
        return [uid for uid, _ in sorted(rows, key=lambda row: row[1])]

    # Hooks that damage the deployment on purpose -------------------------------------------------------

    def lose_content(self, blob_id: str) -> None:
        """The blob store lost a blob that is still referenced."""
        assert blob_id in self.contents()
        self.s3.delete_object(Bucket=self.bucket, Key=self.prefix + blob_id)

    def miscount_slice(self, queue: str, slice_start: int, extra: int) -> None:
        """A slice's counter of enqueued mails is off by `extra` (in one of its buckets' rows)."""
        self._write(
            "UPDATE {keyspace}.slice_counters SET enqueued = enqueued + ? "
            "WHERE queue = ? AND slice_start = ? AND bucket = 0",
            (extra, queue, slice_start),
        )

    def move_browse_start(self, queue: str, browse_start: int) -> None:
        """A queue's browse_start set to any moment, live mails or not."""
        self._move_start("browse_start", queue, browse_start)

    def move_content_start(self, queue: str, content_start: int) -> None:
        """A queue's content_start set to any moment."""
        self._move_start("content_start", queue, content_start)

    def _move_start(self, table: str, queue: str, value: int) -> None:
        """The runtime writes a start with its value as the write timestamp, so that it only moves
        forward: to move one anywhere, the table is written anew, every queue's start with its own."""
        starts = dict(self._rows(f"SELECT queue, {table} FROM {table}"))
        starts[queue] = value
        self.session.execute(f"TRUNCATE {self.keyspace}.{table}", timeout=120)
        cql = f"INSERT INTO {{keyspace}}.{table} (queue, {table}) VALUES (?, ?) USING TIMESTAMP ?"
        for name, start in starts.items():
            self._write(cql, (name, start, start))

    def miscount_unseen(self, mailbox_id: str, extra: int) -> None:
        """A mailbox's unseen counter is off by `extra`."""
        cql = "UPDATE {keyspace}.mailbox_counters SET unseen = unseen + ? WHERE mailbox_id = ?"
        self._write(cql, (extra, mailbox_id))

    def lose_counters(self, mailbox_id: str) -> None:
        """A mailbox's counters read as none: zeroed, as a counter deleted in Cassandra cannot be counted
        again."""
        count, unseen = self.stored_counters()[mailbox_id]
        self._write(
            "UPDATE {keyspace}.mailbox_counters SET count = count - ?, unseen = unseen - ? "
            "WHERE mailbox_id = ?",
            (count, unseen, mailbox_id),
        )

    def put_projection_entry(self, mailbox_id: str, uid: int, message_id: str, flags: str) -> None:
        """A `message_id_table` entry written (or overwritten) directly, ignoring the source of truth."""
        self._write(
            "INSERT INTO {keyspace}.message_id_table (mailbox_id, uid, message_id, flags) "
            "VALUES (?, ?, ?, ?)",
            (mailbox_id, uid, message_id, flags),
        )

    def _write(self, cql: str, parameters: tuple) -> None:
        """A statement on a table of the keyspace, which the statement names as `{keyspace}.<table>`."""
        self.session.execute(self.servers.prepare(cql.format(keyspace=self.keyspace)), parameters)


class RabbitMQBackend(CassandraBackend):
    """Cassandra + S3 + RabbitMQ on the harness's servers, the broker in a virtual host of the test's own.
    The broker's probes read RabbitMQ through AMQP, which shows how many messages a queue holds ready
    but not the unacknowledged ones: those are the ones the test's runtimes hold, which their brokers
    tell (`RabbitMQBroker.held`). A message is lost or corrupted by taking every ready message and
    publishing the others again as they were."""

    name = "rabbitmq"
    leases_end_with_their_consumer = True  # RabbitMQ sees the consumer's connection close
    broker_knows_leases = False  # AMQP shows the ready messages, not the unacknowledged ones

    def __init__(
        self,
        servers: CassandraS3,
        keyspace: str,
        bucket: str,
        rabbitmq: RabbitMQServer,
        vhost: str,
        vhosts: Vhosts | None = None,
        queue_type: str = "classic",
    ) -> None:
        """`vhosts`: the pool `vhost` came from, which gets it back for the next test at `close` (None for
        a backend sharing another's vhost); `queue_type` the broker URL's `queues`."""
        super().__init__(Path("/nonexistent/rabbitmq-has-no-broker-dir"), servers, keyspace, bucket)
        self.rabbitmq = rabbitmq
        self.vhost = vhost
        self.vhosts = vhosts
        self.queue_type = queue_type
        self._probe: pika.BlockingConnection | None = None

    def url(self, **options: object) -> str:
        broker = f"amqp://{self.rabbitmq.host}:{self.rabbitmq.port}/{quote(self.vhost, safe='')}"
        if self.queue_type != "classic":
            broker += f"?queues={self.queue_type}"
        return super().url(broker=broker, **options)

    def elsewhere(self) -> RabbitMQBackend:
        return RabbitMQBackend(
            self.servers,
            f"{self.keyspace}_elsewhere",
            self.bucket,
            self.rabbitmq,
            self.vhost,
            queue_type=self.queue_type,
        )

    def close(self) -> None:
        super().close()
        # A vhost costs RabbitMQ two message stores and a rabbitmqctl call a batch: the next test gets
        # this one once its queues are deleted. One that still has a consumer (a runtime the test left
        # open) would take the next test's messages, so its vhost is not handed on.
        if self.vhosts is not None and self._delete_queues():
            self.vhosts.give_back(self.vhost)
        if self._probe is not None and self._probe.is_open:
            self._probe.close()

    def _delete_queues(self) -> bool:
        """Delete the RabbitMQ queues of every mail queue the test used; False if one still has a
        consumer."""
        for queue in self._queue_names():
            names, dead_letters = rabbitmq_queues(queue, self.queue_type)
            for name in (*names, dead_letters):
                channel = self._channel()
                try:
                    if self.queue_type == "quorum":
                        # Quorum queues refuse if_unused: their consumers are counted instead.
                        if channel.queue_declare(name, passive=True).method.consumer_count:
                            return False
                        channel.queue_delete(name)
                    else:
                        channel.queue_delete(name, if_unused=True)
                except pika.exceptions.ChannelClosedByBroker as refused:
                    # PRECONDITION_FAILED: in use; NOT_FOUND: never declared (a quorum queue's band)
                    assert refused.reply_code in (404, 406), refused
                    if refused.reply_code == 406:
                        return False
                    continue
                channel.close()
        return True

    def _channel(self):
        if self._probe is None or not self._probe.is_open:
            params = replace_vhost(self.rabbitmq.connection_parameters(), self.vhost)
            self._probe = pika.BlockingConnection(params)
        return self._probe.channel()

    def _queue_names(self) -> list[str]:
        return sorted({"spool", *(queue for (queue,) in self._rows("SELECT queue FROM queues"))})

    def _ready(self, queue: str) -> int:
        """Messages ready in the queue's RabbitMQ queues (0 when never declared)."""
        return sum(self._ready_in(name) for name in rabbitmq_queues(queue, self.queue_type)[0])

    def _ready_in(self, name: str) -> int:
        channel = self._channel()
        try:
            return channel.queue_declare(name, passive=True).method.message_count
        except pika.exceptions.ChannelClosedByBroker as closed:
            assert closed.reply_code == 404, closed
            return 0
        finally:
            if channel.is_open:
                channel.close()

    def _broker_messages(self) -> list[tuple]:
        """(queue, enqueue id, lease end) of every message leased to a runtime of the test, and (queue,
        None, None) for every other one: ready in RabbitMQ, or received by a consumer and not handed out
        (which an idle consumer gives back: either way deliverable, no lease taken)."""
        rows: list[tuple] = []
        for queue in self._queue_names():
            for runtime in self._opened:
                rows += [(queue, enqueue_id, until) for enqueue_id, until in runtime.broker.held(queue)]
            rows += [(queue, None, None)] * self._ready(queue)
        return [
            (queue, None, None) if until is None else (queue, enqueue_id, until)
            for queue, enqueue_id, until in rows
        ]

    def lease_state(self) -> list[tuple]:
        return sorted(self._broker_messages(), key=repr)

    def _rewrite(self, queue: str, enqueue_id: str, change) -> None:
        """Take every ready message of the queue and publish the others again as they were, the one of
        `enqueue_id` as `change(body)` makes it (None: not at all)."""
        channel = self._channel()
        channel.confirm_delivery()
        found = 0
        for name in rabbitmq_queues(queue, self.queue_type)[0]:
            ready = channel.queue_declare(name, passive=True).method.message_count
            for _ in range(ready):
                method, properties, body = channel.basic_get(name)
                if method is None:
                    break
                if properties.message_id == enqueue_id:
                    found += 1
                    body = change(body)
                if body is not None:
                    channel.basic_publish("", name, body, properties=properties)
                channel.basic_ack(method.delivery_tag)
        channel.close()
        assert found == 1, f"{enqueue_id} is not ready in RabbitMQ ({found} found)"

    def lose_broker_message(self, queue: str, enqueue_id: str) -> None:
        self._rewrite(queue, enqueue_id, lambda body: None)

    def corrupt_broker_message(self, queue: str, enqueue_id: str) -> None:
        self._rewrite(queue, enqueue_id, lambda body: b'{"not": "a mail"')


def replace_vhost(parameters: pika.ConnectionParameters, vhost: str) -> pika.ConnectionParameters:
    parameters.virtual_host = vhost
    return parameters


@contextmanager
def open_backend(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Backend]:
    """The backend of the deployment `request.param` names (embedded, cassandra, rabbitmq or
    rabbitmq-quorum, RabbitMQ with quorum queues), emptied,
    closed at the end: what a `backend` fixture parametrized by deployment yields."""
    if request.param == "embedded":
        opened: Backend = EmbeddedBackend(tmp_path / "data")
    else:
        servers: CassandraS3 = request.getfixturevalue("cassandra_s3")
        # The AWS chain finds the harness's keys, in this process and the agents it starts.
        for variable in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
            monkeypatch.delenv(variable, raising=False)
        for variable, value in servers.s3_server.env().items():
            monkeypatch.setenv(variable, value)
        keyspace, bucket = request.getfixturevalue("keyspace_name"), request.getfixturevalue("bucket_name")
        if request.param == "cassandra":
            opened = CassandraBackend(tmp_path / "broker", servers, keyspace, bucket)
        else:
            vhosts = request.getfixturevalue("rabbitmq_vhosts")
            opened = RabbitMQBackend(
                servers,
                keyspace,
                bucket,
                request.getfixturevalue("rabbitmq_server"),
                vhosts.take(),
                vhosts,
                queue_type="quorum" if request.param == "rabbitmq-quorum" else "classic",
            )
        opened.empty()
    try:
        yield opened
    finally:
        opened.close()
