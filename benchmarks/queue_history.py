"""What queue_throughput.py's size() measure reads: a long history of processed mails written straight
into a store (SQLite statements on the embedded store, the floor's bare statements on Cassandra), size()'s
latencies against a browse, and the embedded floor, one-row SQLite transactions on the same disk.

Not a benchmark itself; imported by queue_throughput.py.
"""

from __future__ import annotations

import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING

from queue_phases import bench_mail

from mailq_runtime import Runtime
from mailq_runtime.clock import MICROS_PER_SECOND
from mailq_runtime.queue import slice_of
from mailq_runtime.stores.embedded import DATABASE_FILE

if TYPE_CHECKING:
    from queue_floor import Floor

HISTORY_DAYS = 30
SIZE_CALLS = 200


def history_slices(runtime: Runtime, history: int) -> tuple[int, int, int, int]:
    """(first slice, slice window, slices, mails per slice) of a history of HISTORY_DAYS."""
    window = runtime.view_configuration.slice_window
    now = runtime.clock()
    first = slice_of(now - HISTORY_DAYS * 86400 * MICROS_PER_SECOND, window)
    slices = (slice_of(now, window) - first) // window
    return first, window, slices, -(-history // slices)


def build_history(runtime: Runtime, history: int) -> int:
    """Insert `history` processed mails straight into the embedded store's tables, spread over
    HISTORY_DAYS of slices, and leave browse_start and content_start at its start. Returns the number of
    slices.

    Through the API this would take minutes; generated inside SQLite (on a connection of its own to the
    store's file) it takes seconds, and size() reads exactly what the API would have written: rows,
    deletion marks and per-slice counters.
    """
    first, window, slices, per_slice = history_slices(runtime, history)
    with closing(sqlite3.connect(runtime.settings.data_dir / DATABASE_FILE, timeout=30)) as db, db:
        # What the queue's first enqueue would have created.
        db.execute("INSERT INTO queues VALUES ('history', ?)", (first,))
        db.execute("INSERT INTO browse_start VALUES ('history', ?)", (first,))
        db.execute("INSERT INTO content_start VALUES ('history', ?)", (first,))
        db.execute(
            """
            WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < :history),
            m(i, slice_start, at) AS (
                SELECT i, :first + (i / :per_slice) * :window,
                       :first + (i / :per_slice) * :window + (i % :per_slice) * (:window / :per_slice) FROM n)
            INSERT INTO enqueued_mails (queue, slice_start, bucket, enqueue_id, enqueued_time, next_delivery,
                                        priority, name, sender, recipients, header_blob_id, body_blob_id,
                                        metadata)
            SELECT 'history', slice_start, 0, printf('%016x%016x', at, i), at, at, 5, printf('mail-%d', i),
                   'bench@example.com', '["sink@example.org"]', 'g1_' || lower(hex(randomblob(32))),
                   'g1_' || lower(hex(randomblob(32))), '{}'
            FROM m
            """,
            {"history": history, "first": first, "per_slice": per_slice, "window": window},
        )
        db.execute(
            "INSERT INTO deleted_mails (queue, enqueue_id) SELECT queue, enqueue_id FROM enqueued_mails "
            "WHERE queue = 'history'"
        )
        db.execute(
            "INSERT INTO slice_counters (queue, slice_start, enqueued, deleted) "
            "SELECT queue, slice_start, COUNT(*), COUNT(*) FROM enqueued_mails WHERE queue = 'history' "
            "GROUP BY slice_start"
        )
    return slices


def size_phase(runtime: Runtime, name: str, live: int, size: int) -> tuple[list[float], int, float]:
    """size() latencies on the history queue, its answer, and the seconds a browse takes to count."""
    queue = runtime.queue(name)
    for _ in range(live):
        queue.enqueue(bench_mail(size))
    latencies = []
    for _ in range(SIZE_CALLS):
        started = time.perf_counter()
        answer = queue.size()
        latencies.append(time.perf_counter() - started)
    started = time.perf_counter()
    browsed = sum(1 for _ in queue.browse())
    browse_seconds = time.perf_counter() - started
    if browsed != answer:
        raise AssertionError(f"size() says {answer}, browse finds {browsed}")
    return latencies, answer, browse_seconds


def raw_sqlite_rate(path: Path, synchronous: str, transactions: int) -> float:
    """One-row write transactions per second, with the connection settings the runtime uses."""
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={synchronous}")
        db.execute("CREATE TABLE rows (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
        started = time.perf_counter()
        for i in range(transactions):
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO rows (value) VALUES (?)", (f"row {i}",))
            db.execute("COMMIT")
        return transactions / (time.perf_counter() - started)


def build_history_distributed(runtime: Runtime, floor: Floor, name: str, history: int) -> int:
    """The same history on Cassandra, written with bare statements: rows, deletion marks, counters."""
    first, window, slices, per_slice = history_slices(runtime, history)
    floor.write_history(name, first, window, per_slice, history)
    return slices
