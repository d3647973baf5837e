"""Another process on the same data directory, for the blob, mailbox and worker tests. Prints JSON.

    mailbox_agent.py <url> save <owner prefix> <count>          save one content <count> times
    mailbox_agent.py <url> append <mailbox id> <count>          append <count> messages, print uids
    mailbox_agent.py <url> worker <queue> <domain> <idle seconds>   run a worker, print stats
    mailbox_agent.py <url> configure <slice window>             register that window; print whether it
                                                                was appended, or the rule that refused it

Once its runtime is open the agent prints "ready" and waits for a line on stdin before it starts, so that
the processes of a test start their work together however long each took to import and open. With
`--ungrouped` after the url, every write of the core commits alone.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace

from mailq_runtime import ConfigurationRejected, Runtime, run_worker
from mailq_runtime.model import parse_duration

CONTENT = b"the same content, saved from several processes\r\n"
_PAUSE_SECONDS = 0.005


def _ready_and_wait_for_start() -> None:
    print("ready", flush=True)
    sys.stdin.readline()


def _paced(operation: Callable[[int], object], count: int) -> list:
    results = []
    for i in range(count):
        results.append(operation(i))
        # A writer kept waiting by SQLite sleeps in its busy handler: without a pause between operations
        # one process may finish before the other ever gets the lock, and the two would not interleave.
        time.sleep(_PAUSE_SECONDS)
    return results


def main(url: str, command: str, *arguments: str) -> object:
    grouped = command != "--ungrouped"
    if not grouped:
        command, *arguments = arguments
    with Runtime.open(url, create=True, group_writes=grouped) as runtime:
        _ready_and_wait_for_start()
        if command == "save":
            prefix, count = arguments
            return _paced(lambda i: str(runtime.blobs.save(f"{prefix}-{i}", CONTENT)), int(count))
        if command == "append":
            mailbox, count = arguments
            return _paced(
                lambda i: runtime.mailboxes.append(mailbox, f"Subject: {i}\r\n\r\nbody {i}\r\n".encode()).uid,
                int(count),
            )
        if command == "configure":
            (window,) = arguments
            change = replace(runtime.configuration.current(), slice_window=parse_duration(window))
            try:
                return runtime.configuration.register(change)
            except ConfigurationRejected as error:
                return str(error)
        if command == "worker":
            queue, domain, idle = arguments
            return asdict(run_worker(runtime, queue, local_domains=[domain], idle_timeout=float(idle)))
    raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:])))
