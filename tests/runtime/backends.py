"""The deployments the runtime contract suite runs on, each answering the named hooks of probes.py.

A backend opens runtimes on one deployment (and other processes on it), and answers `Probes` in its own
terms: here, and nowhere else in the tests, are the deployment's tables read or damaged. A new deployment
joins by adding a class with the same methods and a param to the `backend` fixture in conftest.py; the
tests themselves do not change.

- `EmbeddedBackend`: the embedded default, one SQLite file in a data directory.
- `CassandraBackend`: Cassandra for the metadata, S3 for the content, on the harness's servers
  (mailq_servers), with the embedded broker in a directory of the test's own.
- `RabbitMQBackend`: the same with RabbitMQ as the broker, in a virtual host of the test's own.
- `HostBedBackend`: the same on the host bed's servers, each on a host of its own (tests/hosts).
"""

from __future__ import annotations

import secrets
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
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
from mailq_runtime.stores.records import EnqueuedMail
from mailq_servers.urls import distributed_url

from .probes import BlobState, MailboxState, QueueRows

if TYPE_CHECKING:
    from botocore.client import BaseClient
    from cassandra.cluster import Session
    from cassandra.query import PreparedStatement

    from mailq_servers.cassandra import CassandraServer
    from mailq_servers.rabbitmq import RabbitMQServer, Vhosts
    from mailq_servers.rabbitmq_cluster import RabbitMQClusterServer
    from mailq_servers.s3 import S3Server

AGENT = Path(__file__).with_name("agent.py")
# The logical tables every deployment has: what `state` reads.
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
    "held_mails",
    "destination_counters",
    "destination_notes",
    "destination_suspensions",
    "destination_bounces",
    "destination_slots",
    "destination_sends",
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
    the embedded broker's hooks (the broker in `broker_dir`)."""

    name: str
    # Whether one operation's writes commit together (group_writes): only then does commit order follow
    # the order the core decided things in (uids, references).
    groups_writes: bool
    # Whether the broker gives a consumer's mails back as soon as it dies, not once their leases end.
    leases_end_with_their_consumer = False
    # Whether the broker tells which messages are leased (in flight), not only how many wait.
    broker_knows_leases = True
    # Whether a mail's count is written apart from its row (Cassandra's insert counts, then writes the
    # row), not in the row's transaction.
    counts_apart_from_rows = False
    # The start of the NoStore message of an open where nothing was created yet (a regex).
    missing_store: str
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

    # The embedded broker: its table in the SQLite file of its directory

    def _sql(self, sql: str, parameters: tuple = ()) -> tuple[list[tuple], int]:
        """The rows a statement on the SQLite file of `broker_dir` returns, and how many it changed
        (committed)."""
        with closing(sqlite3.connect(self.broker_dir / "mailq.db", timeout=30)) as db, db:
            cursor = db.execute(sql, parameters)
            return cursor.fetchall(), cursor.rowcount

    def _broker_messages(self) -> list[tuple]:
        if not (self.broker_dir / "mailq.db").exists():
            return []
        return self._sql("SELECT * FROM broker_messages")[0]

    def broker_messages(self) -> int:
        return len(self._broker_messages())

    def leases(self) -> list[tuple]:
        return self._sql("SELECT id, lease, available_at FROM broker_messages ORDER BY id")[0]

    def lose_broker_message(self, queue: str, enqueue_id: str) -> None:
        lost = self._sql(
            "DELETE FROM broker_messages WHERE queue = ? AND enqueue_id = ?", (queue, enqueue_id)
        )
        assert lost[1] == 1

    def corrupt_broker_message(self, queue: str, enqueue_id: str) -> None:
        corrupted = self._sql(
            "UPDATE broker_messages SET payload = ? WHERE queue = ? AND enqueue_id = ?",
            ('{"not": "a mail"', queue, enqueue_id),
        )
        assert corrupted[1] == 1


