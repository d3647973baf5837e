"""A James-like floor on Cassandra + S3 + a broker: the statements James's RabbitMQ mail queue makes per mail,
issued directly with the floor's clients (queue_floor.py's cassandra-driver session, boto3 client and
broker), without mailq's exact size nor record 39's references and deletions.

Not a benchmark itself; queue_throughput.py runs it beside mailq and the floor of mailq's own calls, in
the same phases with the same threads, taking turns with them. Per mail:

  enqueue         content.put x2          the header and the body, PutObject with a CRC32 checksum
                  view.insert             INSERT INTO enqueued_mails (James's enqueuedMailsV4 row)
                  broker.publish          a publish waiting for its confirmation (or the SQLite write)
  dequeue + done  broker.receive          the next message
                  view.is_live            SELECT the deletion mark (James's deletedMailsV2)
                  content.get x2          GetObject, checksum checked
                  view.mark_deleted       INSERT INTO deleted_mails, a plain insert (no transaction)
                  broker.ack              basic_ack (or the SQLite delete)

Its mails are made by the floor's `new_mail`, so the rows, contents and payloads weigh as mailq's do.
"""

from __future__ import annotations

from collections.abc import Callable

from queue_floor import Floor, FloorMail

_STATEMENTS = {
    "insert": "INSERT INTO enqueued_mails (queue, slice_start, bucket, enqueue_id, enqueued_time, "
    "next_delivery, priority, name, sender, recipients, header_blob_id, body_blob_id, metadata) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "is_marked": "SELECT enqueue_id FROM deleted_mails WHERE queue = ? AND enqueue_id = ?",
    "mark": "INSERT INTO deleted_mails (queue, enqueue_id) VALUES (?, ?)",
}


class JamesFloor:
    """James's per-mail statements on the floor's session, bucket and broker. `prepare()` once the runtime
    has created the keyspace."""

    def __init__(self, floor: Floor) -> None:
        self.floor = floor
        self.statements: dict = {}

    def prepare(self) -> None:
        self.statements = self.floor._prepared(_STATEMENTS)

    def _timed(self, kind: str, call: Callable[[], object]) -> object:
        return self.floor._timed(kind, call)

    def enqueue(self, mail: FloorMail) -> None:
        floor = self.floor
        for blob_id, data in zip(mail.blob_ids, mail.contents, strict=True):
            self._timed(
                "content.put",
                lambda blob_id=blob_id, data=data: floor.s3.put_object(
                    Bucket=floor.bucket, Key=floor.prefix + blob_id, Body=data, ChecksumAlgorithm="CRC32"
                ),
            )
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
        for blob_id in mail.blob_ids:
            self._timed(
                "content.get",
                lambda blob_id=blob_id: floor.s3.get_object(
                    Bucket=floor.bucket, Key=floor.prefix + blob_id, ChecksumMode="ENABLED"
                )["Body"].read(),
            )
        self._timed(
            "view.mark_done", lambda: session.execute(self.statements["mark"], (queue, mail.enqueue_id))
        )
        self._timed("broker.ack", lambda: floor.broker.ack(handle))
