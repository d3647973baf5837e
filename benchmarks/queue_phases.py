"""The phases the queue benchmarks share (queue_throughput.py, and queue_processes.py in the processes it
spawns): benchmark mails, operations run on threads with their latencies, enqueue and dequeue + done()
phases of a runtime's queue, and its warm-up.

Not a benchmark itself; imported by the scripts of this directory.
"""

from __future__ import annotations

import base64
import os
import threading
import time
from collections.abc import Callable

from mailq_runtime import Mail, Runtime

WARM_UP_MAILS = 4


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


def run_threads(threads: int, mails: int, operation: Callable[[int], None]) -> tuple[list[float], float]:
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


def enqueue_phase(
    runtime: Runtime, name: str, mails: int, size: int, threads: int
) -> tuple[list[float], float]:
    queue = runtime.queue(name)
    # Built before the clock starts: the generator is not what is measured.
    prepared = [bench_mail(size) for _ in range(mails)]
    return run_threads(threads, mails, lambda i: queue.enqueue(prepared[i]))


def dequeue_phase(runtime: Runtime, name: str, mails: int, threads: int) -> tuple[list[float], float]:
    queue = runtime.queue(name)

    def take(_: int) -> None:
        item = queue.dequeue(timeout=5)
        if item is None:
            raise AssertionError("the queue ran dry before every enqueued mail was dequeued")
        item.done()

    return run_threads(threads, mails, take)


def warm_up(runtime: Runtime, name: str, size: int) -> None:
    """Connections opened, statements prepared, the queue's consumer started and the first generation
    made: a few mails through queue `name`."""
    queue = runtime.queue(name)
    for _ in range(WARM_UP_MAILS):
        queue.enqueue(bench_mail(size))
    for _ in range(WARM_UP_MAILS):
        item = queue.dequeue(timeout=5)
        assert item is not None
        item.done()
