"""The most eight threads' enqueues can reach on the embedded store at `fsync`, whatever mailq's Python does.

    .venv/bin/python benchmarks/enqueue_ceiling.py [--mails N] [--size BYTES] [--rounds N] [--threads N]

The statements one mailq enqueue makes on the embedded store (traced with sqlite3's trace callback: the
reference generation's read, the header and body contents, their `blobs` rows and references, the view
row, its slice and destination counts, the broker message), their values built before the clock starts,
replayed with sqlite3 from one thread in groups of `--threads` mails a transaction and one sync of the WAL
a group, as the holder of the store's turn commits eight threads' enqueues: on the same disk, in a store
made by the runtime (the same schema and page size) with the connection's pragmas of the store. Two
replays: `statements`, each mail's statements in a savepoint of its own as mailq's group members are;
`executemany`, one `executemany` a table a group (no savepoints, the generation read once a group).

Each round runs, alternating their order, mailq from one thread and from `--threads` threads
(queue_phases.enqueue_phase) and the two replays, each on a fresh store of its own; the ratios are taken
within a round. Each replay's store is checked to hold as many rows in each table as mailq's.
Prints a line a round and a side, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sqlite3
import statistics
import tempfile
import time
import zlib
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

from queue_phases import bench_mail, enqueue_phase, warm_up

from mailq_runtime import Mail, Runtime
from mailq_runtime.model import BlobId, EnqueueId
from mailq_runtime.queue import slice_of
from mailq_runtime.queue.destinations import moves
from mailq_runtime.queue.enqueuer import split_message
from mailq_runtime.settings import EMBEDDED, Settings
from mailq_runtime.stores.embedded import DATABASE_FILE, SYNCHRONOUS
from mailq_runtime.stores.records import EnqueuedMail

REPOSITORY = Path(__file__).resolve().parent.parent
QUEUE = "spool"
# The tables an enqueue adds rows to, whose rows the replays must match mailq's (the counters' rows are
# per slice and slot of time, which a round may or may not cross).
TABLES = ("blob_content", "blobs", "blob_references", "enqueued_mails", "broker_messages")
GENERATION = "SELECT MAX(number) FROM generations WHERE kind = 'reference_generation'"
CONTENT = "INSERT OR REPLACE INTO blob_content (blob_id, data) VALUES (?, ?)"
BLOB = "INSERT OR IGNORE INTO blobs (blob_id, generation, size, created_at) VALUES (?, ?, ?, ?)"
REFERENCE = "INSERT OR IGNORE INTO blob_references (owner, blob_id, generation) VALUES (?, ?, ?)"
VIEW_ROW = (
    "INSERT OR IGNORE INTO enqueued_mails (queue, slice_start, bucket, enqueue_id, enqueued_time, "
    "next_delivery, priority, name, sender, recipients, header_blob_id, body_blob_id, metadata) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"
)
SLICE_COUNT = (
    "INSERT INTO slice_counters (queue, slice_start, enqueued) VALUES (?, ?, 1) "
    "ON CONFLICT (queue, slice_start) DO UPDATE SET enqueued = enqueued + 1"
)
DESTINATION_COUNT = (
    "INSERT INTO destination_counters (queue, domain, state, slot, mails) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (queue, domain, state, slot) DO UPDATE SET mails = mails + excluded.mails RETURNING mails"
)
BROKER = "INSERT INTO broker_messages (queue, enqueue_id, priority, available_at, payload) VALUES (?,?,?,0,?)"
# The store's own connection settings (store.py): at `fsync` SQLite commits as at `power` and the store
# syncs the WAL once a group.
CACHE_SIZE = -65536


class Replayed:
    """One mail's statements' values, by table."""

    __slots__ = ("contents", "blobs", "references", "view_row", "slice_count", "counts", "broker")

    def __init__(self, runtime: Runtime, mail: Mail, now: int) -> None:
        configuration = runtime.view_configuration
        enqueue_id = EnqueueId.generate(now)
        parts = split_message(mail.message)
        ids = [BlobId.of_checked(1, hashlib.sha256(part).hexdigest()) for part in parts]
        bucket = zlib.crc32(mail.name.encode()) % configuration.bucket_count
        slice_start = slice_of(now, configuration.slice_window)
        row = EnqueuedMail.of(mail, QUEUE, enqueue_id, now, now, 5, slice_start, bucket, *ids)
        self.contents = [(str(blob_id), part) for blob_id, part in zip(ids, parts, strict=True)]
        self.blobs = [(str(blob_id), 1, len(part), now) for blob_id, part in zip(ids, parts, strict=True)]
        self.references = [(enqueue_id, str(blob_id), 1) for blob_id in ids]
        self.view_row = row.row()
        self.slice_count = (QUEUE, slice_start)
        self.counts = [(QUEUE, c.domain, c.state, c.slot, c.mails) for c in moves(row, 1)]
        self.broker = (QUEUE, enqueue_id, row.priority, row.to_payload())


def replay_statements(db: sqlite3.Connection, group: list[Replayed]) -> None:
    """As mailq's group: the first mail in the transaction, each other in a savepoint of its own."""
    for index, mail in enumerate(group):
        if index:
            db.execute("SAVEPOINT member")
        db.execute(GENERATION).fetchone()
        db.executemany(CONTENT, mail.contents)
        db.executemany(BLOB, mail.blobs)
        db.executemany(REFERENCE, mail.references)
        db.execute(VIEW_ROW, mail.view_row)
        db.execute(SLICE_COUNT, mail.slice_count)
        for count in mail.counts:
            db.execute(DESTINATION_COUNT, count).fetchone()
        db.execute(BROKER, mail.broker)
        if index:
            db.execute("RELEASE member")


