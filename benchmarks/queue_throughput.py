"""The mail queue's throughput on the embedded default, against raw SQLite on the same disk.

    .venv/bin/python benchmarks/queue_throughput.py [--mails N] [--size BYTES] [--history N] [--live N]
                                                    [--profile enqueue|dequeue]

Measures, on a fresh data dir next to the repository (same disk, removed at the end):
  1. enqueue of N mails of ~10 KiB, each with a random body so that nothing deduplicates, from
     `--threads` concurrent callers (as an MTA's SMTP sessions are; they take turns), and of N/4 from
     one thread for comparison;
  2. dequeue + done() of each, likewise;
  3. size() on a queue with a long history (`--history` processed mails over 30 days of 1h slices,
     browse_start left at its start: the worst case) and `--live` live mails, checked against the live
     count;
  4. the raw rate of one-row SQLite transactions (BEGIN IMMEDIATE; INSERT; COMMIT) in WAL mode with the
     runtime's default durability: the ceiling any queue operation on this disk works under.
Prints one line per measure, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import base64
import cProfile
import json
import os
import pstats
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

from mailq_runtime import Mail, Runtime
from mailq_runtime.clock import MICROS_PER_SECOND
from mailq_runtime.queue import slice_of
from mailq_runtime.settings import Settings
from mailq_runtime.stores.embedded import SYNCHRONOUS

REPOSITORY = Path(__file__).resolve().parent.parent
HISTORY_DAYS = 30
SIZE_CALLS = 200
RAW_TRANSACTIONS = 20_000
TARGET_RATE = 3000
TARGET_RATIO = 0.2
TARGET_SIZE_MS = 5.0


def ms(seconds: list[float], fraction: float) -> float:
    """The `fraction` percentile of `seconds`, in milliseconds."""
    ordered = sorted(seconds)
    return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] * 1e3, 3)


def message(size: int) -> bytes:
    """An RFC 5322 message of about `size` bytes whose body is random (base64 of random bytes)."""
    headers = (
        f"From: bench@example.com\r\nTo: sink@example.org\r\nSubject: benchmark\r\n"
        f"Message-ID: <{os.urandom(8).hex()}@example.com>\r\nMIME-Version: 1.0\r\n"
        "Content-Type: application/octet-stream\r\nContent-Transfer-Encoding: base64\r\n\r\n"
    ).encode()
    body_size = max(size - len(headers), 4)
    # base64 lines hold 57 input bytes in 77 output bytes (76 characters and a newline).
    return headers + base64.encodebytes(os.urandom(body_size * 57 // 77))


def bench_mail(size: int) -> Mail:
    return Mail(recipients=("sink@example.org",), sender="bench@example.com", message=message(size))


def profiled(enabled: bool, phase: Callable[[], list[float]]) -> list[float]:
    """Run `phase`, under cProfile if asked: the top costs go to stderr, the figures stay on stdout."""
    if not enabled:
        return phase()
    profile = cProfile.Profile()
    latencies = profile.runcall(phase)
    pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(20)
    return latencies


def _run_threads(threads: int, mails: int, operation: Callable[[int], None]) -> tuple[list[float], float]:
    """Run `operation(i)` for i in range(mails) on `threads` threads; per-call latencies and wall time."""
    latencies: list[list[float]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def work(lane: int) -> None:
        try:
            for i in range(lane, mails, threads):
                started = time.perf_counter()
                operation(i)
                latencies[lane].append(time.perf_counter() - started)
        except BaseException as error:
            errors.append(error)

    workers = [threading.Thread(target=work, args=(lane,)) for lane in range(threads)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    wall = time.perf_counter() - started
    if errors:
        raise errors[0]
    return [latency for lane in latencies for latency in lane], wall


def enqueue_phase(runtime: Runtime, mails: int, size: int, threads: int) -> tuple[list[float], float]:
    queue = runtime.queue(f"throughput-{threads}")
    # Built before the clock starts: the generator is not what is measured.
    prepared = [bench_mail(size) for _ in range(mails)]
    return _run_threads(threads, mails, lambda i: queue.enqueue(prepared[i]))


def dequeue_phase(runtime: Runtime, mails: int, threads: int) -> tuple[list[float], float]:
    queue = runtime.queue(f"throughput-{threads}")

    def take(_: int) -> None:
        item = queue.dequeue(timeout=5)
        if item is None:
            raise AssertionError("the queue ran dry before every enqueued mail was dequeued")
        item.done()

    measured = _run_threads(threads, mails, take)
    if queue.size() != 0:
        raise AssertionError(f"{queue.size()} mails left after dequeuing all of them")
    return measured


def build_history(runtime: Runtime, history: int) -> int:
    """Insert `history` processed mails straight into the runtime's tables, spread over HISTORY_DAYS of
    slices, and leave browse_start and content_start at its start. Returns the number of slices.

    Through the API this would take minutes; generated inside SQLite it takes seconds, and size() reads
    exactly what the API would have written: rows, deletion marks and per-slice counters.
    """
    window = runtime.view_configuration.slice_window
    now = runtime.clock()
    first = slice_of(now - HISTORY_DAYS * 86400 * MICROS_PER_SECOND, window)
    slices = (slice_of(now, window) - first) // window
    per_slice = -(-history // slices)
    with runtime.store.transaction() as db:
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


def size_phase(runtime: Runtime, live: int, size: int) -> tuple[list[float], int, float]:
    """size() latencies on the history queue, its answer, and the seconds a browse takes to count."""
    queue = runtime.queue("history")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mails", type=int, default=20_000, help="mails to enqueue, then dequeue")
    parser.add_argument("--size", type=int, default=10_240, help="bytes per mail")
    parser.add_argument("--history", type=int, default=1_000_000, help="processed mails behind size()")
    parser.add_argument("--live", type=int, default=1000, help="live mails counted by size()")
    parser.add_argument("--threads", type=int, default=8, help="concurrent callers, as SMTP sessions are")
    parser.add_argument("--profile", choices=("enqueue", "dequeue"), help="print a phase's top costs")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix=".bench-", dir=REPOSITORY))
    try:
        settings = Settings(backend="embedded", data_dir=work / "throughput")
        synchronous = SYNCHRONOUS[settings.durability]
        print(f"data dir {work} (durability {settings.durability}: synchronous={synchronous})")
        with Runtime(settings, create=True) as runtime:
            single_enqueue = enqueue_phase(runtime, args.mails // 4, args.size, 1)
            single_dequeue = dequeue_phase(runtime, args.mails // 4, 1)
            enqueue, enqueue_wall = profiled(
                args.profile == "enqueue", lambda: enqueue_phase(runtime, args.mails, args.size, args.threads)
            )
            dequeue, dequeue_wall = profiled(
                args.profile == "dequeue", lambda: dequeue_phase(runtime, args.mails, args.threads)
            )
        with Runtime(Settings(backend="embedded", data_dir=work / "history"), create=True) as runtime:
            started = time.perf_counter()
            slices = build_history(runtime, args.history)
            history_seconds = time.perf_counter() - started
            sizes, answer, browse_seconds = size_phase(runtime, args.live, args.size)
        raw_rate = raw_sqlite_rate(work / "raw.db", synchronous, RAW_TRANSACTIONS)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    enqueue_rate, dequeue_rate = args.mails / enqueue_wall, args.mails / dequeue_wall
    figures = {
        "threads": args.threads,
        "enqueue_per_s": round(enqueue_rate),
        "dequeue_ack_per_s": round(dequeue_rate),
        "single_thread_enqueue_per_s": round(args.mails // 4 / single_enqueue[1]),
        "single_thread_dequeue_ack_per_s": round(args.mails // 4 / single_dequeue[1]),
        "enqueue_p50_ms": ms(enqueue, 0.5),
        "enqueue_p99_ms": ms(enqueue, 0.99),
        "dequeue_p50_ms": ms(dequeue, 0.5),
        "dequeue_p99_ms": ms(dequeue, 0.99),
        "size_p50_ms": ms(sizes, 0.5),
        "size_p99_ms": ms(sizes, 0.99),
        "size_by_browse_ms": round(browse_seconds * 1e3),
        "raw_sqlite_tx_per_s": round(raw_rate),
        "enqueue_ratio_to_raw": round(enqueue_rate / raw_rate, 3),
        "dequeue_ratio_to_raw": round(dequeue_rate / raw_rate, 3),
    }
    figures["targets"] = {
        "enqueue_ge_3000_per_s": enqueue_rate >= TARGET_RATE,
        "dequeue_ack_ge_3000_per_s": dequeue_rate >= TARGET_RATE,
        "enqueue_ratio_ge_0.2": figures["enqueue_ratio_to_raw"] >= TARGET_RATIO,
        "dequeue_ratio_ge_0.2": figures["dequeue_ratio_to_raw"] >= TARGET_RATIO,
        "size_p99_le_5ms": figures["size_p99_ms"] <= TARGET_SIZE_MS,
        "size_equals_live": answer == args.live,
    }
    f = figures
    print(
        f"enqueue          {f['enqueue_per_s']:6} mails/s  p50 {f['enqueue_p50_ms']} ms"
        f"  p99 {f['enqueue_p99_ms']} ms  ({args.mails} mails of {args.size} bytes, {args.threads} threads;"
        f" one thread: {f['single_thread_enqueue_per_s']} mails/s)"
    )
    print(
        f"dequeue + done() {f['dequeue_ack_per_s']:6} mails/s  p50 {f['dequeue_p50_ms']} ms"
        f"  p99 {f['dequeue_p99_ms']} ms  (one thread: {f['single_thread_dequeue_ack_per_s']} mails/s)"
    )
    print(
        f"history          {args.history} processed mails in {slices} slices, inserted with SQL "
        f"in {history_seconds:.1f} s"
    )
    print(
        f"size()           {answer} (live: {args.live})  p50 {f['size_p50_ms']} ms"
        f"  p99 {f['size_p99_ms']} ms; counting by browse instead takes {f['size_by_browse_ms']} ms"
    )
    print(
        f"raw SQLite       {f['raw_sqlite_tx_per_s']:6} one-row transactions/s; ratios: enqueue "
        f"{f['enqueue_ratio_to_raw']}, dequeue + done() {f['dequeue_ratio_to_raw']}"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
