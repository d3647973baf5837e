"""A consumer process for the tests of several consumers on one queue:

    consumer_agent.py <url> <queue> <log> <pause seconds> <idle-exit seconds>

It dequeues, appends "start <name>" to <log>, spends <pause> on the mail, settles it with done(), then
appends "done <name>" ("lost <name>" when its lease was lost meanwhile), until no mail came for
<idle-exit> seconds. Each line is one append, so a SIGKILL leaves whole lines: a mail started and not
done was in flight at the kill.
"""

from __future__ import annotations

import os
import sys
import time

from mailq_runtime import LeaseExpired, Runtime


def main(url: str, queue_name: str, log: str, pause: float, idle_exit: float) -> None:
    out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def note(what: str, name: str) -> None:
        os.write(out, f"{what} {name}\n".encode())

    with Runtime.open(url) as runtime:
        queue = runtime.queue(queue_name, create=False)
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < idle_exit:
            item = queue.dequeue(timeout=0.3)
            if item is None:
                continue
            note("start", item.mail.name)
            time.sleep(pause)
            try:
                item.done()
            except LeaseExpired:
                note("lost", item.mail.name)
            else:
                note("done", item.mail.name)
            idle_since = time.monotonic()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5]))
