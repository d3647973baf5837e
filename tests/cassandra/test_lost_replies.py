"""Counts whose replies are lost: each request reaches the node and is applied, and its answer comes
after the driver's timeout (a forwarder holds the node's replies back, tests/forwarder.py), so the store
sends it again. A count written as an addition (a Cassandra counter) counted such a mail twice; a share
written whole (stores/cassandra/tallies.py) is applied once however often it is sent, so with inserts,
done()s, destination counts and mailbox counts under way meanwhile, every count equals what the rows
hold once the calls return, with no recount."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from mailq_runtime.stores.cassandra import (
    CassandraDestinations,
    CassandraMailboxTables,
    CassandraOptions,
    CassandraQueueView,
    CassandraStore,
)
from mailq_runtime.stores.records import CounterValues, DestinationCount
from mailq_servers.cassandra import CassandraServer
from tests.forwarder import Forwarder

from .test_queue_view import T0, mail

TIMEOUT = 1.0  # the driver's request timeout, seconds
HELD = 1.5  # how long the replies are held back: past one try's timeout, within the store's retries
SLOT = T0


@pytest.fixture
def cable(cassandra_server: CassandraServer) -> Iterator[Forwarder]:
    with Forwarder(cassandra_server.host, cassandra_server.port) as forwarder:
        yield forwarder


@pytest.fixture
def wired(cassandra, cassandra_server: CassandraServer, cable: Forwarder) -> Iterator[CassandraStore]:
    """A store on the session's keyspace (emptied), reaching the node through `cable`."""
    store = CassandraStore(
        CassandraOptions(
            [cable.target[0]],
            cassandra.keyspace,
            port=cable.port,
            local_datacenter=cassandra_server.datacenter,
            request_timeout=TIMEOUT,
        )
    )
    yield store
    store.close()


def _during_held_replies(cable: Forwarder, calls: list[Callable[[], None]]) -> float:
    """Run each call in its own thread while the replies are held; the seconds the slowest took. Each
    must succeed."""
    failures: list[BaseException] = []

    def run(call: Callable[[], None]) -> None:
        try:
            call()
        except BaseException as error:  # reported by the test, not lost in the thread
            failures.append(error)

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    started = time.monotonic()
    with cable.replies_held():
        for thread in threads:
            thread.start()
        time.sleep(HELD)
    for thread in threads:
        thread.join(timeout=30)
    assert not failures, failures
    return time.monotonic() - started


def test_slice_and_destination_counts_sent_again_after_a_lost_reply_count_once(wired, cable):
    view, destinations = CassandraQueueView(wired), CassandraDestinations(wired)
    view.create_queue("spool", T0, T0)
    first = [mail("spool", T0, n % 2, n, T0 + n) for n in range(6)]
    later = [mail("spool", T0, n % 2, n, T0 + n) for n in range(6, 12)]
    for m in first:
        view.insert(m)
    destinations.count("spool", [DestinationCount("example.org", "queued", SLOT, len(first))])
    gone = DestinationCount("example.org", "queued", SLOT, -1)

    def enqueue(m) -> Callable[[], None]:
        def call() -> None:
            view.insert(m)
            destinations.count("spool", [DestinationCount("example.org", "queued", SLOT, 1)])

        return call

    def done(m) -> Callable[[], None]:
        return lambda: view.mark_done("spool", m.enqueue_id, T0, m.bucket, lambda: None, [gone])

    took = _during_held_replies(cable, [enqueue(m) for m in later] + [done(m) for m in first[:4]])
    assert took > TIMEOUT  # each call waited a reply out, and was sent again
    live = view.live_mails("spool", T0)
    assert len(live) == 8
    assert view.size("spool", T0) == 8
    assert destinations.counts("spool") == [DestinationCount("example.org", "queued", SLOT, 8)]


def test_mailbox_counts_sent_again_after_a_lost_reply_count_once(wired, cable):
    tables = CassandraMailboxTables(wired)
    assert tables.create_mailbox("box-1", "user@example.org", "INBOX")
    adds = [lambda: tables.add_to_counters("box-1", 1, 1) for _ in range(5)]
    adds += [lambda: tables.add_to_counters("box-1", 0, -1) for _ in range(2)]
    took = _during_held_replies(cable, adds)
    assert took > TIMEOUT
    assert tables.counters("box-1") == CounterValues(5, 3)
