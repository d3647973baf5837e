"""The floor of the mail queue on Cassandra + S3 + a broker: the backend calls that one enqueue and one
dequeue + done() make, issued directly with cassandra-driver, boto3, and sqlite3 for the embedded broker or
pika for RabbitMQ (rabbitmq_floor.py), without mailq.

Not a benchmark itself; queue_throughput.py runs it beside mailq in the same run, on the same servers, so
that their ratio says what mailq's own work costs. The calls, in mailq's order and with its concurrency:

  enqueue         blob_tables.current            SELECT the current reference generation
                  content.put x2                 PutObject with a CRC32 checksum, one after the other
                  blob_tables.add_blobs          INSERT INTO blobs x2, one unlogged batch
                  blob_tables.add_references     one unlogged batch of two INSERTs (one partition)
                  view.insert                    INSERT the writer's share of the slice's count, then
                                                 INSERT INTO enqueued_mails
                  (destinations.count)           INSERT the writer's share of the destination domain's
                                                 count (untimed, as mailq's)
                  broker.publish                 a SQLite transaction: INSERT INTO broker_messages;
                                                 RabbitMQ: a publish, waiting for its confirmation
  dequeue + done  broker.receive                 a SQLite transaction: claim the next message;
                                                 RabbitMQ: the next message of a consumer
                  view.is_live                   SELECT the deletion mark and browse_start, concurrently
                                                 (mailq: the mark alone for a mail of the current slice)
                  content.get x2                 GetObject, checksum checked, one after the other
                  view.mark_done                 INSERT INTO deleted_mails, then INSERT the writer's
                                                 shares of the slice's and the destination domain's
                                                 counts, one unlogged batch
                  blob_tables.current            SELECT the current GC iteration (mailq: once a second)
                  blob_tables.add_deletions      INSERT INTO blob_deletions x2 (the blob ids the row
                                                 names), one unlogged batch
                  blob_tables.remove_references  DELETE the owner's references (one IN)
                  broker.ack                     a SQLite transaction: DELETE FROM broker_messages;
                                                 RabbitMQ: basic_ack

They are the calls of mailq_runtime/stores/cassandra (queue_view.py, blobs.py), blobs/s3_store.py and
brokers/embedded.py or brokers/rabbitmq/, as queue/ (enqueuer.py, dequeuer.py, settlement.py) and
blobs/dedup.py make them, each filed under the runtime's call it stands for (call_timings.py), so that the
two breakdowns line up; the embedded broker's SQLite writes are mailq's cost as much as the servers'
calls, so they are in the floor too, on a file of their own. What the floor leaves out is mailq's own
work: the message split and hashed, the payload encoded and decoded, the Mail built, the ids generated;
and, amortised over many mails, the queue's creation, the look for due delayed mails once a second and the
browse_start update on one dequeue in 1000.

Beside it, the James-like floor (JamesFloor): the statements James's RabbitMQ mail queue makes per mail,
issued with the same clients, without mailq's exact size nor record 39's references and deletions;
queue_throughput.py runs it in the same phases with the same threads, taking turns with the others:

  enqueue         content.put x2          the header and the body, PutObject with a CRC32 checksum
                  view.insert             INSERT INTO enqueued_mails (James's enqueuedMailsV4 row)
                  broker.publish          a publish waiting for its confirmation (or the SQLite write)
  dequeue + done  broker.receive          the next message
                  view.is_live            SELECT the deletion mark (James's deletedMailsV2)
                  content.get x2          GetObject, checksum checked
                  view.mark_done          INSERT INTO deleted_mails, a plain insert (no transaction)
                  broker.ack              basic_ack (or the SQLite delete)

Its mails are made by the floor's `new_mail`, so the rows, contents and payloads weigh as mailq's do.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any, Protocol

from call_timings import Timings
from cassandra.cluster import Session
from cassandra.concurrent import execute_concurrent_with_args
from cassandra.query import BatchStatement, BatchType, PreparedStatement
from deployments import new_servers

from mailq_runtime.queue.destinations import slot_of
from mailq_runtime.settings import Settings
from mailq_runtime.stores.embedded import SYNCHRONOUS
from mailq_runtime.stores.records import EnqueuedMail

_SHARE = (
    "INSERT INTO slice_counters (queue, slice_start, bucket, epoch, writer, enqueued, deleted) "
    "VALUES (?, ?, ?, ?, 'floor', ?, ?) USING TIMESTAMP ?"
)
_EPOCH = 10_000_000  # mailq_runtime/stores/cassandra/queue_view.py's EPOCH, microseconds


def share(row: tuple, now: int, enqueued: int, deleted: int) -> tuple:
    """A share's parameters for the mail of `row` at `now` (the values stand for the running counts)."""
    return (*row[:3], now - now % _EPOCH, enqueued, deleted, now)