class EmbeddedBackend(Backend):
    """The embedded default: one SQLite file in a data directory, the broker's table in it too."""

    name = "embedded"
    groups_writes = True
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

    def _rows(self, sql: str, parameters: tuple = ()) -> list[tuple]:
        return self._sql(sql, parameters)[0]

    # Observing

    def exists(self) -> bool:
        return self.data_dir.exists()

    def state(self) -> dict[str, list[tuple]]:
        return {table: sorted(self._rows(f"SELECT * FROM {table}"), key=repr) for table in TABLES}

    def queue_rows(self, queue: str) -> QueueRows:
        where = "WHERE queue = ?"
        return QueueRows(
            slices=dict(
                self._rows(f"SELECT slice_start, COUNT(*) FROM enqueued_mails {where} GROUP BY 1", (queue,))
            ),
            buckets=frozenset(
                b for (b,) in self._rows(f"SELECT bucket FROM enqueued_mails {where}", (queue,))
            ),
            deletion_marks=self._rows(f"SELECT COUNT(*) FROM deleted_mails {where}", (queue,))[0][0],
            counted_slices=[
                s
                for (s,) in self._rows(f"SELECT slice_start FROM slice_counters {where} ORDER BY 1", (queue,))
            ],
        )

    def blob_state(self) -> BlobState:
        return BlobState(
            blobs=dict(self._rows("SELECT blob_id, generation FROM blobs")),
            references=self._rows("SELECT owner, blob_id, generation FROM blob_references ORDER BY rowid"),
            deletions=sorted(self._rows("SELECT blob_id, generation, gc_iteration FROM blob_deletions")),
            contents=frozenset(b for (b,) in self._rows("SELECT blob_id FROM blob_content")),
        )

    def mailbox_state(self) -> MailboxState:
        entries = "SELECT mailbox_id, uid, message_id, flags FROM"
        return MailboxState(
            mailboxes={m for (m,) in self._rows("SELECT mailbox_id FROM mailboxes")},
            source_of_truth=set(self._rows(f"{entries} imap_uid_table")),
            projection=set(self._rows(f"{entries} message_id_table")),
            counters={
                m: (c, u) for m, c, u in self._rows("SELECT mailbox_id, count, unseen FROM mailbox_counters")
            },
            messages={
                m: (h, b)
                for m, h, b in self._rows("SELECT message_id, header_blob_id, body_blob_id FROM messages")
            },
        )

    def uids_in_write_order(self, mailbox_id: str) -> list[int]:
        sql = "SELECT uid FROM imap_uid_table WHERE mailbox_id = ? ORDER BY rowid"
        return [uid for (uid,) in self._rows(sql, (mailbox_id,))]

    # Damaging

    def _changes(self, sql: str, parameters: tuple = ()) -> int:
        return self._sql(sql, parameters)[1]

    def lose_content(self, blob_id: str) -> None:
        assert self._changes("DELETE FROM blob_content WHERE blob_id = ?", (blob_id,)) == 1

    def damage_blob_rows(self, *, lose: str | None = None, add: tuple[str, int] | None = None) -> None:
        if lose is not None:
            assert self._changes("DELETE FROM blobs WHERE blob_id = ?", (lose,)) == 1
        if add is not None:
            self._changes(
                "INSERT INTO blobs (blob_id, generation, size, created_at) VALUES (?, ?, 10, 0)", add
            )

    def add_reference(self, owner: str, blob_id: str, generation: int) -> None:
        sql = "INSERT INTO blob_references (owner, blob_id, generation) VALUES (?, ?, ?)"
        self._changes(sql, (owner, blob_id, generation))

    def miscount_slice(self, queue: str, slice_start: int, extra: int) -> None:
        sql = "UPDATE slice_counters SET enqueued = enqueued + ? WHERE queue = ? AND slice_start = ?"
        assert self._changes(sql, (extra, queue, slice_start)) == 1

    def move_starts(
        self, queue: str, *, browse_start: int | None = None, content_start: int | None = None
    ) -> None:
        for table, value in (("browse_start", browse_start), ("content_start", content_start)):
            if value is not None:
                self._changes(f"UPDATE {table} SET {table} = ? WHERE queue = ?", (value, queue))

    def lose_counters(self, mailbox_id: str) -> None:
        assert self._changes("DELETE FROM mailbox_counters WHERE mailbox_id = ?", (mailbox_id,)) == 1

    def put_projection_entry(self, mailbox_id: str, uid: int, message_id: str, flags: str) -> None:
        self._changes(
            "INSERT OR REPLACE INTO message_id_table (mailbox_id, uid, message_id, flags) "
            "VALUES (?, ?, ?, ?)",
            (mailbox_id, uid, message_id, flags),
        )

    def as_older_version(self, lacking: str) -> None:
        table, _, column = lacking.partition(".")
        self._sql(f"ALTER TABLE {table} DROP COLUMN {column}" if column else f"DROP TABLE {table}")


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
    counts_apart_from_rows = True
    model_steps = 60

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
        reads, yet a deleted counter cannot be counted again. So is slice_counters: a fold's deletion of
        shares, timestamped after every clock (stores/cassandra/slice_counts.py), shows in no read and
        would shadow the shares the next test counts in the same fake-clock slices."""
        if not self._keyspace_exists():
            return
        # All at once: a round trip each, one after the other, cost a busy test run minutes.
        looks = {
            name: self.session.execute_async(f"SELECT * FROM {self.keyspace}.{name} LIMIT 1")
            for name, cql in CASSANDRA_TABLES.items()
            if " counter" not in cql and name != "slice_counters"
        }
        full = [name for name, look in looks.items() if look.result().one() is not None]
        counters = [name for name in CASSANDRA_TABLES if name not in looks]
        truncations = [
            self.session.execute_async(f"TRUNCATE {self.keyspace}.{name}", timeout=120)
            for name in full + counters
        ]
        for truncation in truncations:
            truncation.result()

    def _keyspace_exists(self) -> bool:
        known = self.session.execute(
            "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = %s", (self.keyspace,)
        )
        return known.one() is not None

    def _rows(self, cql: str, parameters: tuple = ()) -> list[tuple]:
        # Prepared: a plain statement's markers are %s, not the ? the probes write.
        statement = self.servers.prepare(cql.replace("FROM ", f"FROM {self.keyspace}.", 1))
        return [tuple(row) for row in self.session.execute(statement, parameters)]

    def _write(self, cql: str, parameters: tuple) -> None:
        """A statement on a table of the keyspace, which the statement names as `{keyspace}.<table>`."""
        self.session.execute(self.servers.prepare(cql.format(keyspace=self.keyspace)), parameters)

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

    # Observing

    def exists(self) -> bool:
        """The keyspace, or the broker's directory."""
        self.session.cluster.refresh_schema_metadata()
        return self.keyspace in self.session.cluster.metadata.keyspaces or self.broker_dir.exists()

    def state(self) -> dict[str, list[tuple]]:
        """Every table of the keyspace, the broker's messages and the content's objects."""
        state = {table: sorted(self._rows(f"SELECT * FROM {table}"), key=repr) for table in CASSANDRA_TABLES}
        state["broker_messages"] = sorted(self._broker_messages(), key=repr)
        state["blob_content"] = sorted(self._objects())
        return state

    def queue_rows(self, queue: str) -> QueueRows:
        filtered = "WHERE queue = ? ALLOW FILTERING"
        rows = self._rows(f"SELECT slice_start, bucket FROM enqueued_mails {filtered}", (queue,))
        slices: dict[int, int] = {}
        for start, _ in rows:
            slices[start] = slices.get(start, 0) + 1
        counted = self._rows("SELECT slice_start FROM slice_counters WHERE queue = ?", (queue,))
        return QueueRows(
            slices=slices,
            buckets=frozenset(bucket for _, bucket in rows),
            deletion_marks=len(self._rows(f"SELECT enqueue_id FROM deleted_mails {filtered}", (queue,))),
            counted_slices=sorted({s for (s,) in counted}),
        )

    def blob_state(self) -> BlobState:
        """The references in the order of their write timestamps."""
        references = self._rows(
            "SELECT owner, blob_id, generation, writetime(generation) FROM blob_references"
        )
        return BlobState(
            blobs=dict(self._rows("SELECT blob_id, generation FROM blobs")),
            references=[row[:3] for row in sorted(references, key=lambda row: row[3])],
            deletions=sorted(self._rows("SELECT blob_id, generation, gc_iteration FROM blob_deletions")),
            contents=frozenset(blob_id for blob_id, _ in self._objects()),
        )

    def mailbox_state(self) -> MailboxState:
        """Counters summed over the writers' shares (stores/cassandra/tallies.py); none written reads as 0."""
        entries = "SELECT mailbox_id, uid, message_id, flags FROM"
        mailboxes = {m for (m,) in self._rows("SELECT mailbox_id FROM mailboxes")}
        counters = dict.fromkeys(mailboxes, (0, 0))
        for m, c, u in self._rows("SELECT mailbox_id, count, unseen FROM mailbox_counters"):
            count, unseen = counters.get(m, (0, 0))
            counters[m] = (count + (c or 0), unseen + (u or 0))
        return MailboxState(
            mailboxes=mailboxes,
            source_of_truth=set(self._rows(f"{entries} imap_uid_table")),
            projection=set(self._rows(f"{entries} message_id_table")),
            counters=counters,
            messages={
                m: (h, b)
                for m, h, b in self._rows("SELECT message_id, header_blob_id, body_blob_id FROM messages")
            },
        )

    def uids_in_write_order(self, mailbox_id: str) -> list[int]:
        """In the order of their write timestamps."""
        rows = self._rows(
            "SELECT uid, writetime(flags) FROM imap_uid_table WHERE mailbox_id = ?", (mailbox_id,)
        )
        return [uid for uid, _ in sorted(rows, key=lambda row: row[1])]

    # Damaging

    def lose_content(self, blob_id: str) -> None:
        assert blob_id in {key for key, _ in self._objects()}
        self.s3.delete_object(Bucket=self.bucket, Key=self.prefix + blob_id)

    def lose_row(self, mail: EnqueuedMail) -> None:
        self._write(
            "DELETE FROM {keyspace}.enqueued_mails WHERE queue = ? AND slice_start = ? AND bucket = ? "
            "AND enqueue_id = ?",
            (mail.queue, mail.slice_start, mail.bucket, mail.enqueue_id),
        )

    def damage_blob_rows(self, *, lose: str | None = None, add: tuple[str, int] | None = None) -> None:
        if lose is not None:
            self._write("DELETE FROM {keyspace}.blobs WHERE blob_id = ?", (lose,))
        if add is not None:
            cql = "INSERT INTO {keyspace}.blobs (blob_id, generation, size, created_at) VALUES (?, ?, 10, 0)"
            self._write(cql, add)

    def add_reference(self, owner: str, blob_id: str, generation: int) -> None:
        cql = "INSERT INTO {keyspace}.blob_references (owner, blob_id, generation) VALUES (?, ?, ?)"
        self._write(cql, (owner, blob_id, generation))

    def miscount_slice(self, queue: str, slice_start: int, extra: int) -> None:
        """In one of its buckets: a share of a writer of its own, in an epoch long settled."""
        self._write(
            "INSERT INTO {keyspace}.slice_counters (queue, slice_start, bucket, epoch, writer, enqueued, "
            "deleted) VALUES (?, ?, 0, 0, 'damage', ?, 0)",
            (queue, slice_start, extra),
        )

    def move_starts(
        self, queue: str, *, browse_start: int | None = None, content_start: int | None = None
    ) -> None:
        """The runtime writes a start with its value as the write timestamp, so that it only moves
        forward: to move one anywhere, the table is written anew, every queue's start with its own."""
        for table, value in (("browse_start", browse_start), ("content_start", content_start)):
            if value is None:
                continue
            starts = dict(self._rows(f"SELECT queue, {table} FROM {table}"))
            starts[queue] = value
            self.session.execute(f"TRUNCATE {self.keyspace}.{table}", timeout=120)
            cql = f"INSERT INTO {{keyspace}}.{table} (queue, {table}) VALUES (?, ?) USING TIMESTAMP ?"
            for name, start in starts.items():
                self._write(cql, (name, start, start))

    def lose_counters(self, mailbox_id: str) -> None:
        """Zeroed, by a share of a writer of its own (a deleted row would come back with the next write of
        the runtime's share)."""
        shares = self._rows(
            "SELECT writer, count, unseen FROM mailbox_counters WHERE mailbox_id = ?", (mailbox_id,)
        )
        others = [(c or 0, u or 0) for writer, c, u in shares if writer != "damage"]
        self._write(
            "INSERT INTO {keyspace}.mailbox_counters (mailbox_id, writer, count, unseen) "
            "VALUES (?, 'damage', ?, ?)",
            (mailbox_id, -sum(c for c, _ in others), -sum(u for _, u in others)),
        )

    def put_projection_entry(self, mailbox_id: str, uid: int, message_id: str, flags: str) -> None:
        self._write(
            "INSERT INTO {keyspace}.message_id_table (mailbox_id, uid, message_id, flags) "
            "VALUES (?, ?, ?, ?)",
            (mailbox_id, uid, message_id, flags),
        )

    def as_older_version(self, lacking: str) -> None:
        table, _, column = lacking.partition(".")
        change = (
            f"ALTER TABLE {self.keyspace}.{table} DROP {column}"
            if column
            else f"DROP TABLE {self.keyspace}.{table}"
        )
        self.session.execute(change, timeout=120)


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
        if not self._keyspace_exists():  # a test that made nothing (a URL refused, say)
            return ["spool"]
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

    def leases(self) -> list[tuple]:
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


