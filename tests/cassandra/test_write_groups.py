"""write_groups.py: concurrent callers share a request, each waits for the one carrying its write, and a
failed request fails each of its callers."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from mailq_runtime.errors import StoreUnavailable
from mailq_runtime.stores.cassandra.write_groups import WriteGroup


class SlowWrites:
    """A request that takes a while, so callers pile up behind it."""

    def __init__(self) -> None:
        self.requests: list[list[int]] = []
        self.written: set[int] = set()
        self.lock = threading.Lock()

    def __call__(self, items) -> None:
        time.sleep(0.02)
        with self.lock:
            self.requests.append(list(items))
            self.written.update(items)


def test_concurrent_writes_share_requests_and_each_returns_once_its_own_is_written() -> None:
    writes = SlowWrites()
    group = WriteGroup(writes, max_items=4)

    def write(item: int) -> bool:
        group.write(item)
        with writes.lock:
            return item in writes.written

    with ThreadPoolExecutor(8) as pool:
        returned_written = list(pool.map(write, range(200)))
    assert all(returned_written)
    assert sorted(item for request in writes.requests for item in request) == list(range(200))
    assert max(len(request) for request in writes.requests) == 4
    assert len(writes.requests) < 100  # shared: 8 callers, at most 4 a request


def test_a_lone_caller_writes_at_once() -> None:
    writes = SlowWrites()
    group = WriteGroup(writes)
    group.write(1)
    group.write(2)
    assert writes.requests == [[1], [2]]


def test_a_failed_request_fails_each_of_its_callers_and_the_next_request_goes_on() -> None:
    failing = {3, 4}
    written: list[int] = []
    entered = threading.Event()
    release = threading.Event()

    def write(items) -> None:
        if 0 in items:
            entered.set()
            release.wait(5)  # the others queue behind this request meanwhile
        if failing & set(items):
            raise StoreUnavailable("Cassandra at test failed INSERT on deleted_mails: timeout") from OSError()
        written.extend(items)

    group = WriteGroup(write)
    outcomes: dict[int, BaseException | None] = {}

    def call(item: int) -> None:
        try:
            group.write(item)
            outcomes[item] = None
        except StoreUnavailable as error:
            outcomes[item] = error

    first = threading.Thread(target=call, args=(0,))
    first.start()
    assert entered.wait(5)
    others = [threading.Thread(target=call, args=(item,)) for item in (1, 2, 3, 4)]
    for thread in others:
        thread.start()
    time.sleep(0.1)
    release.set()
    for thread in [first, *others]:
        thread.join(5)
    # 1-4 waited for the same second request, which carried 3 and 4 and failed: each raises its copy.
    assert outcomes[0] is None
    assert all(isinstance(outcomes[item], StoreUnavailable) for item in (1, 2, 3, 4))
    assert "timeout" in str(outcomes[1]) and outcomes[1] is not outcomes[2]
    # Each chained as the store chained the failure: to the driver's error.
    assert isinstance(outcomes[1].__cause__, OSError) and outcomes[1].__cause__ is outcomes[4].__cause__
    assert written == [0]
    group.write(5)  # the group is not left busy
    assert written == [0, 5]


def test_a_failure_of_a_lone_caller_is_raised_as_the_store_raised_it() -> None:
    def write(items) -> None:
        raise StoreUnavailable("Cassandra at test failed: no host")

    with pytest.raises(StoreUnavailable, match="no host"):
        WriteGroup(write).write(1)