_STATEMENTS = {
    "generation": "SELECT number FROM generations WHERE kind = ? LIMIT 1",
    "add_blob": "INSERT INTO blobs (blob_id, generation, size, created_at) VALUES (?, ?, ?, ?)",
    "add_reference": "INSERT INTO blob_references (owner, blob_id, generation) VALUES (?, ?, ?)",
    # A writer's share (mailq_runtime/stores/cassandra/tallies.py): the slice's counts of an epoch.
    "count_enqueued": _SHARE,
    "insert": "INSERT INTO enqueued_mails (queue, slice_start, bucket, enqueue_id, enqueued_time, "
    "next_delivery, priority, name, sender, recipients, header_blob_id, body_blob_id, metadata, counted_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "is_marked": "SELECT enqueue_id FROM deleted_mails WHERE queue = ? AND enqueue_id = ?",
    "browse_start": "SELECT browse_start FROM browse_start WHERE queue = ?",
    "mark": "INSERT INTO deleted_mails (queue, enqueue_id, counted_at) VALUES (?, ?, ?)",
    "count_deleted": _SHARE,
    "count_destination": "INSERT INTO destination_counters (queue, domain, state, slot, writer, mails) "
    "VALUES (?, ?, ?, ?, 'floor', ?) USING TIMESTAMP ?",
    "add_deletion": "INSERT INTO blob_deletions (generation, shard, blob_id, deleted_at, gc_iteration) "
    "VALUES (?, ?, ?, ?, ?)",
    "remove_references": "DELETE FROM blob_references WHERE owner = ? AND blob_id IN ?",
    # Set by a queue's first enqueue only, as mailq's: a later round in the next slice must not move it
    # past the mails of the round before, which would then no longer be live.
    "set_browse_start": "INSERT INTO browse_start (queue, browse_start) VALUES (?, ?) IF NOT EXISTS",
}
_PUBLISH = (
    "INSERT INTO broker_messages (queue, enqueue_id, priority, available_at, payload) VALUES (?,?,?,0,?)"
)
_CLAIM = (
    "UPDATE broker_messages SET lease = ?, available_at = ?, attempts = attempts + 1 "
    "WHERE id = (SELECT id FROM broker_messages INDEXED BY broker_order "
    "WHERE queue = ? AND available_at <= ? "
    "ORDER BY priority DESC, enqueue_id LIMIT 1) RETURNING id, enqueue_id, payload, attempts"
)
_ACK = "DELETE FROM broker_messages WHERE id = ? AND lease = ?"
_VISIBILITY_TIMEOUT = 300 * 1_000_000


_TABLE = re.compile(r"\b(FROM|INTO|UPDATE)\s+(?=[a-z_]+\b)")
_HISTORY = {
    "queue": "INSERT INTO queues (queue, created_at, first_slice_start) VALUES (?, ?, ?)",
    "browse_start": "INSERT INTO browse_start (queue, browse_start) VALUES (?, ?)",
    "content_start": "INSERT INTO content_start (queue, content_start) VALUES (?, ?)",
    "row": _STATEMENTS["insert"],
    "mark": "INSERT INTO deleted_mails (queue, enqueue_id) VALUES (?, ?)",
    # The slices' folded rows, as a recount leaves them.
    "counters": "INSERT INTO slice_counters (queue, slice_start, bucket, epoch, writer, enqueued, deleted) "
    "VALUES (?, ?, ?, -1, '', ?, ?)",
}

_JAMES_STATEMENTS = {
    "insert": "INSERT INTO enqueued_mails (queue, slice_start, bucket, enqueue_id, enqueued_time, "
    "next_delivery, priority, name, sender, recipients, header_blob_id, body_blob_id, metadata) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "is_marked": "SELECT enqueue_id FROM deleted_mails WHERE queue = ? AND enqueue_id = ?",
    "mark": "INSERT INTO deleted_mails (queue, enqueue_id) VALUES (?, ?)",
}


@dataclass(frozen=True)
class FloorMail:
    """What mailq would have computed for one mail before its calls: ids, the row, the payload."""

    enqueue_id: str
    blob_ids: tuple[str, str]
    contents: tuple[bytes, bytes]
    row: tuple
    payload: str