class HostBedBackend(RabbitMQBackend):
    """The whole deployment on the host bed (docs/hosts.md): a keyspace replicated on its three Cassandra
    hosts, a bucket on its objects host and quorum queues on its three RabbitMQ hosts, in a vhost of the
    module's own. This process reaches them across the bed's bridge, and the agents it starts run on a
    client host (`on_host` makes an argv one run there), as clients on other machines would."""

    name = "hosts"

    def __init__(
        self,
        servers: CassandraS3,
        keyspace: str,
        bucket: str,
        cluster: RabbitMQClusterServer,
        vhost: str,
        on_host: Callable[[list[str]], list[str]],
    ) -> None:
        super().__init__(servers, keyspace, bucket, cluster.node_server(1, vhost), vhost, queue_type="quorum")
        self.cluster = cluster
        self.on_host = on_host

    def agent(self, *arguments: str, **options: object) -> subprocess.Popen:
        return subprocess.Popen(
            self.on_host([sys.executable, str(AGENT), self.url(**options), *arguments]),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def url(self, **options: object) -> str:
        broker = self.cluster.broker_url(self.vhost, queues="quorum")
        return CassandraBackend.url(self, broker=broker, replication=3, **options)

    def close(self) -> None:
        # One vhost serves a module's tests: each leaves it without queues, so no message of its own (a
        # dead letter waiting to be drained, say) reaches the next test.
        CassandraBackend.close(self)
        self._delete_queues()
        if self._probe is not None and self._probe.is_open:
            self._probe.close()

    def elsewhere(self) -> HostBedBackend:
        return HostBedBackend(
            self.servers, f"{self.keyspace}_elsewhere", self.bucket, self.cluster, self.vhost
        )


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
