"""What the hot calls of the Cassandra metadata store cost, one call at a time, in milliseconds.

    .venv/bin/python benchmarks/cassandra_calls.py [--calls N] [--host H] [--port P] [--datacenter D]

Host, port and datacenter default to $MAILQ_CASSANDRA_HOST/_PORT/_DATACENTER, which
`python -m tests.servers env cassandra` prints for the harness's node. Works in a fresh keyspace, dropped
at the end. Measures the queue view's insert, is_live and mark_deleted, the blob tables'
add_references (two new blobs, as an enqueue of fresh content) and release, and allocate_uid, beside
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

from mailq_runtime.model import BlobId, EnqueueId
from mailq_runtime.queue_view import EnqueuedMail
from mailq_runtime.stores.cassandra import (
    CassandraBlobTables,
    CassandraMailboxTables,
    CassandraQueueView,
    CassandraStore,
)

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--host", default=os.environ.get("MAILQ_CASSANDRA_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("MAILQ_CASSANDRA_PORT", "9042")))
    parser.add_argument("--datacenter", default=os.environ.get("MAILQ_CASSANDRA_DATACENTER"))
    args = parser.parse_args()
    keyspace = f"mailq_bench_{int(time.time())}"
    store = CassandraStore(
        [args.host],
        keyspace,
        port=args.port,
        local_datacenter=args.datacenter,
        request_timeout=60,
        create=True,
    )
    try:
        view, blobs, mailboxes = (
            CassandraQueueView(store),
            CassandraBlobTables(store),
            CassandraMailboxTables(store),
        )
        view.create_queue("bench", SLICE, NOW)
        mailboxes.create_mailbox("0" * 32, "bench@example.com", "INBOX")
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
            "add_references (2 new blobs)": timed(
                calls,
                lambda n: blobs.add_references(
                    f"owner-{n}",
                    [(BlobId(1, f"{2 * n:064x}"), 1000), (BlobId(1, f"{2 * n + 1:064x}"), 9000)],
                    NOW,
                ),
            ),
            "release (2 references)": timed(calls, lambda n: blobs.release(f"owner-{n}", None, 1, NOW)),
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