class FloorBroker(Protocol):
    """The broker's calls of the floor: `receive` answers the next message's enqueue id and a handle."""

    def declare(self, queue: str) -> None: ...

    def publish(self, queue: str, enqueue_id: str, payload: str, priority: int) -> None: ...

    def receive(self, queue: str) -> tuple[str, Any]: ...

    def ack(self, handle: Any) -> None: ...

    def close(self) -> None: ...


class SQLiteFloorBroker:
    """The embedded broker's transactions on a SQLite file of its schema in `work` (next to the broker's
    own, so on the same disk)."""

    def __init__(self, work: Path, durability: str) -> None:
        self.db = sqlite3.connect(work / "floor.db", isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={SYNCHRONOUS[durability]}")
        self.db.execute("PRAGMA cache_size=-65536")
        self.db.executescript(files("mailq_runtime.stores.embedded").joinpath("schema.sql").read_text())
        # The threads take turns on one connection, as the runtime's do (stores/embedded/store.py).
        self.turn = threading.RLock()

    def _sqlite(self, sql: str, parameters: tuple) -> tuple | None:
        with self.turn:
            self.db.execute("BEGIN IMMEDIATE")
            row = self.db.execute(sql, parameters).fetchone()
            self.db.execute("COMMIT")
        return row

    def declare(self, queue: str) -> None:
        """Nothing: a broker message names its queue."""

    def publish(self, queue: str, enqueue_id: str, payload: str, priority: int) -> None:
        self._sqlite(_PUBLISH, (queue, enqueue_id, priority, payload))

    def receive(self, queue: str) -> tuple[str, Any]:
        now = time.time_ns() // 1000
        lease = os.urandom(8).hex()
        claimed = self._sqlite(_CLAIM, (lease, now + _VISIBILITY_TIMEOUT, queue, now))
        if claimed is None:
            raise AssertionError("the floor's broker ran dry before every mail was dequeued")
        return claimed[1], (claimed[0], lease)

    def ack(self, handle: Any) -> None:
        self._sqlite(_ACK, handle)

    def close(self) -> None:
        self.db.close()


class Floor:
    """The bare calls, on the URL's keyspace, bucket and broker. `prepare()` once the runtime has created
    the keyspace."""

    def __init__(self, settings: Settings, session: Session, s3, broker: FloorBroker) -> None:
        assert settings.cassandra is not None and settings.s3 is not None
        keyspace = settings.cassandra.keyspace
        self.session = session
        self.s3 = s3
        self.broker = broker
        self.keyspace = keyspace
        self.bucket = settings.s3.bucket
        self.prefix = settings.s3.prefix
        self.statements: dict[str, PreparedStatement] = {}
        self.mails: dict[str, FloorMail] = {}
        self.timings: Timings | None = None

    def prepare(self) -> None:
        self.statements = self._prepared(_STATEMENTS)

    def _prepared(self, statements: dict[str, str]) -> dict[str, PreparedStatement]:
        """Qualified with the keyspace, as the runtime's store prepares them."""
        return {
            name: self.session.prepare(_TABLE.sub(rf"\1 {self.keyspace}.", cql, count=1))
            for name, cql in statements.items()
        }

    def close(self) -> None:
        self.broker.close()

    def _timed(self, kind: str, call: Callable[[], object]) -> object:
        if self.timings is None:
            return call()
        started = time.perf_counter()
        result = call()
        self.timings.add(kind, time.perf_counter() - started)
        return result

    def _batch(self, statement: PreparedStatement, parameter_sets: list[tuple]) -> None:
        """One unlogged batch of the rows, as the store writes a mail's blob rows and deletions."""
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        for parameters in parameter_sets:
            batch.add(statement, parameters)
        self.session.execute(batch)

    def create_queue(self, queue: str, slice_start: int) -> None:
        self.session.execute(self.statements["set_browse_start"], (queue, slice_start))
        self.broker.declare(queue)

    def new_mail(self, queue: str, slice_start: int, message: bytes, number: int) -> FloorMail:
        """The ids, row and payload of one mail, computed before the clock starts."""
        now = time.time_ns() // 1000
        enqueue_id = f"{now:016x}{os.urandom(8).hex()}"
        cut = message.find(b"\r\n\r\n") + 4
        contents = (message[:cut], message[cut:])
        blob_ids = (f"g1_{os.urandom(32).hex()}", f"g1_{os.urandom(32).hex()}")
        metadata = {
            "attributes": {},
            "state": "root",
            "error_message": None,
            "remote_host": "localhost",
            "remote_addr": "127.0.0.1",
            "per_recipient_headers": [],
            "last_updated": now,
        }
        row = (
            queue,
            slice_start,
            0,
            enqueue_id,
            now,
            now,
            5,
            f"mail-{number}",
            "bench@example.com",
            '["sink@example.org"]',
            blob_ids[0],
            blob_ids[1],
            json.dumps(metadata),
        )
        # The size and shape of mailq's payload, so that the broker's writes weigh the same.
        payload = EnqueuedMail.from_row(row).to_payload()
        mail = FloorMail(enqueue_id, blob_ids, contents, row, payload)
        self.mails[enqueue_id] = mail
        return mail

    def write_history(self, queue: str, first: int, window: int, per_slice: int, history: int) -> None:
        """`history` processed mails from slice `first` on, `per_slice` a slice, as the API would have
        left them: the queue and its starts at `first`, the rows, their deletion marks and the counters."""
        statements = self._prepared(_HISTORY)
        self.session.execute(statements["queue"], (queue, first, first))
        self.session.execute(statements["browse_start"], (queue, first))
        self.session.execute(statements["content_start"], (queue, first))
        rows, counts = [], {}
        for i in range(history):
            slice_start = first + (i // per_slice) * window
            at = slice_start + (i % per_slice) * (window // per_slice)
            rows.append(
                (
                    queue,
                    slice_start,
                    0,
                    f"{at:016x}{i:016x}",
                    at,
                    at,
                    5,
                    f"mail-{i}",
                    "bench@example.com",
                    '["sink@example.org"]',
                    f"g1_{os.urandom(32).hex()}",
                    f"g1_{os.urandom(32).hex()}",
                    "{}",
                )
            )
            counts[slice_start] = counts.get(slice_start, 0) + 1
        for statement, parameters in (
            (statements["row"], [(*row, row[4]) for row in rows]),
            (statements["mark"], [(queue, row[3]) for row in rows]),
            (statements["counters"], [(queue, start, 0, n, n) for start, n in counts.items()]),
        ):
            execute_concurrent_with_args(
                self.session, statement, parameters, concurrency=64, raise_on_first_error=True
            )

    def put_contents(self, mail: FloorMail) -> None:
        """The header and the body, one PutObject after the other, with a CRC32 checksum."""
        for blob_id, data in zip(mail.blob_ids, mail.contents, strict=True):
            self._timed(
                "content.put",
                lambda blob_id=blob_id, data=data: self.s3.put_object(
                    Bucket=self.bucket, Key=self.prefix + blob_id, Body=data, ChecksumAlgorithm="CRC32"
                ),
            )

    def get_contents(self, mail: FloorMail) -> None:
        """The header and the body, one GetObject after the other, the checksum checked."""
        for blob_id in mail.blob_ids:
            self._timed(
                "content.get",
                lambda blob_id=blob_id: self.s3.get_object(
                    Bucket=self.bucket, Key=self.prefix + blob_id, ChecksumMode="ENABLED"
                )["Body"].read(),
            )

    def enqueue(self, mail: FloorMail) -> None:
        statements, session, now = self.statements, self.session, mail.row[4]
        self._timed(
            "blob_tables.current",
            lambda: session.execute(statements["generation"], ("reference_generation",)).one(),
        )
        self.put_contents(mail)

        self._timed(
            "blob_tables.add_blobs",
            lambda: self._batch(
                statements["add_blob"],
                [
                    (blob_id, 1, len(data), now)
                    for blob_id, data in zip(mail.blob_ids, mail.contents, strict=True)
                ],
            ),
        )

        def add_references() -> None:
            batch = BatchStatement(batch_type=BatchType.UNLOGGED)
            for blob_id in mail.blob_ids:
                batch.add(statements["add_reference"], (mail.enqueue_id, blob_id, 1))
            session.execute(batch)

        self._timed("blob_tables.add_references", add_references)

        def insert() -> None:
            session.execute(statements["count_enqueued"], share(mail.row, now, 1, 0))
            session.execute(statements["insert"], (*mail.row, now))

        self._timed("view.insert", insert)
        session.execute(
            statements["count_destination"], (mail.row[0], "example.org", "queued", slot_of(now), 1, now)
        )
        self._timed(
            "broker.publish", lambda: self.broker.publish(mail.row[0], mail.enqueue_id, mail.payload, 5)
        )

    def dequeue_done(self, queue: str) -> None:
        statements, session = self.statements, self.session
        enqueue_id, handle = self._timed("broker.receive", lambda: self.broker.receive(queue))
        mail = self.mails[enqueue_id]
        now = time.time_ns() // 1000

        def is_live() -> bool:
            marked = session.execute_async(statements["is_marked"], (queue, mail.enqueue_id))
            start = session.execute_async(statements["browse_start"], (queue,))
            return marked.result().one() is None and start.result().one()[0] <= mail.row[1]

        if not self._timed("view.is_live", is_live):
            raise AssertionError(f"the floor's mail {mail.enqueue_id} is not live")
        self.get_contents(mail)

        def mark_done() -> None:
            session.execute(statements["mark"], (queue, mail.enqueue_id, now))
            counts = BatchStatement(batch_type=BatchType.UNLOGGED)
            counts.add(statements["count_deleted"], share(mail.row, now, 0, 1))
            counts.add(
                statements["count_destination"],
                (queue, "example.org", "queued", slot_of(mail.row[4]), 0, now),
            )
            session.execute(counts)

        self._timed("view.mark_done", mark_done)
        held = list(mail.blob_ids)  # the row names them
        iteration = self._timed(
            "blob_tables.current", lambda: session.execute(statements["generation"], ("gc_iteration",)).one()
        )
        self._timed(
            "blob_tables.add_deletions",
            lambda: self._batch(
                statements["add_deletion"],
                [
                    (1, zlib.crc32(blob_id.encode()) % 16, blob_id, now, iteration.number if iteration else 1)
                    for blob_id in held
                ],
            ),
        )
        self._timed(
            "blob_tables.remove_references",
            lambda: session.execute(statements["remove_references"], (mail.enqueue_id, held)),
        )
        self._timed("broker.ack", lambda: self.broker.ack(handle))


class JamesFloor:
    """James's per-mail statements on the floor's session, bucket and broker. `prepare()` once the runtime
    has created the keyspace."""

    def __init__(self, floor: Floor) -> None:
        self.floor = floor
        self.statements: dict = {}

    def prepare(self) -> None:
        self.statements = self.floor._prepared(_JAMES_STATEMENTS)

    def _timed(self, kind: str, call: Callable[[], object]) -> object:
        return self.floor._timed(kind, call)

    def enqueue(self, mail: FloorMail) -> None:
        floor = self.floor
        floor.put_contents(mail)
        self._timed("view.insert", lambda: floor.session.execute(self.statements["insert"], mail.row))
        self._timed(
            "broker.publish", lambda: floor.broker.publish(mail.row[0], mail.enqueue_id, mail.payload, 5)
        )

    def dequeue_done(self, queue: str) -> None:
        floor, session = self.floor, self.floor.session
        enqueue_id, handle = self._timed("broker.receive", lambda: floor.broker.receive(queue))
        mail = floor.mails[enqueue_id]
        marked = self._timed(
            "view.is_live",
            lambda: session.execute(self.statements["is_marked"], (queue, mail.enqueue_id)).one(),
        )
        if marked is not None:
            raise AssertionError(f"the James-like floor's mail {mail.enqueue_id} is marked deleted")
        floor.get_contents(mail)
        self._timed(
            "view.mark_done", lambda: session.execute(self.statements["mark"], (queue, mail.enqueue_id))
        )
        self._timed("broker.ack", lambda: floor.broker.ack(handle))


@contextmanager
def distributed(
    settings: Settings, scratch: Path, threads: int, mail_queues: Iterable[str]
) -> Iterator[Floor]:
    """The floor on the URL's keyspace, bucket and broker, for up to `threads` callers at a time. The
    keyspace and bucket must not exist yet (the runtime's creating open makes them), nor on RabbitMQ the
    objects of the `mail_queues` the run will use; at the end the keyspace is dropped, the bucket emptied
    and deleted, and on RabbitMQ those objects and the floor's queues deleted. The embedded broker's
    floor is a file in `scratch`."""
    assert settings.cassandra is not None
    with new_servers(settings) as (session, s3):
        broker: FloorBroker
        if settings.amqp is None:
            broker = SQLiteFloorBroker(scratch, settings.durability)
        else:
            from rabbitmq_floor import RabbitMQFloorBroker, mail_queue_objects

            objects = mail_queue_objects(mail_queues)
            broker = RabbitMQFloorBroker(
                settings.amqp, settings.tls_files, settings.cassandra.keyspace, threads, objects
            )
        floor = Floor(settings, session, s3, broker)
        try:
            yield floor
        finally:
            floor.close()
