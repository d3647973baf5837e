"""What the hot calls of the Cassandra metadata store cost, one call at a time, in milliseconds.

    .venv/bin/python benchmarks/cassandra_calls.py [--calls N] [--host H] [--port P] [--datacenter D]

Host, port and datacenter default to $MAILQ_CASSANDRA_HOST/_PORT/_DATACENTER, which
`python -m mailq_servers env cassandra` prints for the harness's node. Works in a fresh keyspace, dropped
at the end. Measures the queue view's insert, is_live and mark_deleted, the blob tables' writes of a
save of two new blobs (add_blobs, add_references) and of its release (add_deletions, remove_references),
and the mailbox tables' allocate_uid and set_source_flags (a compare-and-set that applies), beside
the floor of one prepared INSERT and one lightweight transaction on the same node. Prints the median
and 90th percentile of each, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

from quick import parse_args

from mailq_runtime.model import BlobId, EnqueueId
from mailq_runtime.stores.cassandra import (
    CassandraBlobTables,
    CassandraMailboxTables,
    CassandraOptions,
    CassandraQueueView,
    CassandraStore,
)
from mailq_runtime.stores.records import EnqueuedMail

NOW = time.time_ns() // 1000
SLICE = NOW - NOW % (3600 * 1_000_000)


def timed(calls: int, call: Callable[[int], object]) -> dict[str, float]:
    spent = []
    for n in range(calls):
        started = time.perf_counter()
        call(n)
        spent.append((time.perf_counter() - started) * 1000)
    spent.sort()
    return {"p50_ms": round(statistics.median(spent), 2), "p90_ms": round(spent[int(len(spent) * 0.9)], 2)}


def enqueued(n: int) -> EnqueuedMail:
    return EnqueuedMail(
        "bench",
        SLICE,
        n % 4,
        EnqueueId(f"{NOW:016x}{n:016x}"),
        NOW + n,
        NOW + n,
        5,
        f"mail-{n}",
        "sender@example.com",
        '["rcpt@example.org"]',
        f"g1_{n:064x}",
        f"g1_{n + 10**9:064x}",
        '{"state": "root"}',
    )


def pair(n: int) -> list[BlobId]:
    """A message's two blobs (header and body), new for each call."""
    return [BlobId(1, f"{2 * n:064x}"), BlobId(1, f"{2 * n + 1:064x}")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--host", default=os.environ.get("MAILQ_CASSANDRA_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("MAILQ_CASSANDRA_PORT", "9042")))
    parser.add_argument("--datacenter", default=os.environ.get("MAILQ_CASSANDRA_DATACENTER"))
    args = parse_args(parser, {"calls": 20})
    keyspace = f"mailq_bench_{int(time.time())}"
    options = CassandraOptions(
        [args.host], keyspace, port=args.port, local_datacenter=args.datacenter, request_timeout=60
    )
    store = CassandraStore(options, create=True)
    try:
        view, blobs, mailboxes = (
            CassandraQueueView(store),
            CassandraBlobTables(store),
            CassandraMailboxTables(store),
        )
        view.create_queue("bench", SLICE, NOW)
        mailboxes.create_mailbox("0" * 32, "bench@example.com", "INBOX")
        mailboxes.add_to_source_of_truth("1" * 32, "0" * 32, 1, "")
        calls = args.calls
        results = {
            "floor: prepared INSERT": timed(
                calls,
                lambda n: store.execute("INSERT INTO queues (queue, created_at) VALUES (?, ?)", (f"q{n}", n)),
            ),
            "floor: INSERT IF NOT EXISTS": timed(
                calls,
                lambda n: store.execute(
                    "INSERT INTO deleted_mails (queue, enqueue_id) VALUES (?, ?) IF NOT EXISTS",
                    ("floor", str(n)),
                ),
            ),
            "insert": timed(calls, lambda n: view.insert(enqueued(n))),
            "is_live": timed(calls, lambda n: view.is_live(enqueued(n))),
            "mark_deleted": timed(
                calls, lambda n: view.mark_deleted("bench", enqueued(n).enqueue_id, SLICE, n % 4)
            ),
            "add_blobs (2 new blobs)": timed(
                calls,
                lambda n: blobs.add_blobs([(blob_id, 1000) for blob_id in pair(n)], NOW),
            ),
            "add_references (2)": timed(calls, lambda n: blobs.add_references(f"owner-{n}", pair(n))),
            "add_deletions (2)": timed(calls, lambda n: blobs.add_deletions(f"owner-{n}", pair(n), 1, NOW)),
            "remove_references (2)": timed(calls, lambda n: blobs.remove_references(f"owner-{n}", pair(n))),
            "set_source_flags": timed(
                calls,
                lambda n: mailboxes.set_source_flags(
                    "1" * 32, "0" * 32, f"$Bench{n + 1}", "" if n == 0 else f"$Bench{n}"
                ),
            ),
            "allocate_uid": timed(calls, lambda n: mailboxes.allocate_uid("0" * 32)),
        }
        for name, figures in results.items():
            print(f"{name:32} p50 {figures['p50_ms']:6.2f} ms   p90 {figures['p90_ms']:6.2f} ms")
        print(json.dumps({"calls": calls, "results": results}))
    finally:
        store.session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)
        store.close()


if __name__ == "__main__":
    main()
