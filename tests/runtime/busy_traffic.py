"""Traffic that never lets a queue idle, and its checks: producers enqueueing and consumers delivering
into a mailbox the whole time; paused, every count is compared with a browse. The busy tests share it: on
the harness's single node with lost replies (test_busy_counts.py) and on the three-node cluster with a node
killed (tests/cassandra/test_cluster_faults.py)."""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Callable

import pytest

from mailq_runtime import Runtime
from mailq_runtime.errors import BACKEND_FAILURES
from mailq_runtime.queue import MailQueue, dequeuer
from mailq_runtime.stores.cassandra import slice_counts

from .helpers import make_mail

DOMAIN = "example.org"
PRODUCERS, CONSUMERS = 2, 2
# The counts' bound, shortened as their settling allows: epochs of 1 s, settled 6 s after their end, a
# recount every 3 s (10 s where the defaults make 70 s).
EPOCH, SETTLE, RECOUNT_INTERVAL = 1.0, 6.0, 3.0
BOUND = EPOCH + SETTLE + RECOUNT_INTERVAL


def shorten_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtimes this process opens settle their counts within BOUND."""
    monkeypatch.setattr(slice_counts, "EPOCH", EPOCH)
    monkeypatch.setattr(slice_counts, "SETTLE", SETTLE)
    monkeypatch.setattr(dequeuer, "RECOUNT_INTERVAL", RECOUNT_INTERVAL)


class Traffic:
    """Producers enqueueing and consumers delivering into a mailbox, the whole time, until `stop`; on
    `pause`, once the calls under way have ended, producers enqueue nothing and consumers hold what they
    took, unsettled."""

    def __init__(self, runtime: Runtime, queue: MailQueue) -> None:
        self.runtime, self.queue = runtime, queue
        self.mailbox = runtime.mailboxes.get_or_create(f"user@{DOMAIN}", "INBOX")
        self.paused, self.stopped = threading.Event(), threading.Event()
        self.enqueued = self.delivered = 0
        self._lock = threading.Lock()
        self._under_way = 0  # calls started before a pause and not ended yet
        self.threads = [threading.Thread(target=self._produce, args=(n,)) for n in range(PRODUCERS)]
        self.threads += [threading.Thread(target=self._consume) for _ in range(CONSUMERS)]
        for thread in self.threads:
            thread.start()

    def _call(self, call: Callable[[], None]) -> bool:
        """Run `call` unless paused (then False, at once); a backend's failure ends it too."""
        with self._lock:
            if self.paused.is_set():
                return False
            self._under_way += 1
        try:
            call()
        except BACKEND_FAILURES:
            pass  # not accepted, or not settled: its producer keeps it, or it is delivered again
        finally:
            with self._lock:
                self._under_way -= 1
        return True

    def _produce(self, producer: int) -> None:
        n = 0
        while not self.stopped.is_set():
            mail = make_mail(f"p{producer}-{n}", recipients=(f"user@{DOMAIN}",))
            if not self._call(functools.partial(self._enqueue, mail)):
                time.sleep(0.05)
                continue
            n += 1
            time.sleep(0.02)

    def _enqueue(self, mail) -> None:
        self.queue.enqueue(mail)
        self.enqueued += 1

    def _consume(self) -> None:
        taken: list = []
        while not self.stopped.is_set():
            if not self._call(lambda: taken.append(self.queue.dequeue(timeout=0.2))):
                time.sleep(0.05)
                continue
            item = taken.pop() if taken else None
            # Held, unsettled, while paused.
            while (
                item is not None
                and not self.stopped.is_set()
                and not self._call(functools.partial(self._deliver, item))
            ):
                time.sleep(0.05)

    def _deliver(self, item) -> None:
        self.runtime.mailboxes.append(self.mailbox, item.mail.message)
        item.done()
        self.delivered += 1

    def _pause(self) -> None:
        with self._lock:
            self.paused.set()
        deadline = time.monotonic() + 60
        while self._under_way and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not self._under_way, "calls still under way a minute after the pause"

    def check(self) -> tuple[int, int, str]:
        """Pause, compare every count with a browse, resume: the mails enqueued and delivered so far,
        and what was compared, for the report."""
        self._pause()
        try:
            browsed = [item.name for item in self.queue.browse()]
            overview = self.queue.overviews.overview()
            by_domain = {
                shape.domain: sum(map(shape.total, shape.buckets))
                for shape in self.queue.overviews.by_domain()
            }
            report = (
                f"browse {len(browsed)}, size {self.queue.size()}, overview {overview.size}, "
                f"by domain {by_domain}, enqueued {self.enqueued}, delivered {self.delivered}"
            )
            assert self.queue.size() == len(browsed), report
            assert overview.size == len(browsed), report
            assert by_domain.get(DOMAIN, 0) == len(browsed), report
            boxes = self.runtime.mailboxes
            assert boxes.counters(self.mailbox) == boxes.recount(self.mailbox), report
            return self.enqueued, self.delivered, report
        finally:
            self.paused.clear()

    def checked_through(self, fault: Callable[[], None]) -> None:
        """Exact at once before `fault`, then once the bound has passed after it, and again a recount
        later, with mails enqueued and delivered between every two checks (their reports printed)."""
        time.sleep(4)
        reports = [self.check()]
        fault()
        time.sleep(BOUND + 2)
        reports.append(self.check())
        time.sleep(RECOUNT_INTERVAL + 1)
        reports.append(self.check())
        print(reports)
        for (enqueued, delivered, _), (later_enqueued, later_delivered, _) in itertools.pairwise(reports):
            assert later_enqueued > enqueued and later_delivered > delivered, reports

    def stop(self) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join(timeout=60)
