"""The Cassandra requests one enqueue and one dequeue + done() make, by statement: what a mail's CPU
follows on a distributed deployment (each request is about a millisecond of the client's and the
server's CPU together, whichever statement it carries).

    .venv/bin/python benchmarks/cassandra_requests.py --url "cassandra://...?s3=...&broker=amqp://..."

The URL names a deployment that does not exist yet, made and removed as `deployments.py` does. After a
warm-up (the queue's creation, the first generation, the prepared statements), it counts the requests
the driver sends (a batch is one request) during `--mails` enqueues, then as many dequeues + done(), by
`--threads` callers (concurrent callers may share a request); prints each statement's requests per mail,
then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from cassandra.cluster import Session
from cassandra.query import BatchStatement
from deployments import fresh_deployment
from queue_phases import bench_mail

from mailq_runtime import Runtime

_TABLE = re.compile(r"\b(?:FROM|INTO|UPDATE)\s+(?:\w+\.)?(\w+)", re.IGNORECASE)


def described(session: Session, query: object) -> str:
    """A request as "VERB table" (with IF for a lightweight transaction), or "BATCH (...)"."""
    if isinstance(query, BatchStatement):
        # A batch keeps its prepared statements by their id; the cluster knows their text.
        prepared = session.cluster._prepared_statements
        inner = sorted(
            {
                described(session, prepared[query_id] if is_prepared else query_id)
                for is_prepared, query_id, _ in query._statements_and_parameters
            }
        )
        return f"BATCH ({' + '.join(inner)})"
    cql = getattr(query, "query_string", None) or str(query)
    table = _TABLE.search(cql)
    if table is None:
        return " ".join(cql.split())[:60]
    verb = cql.split()[0].upper()
    return f"{verb} {table.group(1)}{' IF' if ' IF ' in f'{cql} ' else ''}"


@contextmanager
def counted_requests() -> Iterator[Counter]:
    """Every request this process's driver sends meanwhile, by `described`."""
    requests: Counter = Counter()
    lock = threading.Lock()
    original = Session.execute_async

    def execute_async(self, query, *args, **kwargs):
        with lock:
            requests[described(self, query)] += 1
        return original(self, query, *args, **kwargs)

    Session.execute_async = execute_async
    try:
        yield requests
    finally:
        Session.execute_async = original


def by_threads(threads: int, mails: int, call: Callable[[], object]) -> None:
    with ThreadPoolExecutor(threads) as pool:
        for done in [pool.submit(call) for _ in range(mails)]:
            done.result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="a distributed deployment that does not exist yet")
    parser.add_argument("--mails", type=int, default=50, help="mails to enqueue, then dequeue + done()")
    parser.add_argument("--size", type=int, default=10_240, help="bytes per mail")
    parser.add_argument("--threads", type=int, default=1, help="concurrent callers")
    args = parser.parse_args()
    figures = {}
    with fresh_deployment("requests", args.url) as deployment:
        runtime = Runtime.open(deployment.url)
        try:
            queue = runtime.queue("requests")
            for _ in range(3):
                queue.enqueue(bench_mail(args.size))
            for _ in range(3):
                queue.dequeue(timeout=10).done()
            mails = [bench_mail(args.size) for _ in range(args.mails)]
            with counted_requests() as enqueue:
                by_threads(args.threads, args.mails, lambda: queue.enqueue(mails.pop()))
            with counted_requests() as dequeue:
                by_threads(args.threads, args.mails, lambda: queue.dequeue(timeout=10).done())
        finally:
            runtime.close()
    for phase, requests in (("enqueue", enqueue), ("dequeue + done", dequeue)):
        per_mail = {statement: round(n / args.mails, 2) for statement, n in requests.most_common()}
        figures[phase] = {"requests": round(sum(requests.values()) / args.mails, 2), "by statement": per_mail}
        print(f"{phase}: {figures[phase]['requests']} Cassandra requests a mail")
        for statement, n in per_mail.items():
            print(f"  {n:5.2f}  {statement}")
    print(json.dumps({"threads": args.threads, **figures}))


if __name__ == "__main__":
    main()
