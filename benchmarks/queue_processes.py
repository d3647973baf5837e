"""Two mailq processes on one queue against one: the rates of enqueue, then of dequeue + done(), when the
work is shared by two processes of `--threads` callers each, for queue_throughput.py.

Two processes are spawned, open the deployment and warm up; then in each turn of TURNS the working
processes (one, or both) enqueue the turn's mails on a queue of the turn's own, half each when both work,
and then dequeue + done() until all of them are done, whichever process takes which. A process's clocks
are CLOCK_MONOTONIC, the machine's, so the turn's rate is its mails over the time from the first
process's start to the last process's end. The one-process turns come first and last, so that whatever
else loads the machine meanwhile weighs on both alike.

Not a benchmark itself; imported by queue_throughput.py.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from typing import Any

from queue_phases import enqueue_phase, run_threads, warm_up

from mailq_runtime import Runtime
from mailq_runtime.settings import Settings

# The processes working in each turn.
TURNS = (1, 2, 2, 1)
PROCESSES = max(TURNS)
# Bounds every wait on the other processes, so that a failed one ends the run instead of hanging it.
BARRIER_WAIT = 600
# How long a dequeue waits before looking whether the other process finished the turn's last mails.
POLL = 0.1


def queue_names(prefix: str) -> list[str]:
    """The queues the measure uses: one per turn, one per process for its warm-up."""
    return [f"{prefix}processes-{turn}" for turn in range(len(TURNS))] + [
        f"{prefix}processes-warm-up-{index}" for index in range(PROCESSES)
    ]


def measure(
    settings: Settings, prefix: str, mails: int, size: int, threads: int
) -> dict[int, tuple[float, float]]:
    """Enqueue and dequeue + done() rates (mails/s) by number of processes, over the turns of each."""
    context = multiprocessing.get_context("spawn")  # the drivers' threads do not survive a fork
    barrier = context.Barrier(PROCESSES + 1)
    done = context.Value("i", 0)
    results = context.Queue()
    workers = [
        context.Process(
            target=serve_turns, args=(settings, prefix, index, mails, size, threads, barrier, done, results)
        )
        for index in range(PROCESSES)
    ]
    for worker in workers:
        worker.start()
    try:
        barrier.wait(BARRIER_WAIT)  # all open and warmed up
        for _ in TURNS:
            with done.get_lock():
                done.value = 0
            for _step in ("enqueue", "dequeue", "end"):
                barrier.wait(BARRIER_WAIT)
    except threading.BrokenBarrierError:
        pass
    finally:
        for worker in workers:
            worker.join(BARRIER_WAIT)
    reports = [results.get() for _ in range(results.qsize())]
    errors = [report[2] for report in reports if report[0] == "error"]
    if errors or len(reports) != sum(TURNS):
        raise AssertionError(f"a mailq process failed: {'; '.join(errors) or 'no report'}")
    walls: dict[int, list[float]] = {working: [0.0, 0.0] for working in TURNS}
    for turn, working in enumerate(TURNS):
        mine = [report for report in reports if report[0] == turn]
        walls[working][0] += max(r[3] for r in mine) - min(r[2] for r in mine)
        walls[working][1] += max(r[5] for r in mine) - min(r[4] for r in mine)
    return {
        working: (TURNS.count(working) * mails / enqueue, TURNS.count(working) * mails / dequeue)
        for working, (enqueue, dequeue) in walls.items()
    }


def serve_turns(
    settings: Settings,
    prefix: str,
    index: int,
    mails: int,
    size: int,
    threads: int,
    barrier: Any,
    done: Any,
    results: Any,
) -> None:
    """One process's part of every turn; reports (turn, index, enqueue start, end, dequeue start, end)."""
    try:
        with Runtime(settings) as runtime:
            warm_up(runtime, f"{prefix}processes-warm-up-{index}", size)
            barrier.wait(BARRIER_WAIT)
            for turn, working in enumerate(TURNS):
                name = f"{prefix}processes-{turn}"
                queue = runtime.queue(name)
                share = mails * (index + 1) // working - mails * index // working if index < working else 0
                barrier.wait(BARRIER_WAIT)
                # The mails are made before the clock starts: the start is the end less the timed part.
                _, wall = enqueue_phase(runtime, name, share, size, threads)
                enqueued = time.monotonic()
                enqueue_started = enqueued - wall
                barrier.wait(BARRIER_WAIT)
                dequeue_started = time.monotonic()
                last = drain(queue, mails, threads, done) if share else 0.0
                barrier.wait(BARRIER_WAIT)
                if share:
                    results.put((turn, index, enqueue_started, enqueued, dequeue_started, last))
                    if index == 0 and queue.size() != 0:
                        raise AssertionError(f"{queue.size()} mails left after dequeuing all of them")
    except BaseException as error:
        results.put(("error", index, f"process {index}: {error!r}"))
        barrier.abort()


def drain(queue: Any, mails: int, threads: int, done: Any) -> float:
    """Dequeue + done() from `threads` threads until the processes together have done `mails`; the time
    of this process's last done()."""
    last = [0.0]
    lock = threading.Lock()

    def work(_: int) -> None:
        while done.value < mails:
            item = queue.dequeue(timeout=POLL)
            if item is None:
                continue
            item.done()
            with done.get_lock():
                done.value += 1
            with lock:
                last[0] = time.monotonic()

    run_threads(threads, threads, work)
    return last[0]