def replay_executemany(db: sqlite3.Connection, group: list[Replayed]) -> None:
    """One executemany a table for the whole group."""
    db.execute(GENERATION).fetchone()
    db.executemany(CONTENT, [row for mail in group for row in mail.contents])
    db.executemany(BLOB, [row for mail in group for row in mail.blobs])
    db.executemany(REFERENCE, [row for mail in group for row in mail.references])
    db.executemany(VIEW_ROW, [mail.view_row for mail in group])
    db.executemany(SLICE_COUNT, [mail.slice_count for mail in group])
    # RETURNING rows are stepped through by executemany without being read, as a caller would not need them.
    db.executemany(DESTINATION_COUNT, [count for mail in group for count in mail.counts])
    db.executemany(BROKER, [mail.broker for mail in group])


REPLAYS: dict[str, Callable[[sqlite3.Connection, list[Replayed]], None]] = {
    "statements": replay_statements,
    "executemany": replay_executemany,
}


def made_store(data_dir: Path, size: int) -> Runtime:
    """A store as every side starts from: made by the runtime, its queue warmed up."""
    runtime = Runtime(Settings(backend=EMBEDDED, data_dir=data_dir), create=True)
    warm_up(runtime, QUEUE, size)
    return runtime


def replay(data_dir: Path, mails: int, size: int, group: int, kind: str) -> float:
    """Mails a second of the bare statements, `group` mails a commit and one WAL sync a commit."""
    with made_store(data_dir, size) as runtime:
        now = time.time_ns() // 1000
        prepared = [Replayed(runtime, bench_mail(size), now + i) for i in range(mails)]
    groups = [prepared[start : start + group] for start in range(0, mails, group)]
    write = REPLAYS[kind]
    with closing(sqlite3.connect(data_dir / DATABASE_FILE, isolation_level=None)) as db:
        db.execute(f"PRAGMA synchronous={SYNCHRONOUS['power']}")
        db.execute(f"PRAGMA cache_size={CACHE_SIZE}")
        wal = os.open(f"{data_dir / DATABASE_FILE}-wal", os.O_RDONLY | os.O_CLOEXEC)
        try:
            started = time.perf_counter()
            for members in groups:
                db.execute("BEGIN IMMEDIATE")
                write(db, members)
                db.execute("COMMIT")
                os.fdatasync(wal)
            return mails / (time.perf_counter() - started)
        finally:
            os.close(wal)


def mailq_rate(data_dir: Path, mails: int, size: int, threads: int) -> float:
    with made_store(data_dir, size) as runtime:
        _, wall = enqueue_phase(runtime, QUEUE, mails, size, threads)
    return mails / wall


def row_counts(data_dir: Path) -> dict[str, int]:
    with closing(sqlite3.connect(data_dir / DATABASE_FILE)) as db:
        return {table: db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] for table in TABLES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mails", type=int, default=3000, help="mails a side a round")
    parser.add_argument("--size", type=int, default=10_240, help="bytes per mail")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=8, help="mailq's callers, and the replays' group")
    args = parser.parse_args()
    sides: dict[str, Callable[[Path], float]] = {
        "mailq_1": lambda path: mailq_rate(path, args.mails, args.size, 1),
        f"mailq_{args.threads}": lambda path: mailq_rate(path, args.mails, args.size, args.threads),
        **{
            kind: lambda path, kind=kind: replay(path, args.mails, args.size, args.threads, kind)
            for kind in REPLAYS
        },
    }
    rates: dict[str, list[float]] = {side: [] for side in sides}
    work = Path(tempfile.mkdtemp(prefix=".bench-ceiling-", dir=REPOSITORY))
    try:
        for number in range(args.rounds):
            order = list(sides) if number % 2 == 0 else list(reversed(sides))
            counts = {}
            for side in order:
                data_dir = work / f"{side}-{number}"
                rates[side].append(sides[side](data_dir))
                print(f"round {number + 1} {side}: {rates[side][-1]:,.0f} mails/s", flush=True)
                counts[side] = row_counts(data_dir)
                shutil.rmtree(data_dir)
            for side in REPLAYS:
                if counts[side] != counts["mailq_1"]:
                    raise SystemExit(f"{side} wrote {counts[side]} rows, mailq {counts['mailq_1']}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    single = rates["mailq_1"]
    ratios = {
        side: [round(rate / one, 2) for rate, one in zip(rates[side], single, strict=True)] for side in sides
    }
    for side in sides:
        median = statistics.median(rates[side])
        print(
            f"{side}: median {median:,.0f} mails/s, {statistics.median(ratios[side]):.2f}x mailq's one thread"
        )
    rounded = {side: [round(rate) for rate in rates[side]] for side in sides}
    print(json.dumps({"rates": rounded, "to_one_thread": ratios, "mails": args.mails, "group": args.threads}))


if __name__ == "__main__":
    main()
