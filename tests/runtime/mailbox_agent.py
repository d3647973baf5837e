"""Another process on the same data directory, for the blob, mailbox and worker tests. Prints JSON.

    mailbox_agent.py <url> save <owner prefix> <count> <start at>     save one content <count> times
    mailbox_agent.py <url> append <mailbox id> <count> <start at>     append <count> messages, print uids
    mailbox_agent.py <url> worker <queue> <domain> <idle seconds> <start at>   run a worker, print stats

<start at> is a time.time() value: both processes of a test start their loop together.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict

from mailq_runtime import Runtime, run_worker

CONTENT = b"the same content, saved from several processes\r\n"
_PAUSE_SECONDS = 0.005


def _wait_until(start_at: str) -> None:
    time.sleep(max(0.0, float(start_at) - time.time()))


def _paced(operation: Callable[[int], object], count: int) -> list:
    results = []
    for i in range(count):
        results.append(operation(i))
        # A writer kept waiting by SQLite sleeps in its busy handler: without a pause between operations
        # one process may finish before the other ever gets the lock, and the two would not interleave.
        time.sleep(_PAUSE_SECONDS)
    return results


def main(url: str, command: str, *arguments: str) -> object:
    with Runtime.open(url) as runtime:
        if command == "save":
            prefix, count, start_at = arguments
            _wait_until(start_at)
            return _paced(lambda i: str(runtime.blobs.save(f"{prefix}-{i}", CONTENT)), int(count))
        if command == "append":
            mailbox, count, start_at = arguments
            _wait_until(start_at)
            return _paced(
                lambda i: runtime.mailboxes.append(mailbox, f"Subject: {i}\r\n\r\nbody {i}\r\n".encode()).uid,
                int(count),
            )
        if command == "worker":
            queue, domain, idle, start_at = arguments
            _wait_until(start_at)
            return asdict(run_worker(runtime, queue, local_domains=[domain], idle_timeout=float(idle)))
    raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:])))
