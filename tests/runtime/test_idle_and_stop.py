"""Waiting costs nothing, and stopping loses nothing: an idle consumer does not spin a core, and a worker
told to stop with SIGTERM finishes or gives back what it holds."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

from mailq_runtime import Runtime
from mailq_runtime.mailbox import INBOX

from .conftest import QUEUE
from .helpers import make_mail

MAILS = 1000


def test_a_blocked_dequeue_does_not_burn_a_core(queue) -> None:
    results = []
    cpu_before, wall_before = time.process_time(), time.monotonic()
    waiter = threading.Thread(target=lambda: results.append(queue.dequeue(timeout=2.0)))
    waiter.start()
    waiter.join(timeout=10)
    cpu, wall = time.process_time() - cpu_before, time.monotonic() - wall_before

    assert results == [None] and wall >= 2.0
    # A spinning consumer would use about one CPU second per second; a bounded poll uses a few ms.
    assert cpu < 0.25, f"{cpu:.3f} s of CPU for {wall:.1f} s of waiting"


def test_sigterm_stops_a_worker_without_losing_or_stranding_mail(backend) -> None:
    runtime = backend.open()
    for n in range(7):  # the worker's local users
        runtime.mailboxes.create(f"user{n}@example.org", INBOX)
    queue = runtime.queue(QUEUE)
    for n in range(MAILS):
        queue.enqueue(make_mail(f"mail-{n}", recipients=(f"user{n % 7}@example.org",)))
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mailq_cli",
            "--url",
            backend.url(),
            "worker",
            "--queue",
            QUEUE,
            "--domain",
            "example.org",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while queue.size() > MAILS - 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        worker.send_signal(signal.SIGTERM)
        # Read while it finishes: its delivery lines on stderr must not fill the pipe and block it.
        out, err = (stream.decode() for stream in worker.communicate(timeout=30))
    finally:
        worker.kill()

    assert worker.returncode == 0, err
    with Runtime.open(backend.url()) as fresh:
        delivered = sum(fresh.mailboxes.counters(m.id).count for m in fresh.mailboxes.list())
        left = fresh.queue(QUEUE).size()
        assert 20 <= delivered < MAILS, out
        assert delivered + left == MAILS  # every mail is in a mailbox or still queued, none twice
        # Nothing stays leased to the stopped worker: the rest is deliverable at once.
        item = fresh.queue(QUEUE).dequeue(timeout=0)
        assert item is not None
        item.retry()
