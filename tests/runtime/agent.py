"""Another process on the same data directory, for the contract tests that need one.

    agent.py <url> hold <queue>                          dequeue one mail, print its enqueue id, sleep
    agent.py <url> work <queue> <tag> <count> <dir>      enqueue <count> mails while consuming, then drain
    agent.py <url> trickle <queue> <count> <seconds>     print "ready", then enqueue <count> mails one every
                                                         <seconds>, printing each name once enqueued

`work` touches <dir>/produced-<tag> once its mails are enqueued and stops draining at the first empty
dequeue after <dir>/stop exists; it writes the names it consumed to <dir>/consumed-<tag>.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from mailq_runtime import Mail, Runtime

_LIMIT_SECONDS = 60


def hold(url: str, queue: str) -> None:
    with Runtime.open(url, create=True) as runtime:
        item = runtime.queue(queue).dequeue(timeout=30)
        print(item.enqueue_id if item else "none", flush=True)
        time.sleep(_LIMIT_SECONDS)


def trickle(url: str, queue_name: str, count: int, interval: float) -> None:
    with Runtime.open(url, create=True) as runtime:
        queue = runtime.queue(queue_name)
        print("ready", flush=True)
        for index in range(count):
            name = f"trickle-{index}"
            queue.enqueue(Mail(recipients=("rcpt@example.com",), message=b"Subject: x\r\n\r\nx", name=name))
            print(name, flush=True)
            time.sleep(interval)


def work(url: str, queue_name: str, tag: str, count: int, directory: Path) -> None:
    deadline = time.monotonic() + _LIMIT_SECONDS
    consumed = []
    with Runtime.open(url, create=True) as runtime:
        queue = runtime.queue(queue_name)

        def consume(timeout: float) -> bool:
            item = queue.dequeue(timeout=timeout)
            if item is None:
                return False
            consumed.append(item.mail.name)
            item.done()
            return True

        for index in range(count):
            queue.enqueue(
                Mail(recipients=("rcpt@example.com",), message=b"Subject: x\r\n\r\nx", name=f"{tag}-{index}")
            )
            consume(0)
        (directory / f"produced-{tag}").touch()
        while time.monotonic() < deadline:
            if not consume(0.3) and (directory / "stop").exists():
                break
    (directory / f"consumed-{tag}").write_text("\n".join(consumed))


if __name__ == "__main__":
    url, command, *rest = sys.argv[1:]
    if command == "hold":
        hold(url, *rest)
    elif command == "trickle":
        trickle(url, rest[0], int(rest[1]), float(rest[2]))
    else:
        tag, count, directory = rest[1:]
        work(url, rest[0], tag, int(count), Path(directory))
