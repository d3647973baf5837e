"""The read concurrent saves share: each caller is served by a read that began after it asked, the callers
that asked during one read share the next, and a failing read fails every caller it serves."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from mailq_runtime.blobs.shared_read import SharedRead


class Reads:
    """A value that only moves forward, read once per call; a call blocks until it is let go."""

    def __init__(self) -> None:
        self.made = 0
        self.started = threading.Semaphore(0)
        self.go = threading.Semaphore(0)
        self.failing: BaseException | None = None

    def __call__(self) -> int:
        self.made += 1
        made = self.made
        self.started.release()
        assert self.go.acquire(timeout=10)
        if self.failing is not None:
            raise self.failing
        return made


def waiting_for(shared: SharedRead, callers: int) -> None:
    """Until `callers` threads wait in `shared` for a read."""
    for _ in range(1000):
        with shared._lock:
            round_ = shared._gathering
        if round_ is not None and _waiters(round_.done) >= callers:
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"{callers} callers never waited")


def _waiters(event: threading.Event) -> int:
    return len(event._cond._waiters)  # type: ignore[attr-defined]


def test_callers_arriving_during_a_read_share_the_next_one_and_never_an_older_value():
    reads = Reads()
    shared = SharedRead(reads)
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(shared)
        assert reads.started.acquire(timeout=10)  # the first read is under way
        later = [pool.submit(shared) for _ in range(3)]
        # The first of them waits for the read under way to end, the two others for the read it makes.
        waiting_for(shared, 2)
        assert reads.made == 1
        reads.go.release()
        assert first.result(10) == 1
        assert reads.started.acquire(timeout=10)
        reads.go.release()
        assert [caller.result(10) for caller in later] == [2, 2, 2]
    assert reads.made == 2


def test_a_caller_alone_reads_at_once_each_time():
    reads = Reads()
    shared = SharedRead(reads)
    for expected in (1, 2, 3):
        reads.go.release()
        assert shared() == expected


def test_a_failing_read_fails_every_caller_it_serves_and_the_next_read_is_made_afresh():
    reads = Reads()
    shared = SharedRead(reads)
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(shared)
        assert reads.started.acquire(timeout=10)
        later = [pool.submit(shared) for _ in range(2)]
        waiting_for(shared, 1)
        reads.failing = OSError("store away")
        reads.go.release()
        assert reads.started.acquire(timeout=10)
        reads.go.release()
        for caller in (first, *later):
            with pytest.raises(OSError, match="store away"):
                caller.result(10)
    reads.failing = None
    reads.go.release()
    assert shared() == 3
