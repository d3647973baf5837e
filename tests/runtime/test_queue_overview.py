"""What a queue holds, at a glance (`queue.overviews.overview`): ready, in-flight, delayed and dead-lettered
mails and the oldest of each, exact against known traffic on every deployment, read without a browse."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from mailq_runtime.clock import to_datetime
from mailq_runtime.queue import QueueOverview

from .conftest import QUEUE, WITH_EMBEDDED_BROKER
from .helpers import make_mail

DEPLOYMENTS = WITH_EMBEDDED_BROKER
# A RabbitMQ consumer gives back what it prefetched after a second nobody asked it for a mail; until
# then RabbitMQ counts those messages as unacknowledged.
_SETTLE_SECONDS = 20.0


@pytest.fixture
def traffic(backend, clock):
    """A runtime on the fake clock whose leases outlast the test (1 s slices)."""
    runtime = backend.open(
        clock,
        slice_window="1s",
        clock_skew_grace="0s",
        update_browse_start_pace=10**9,
        visibility_timeout="1d",
    )
    return runtime.queue(QUEUE)


def settled(queue, expected: QueueOverview) -> QueueOverview:
    """The overview once it equals `expected`, or the last one read after the settling time."""
    deadline = time.monotonic() + _SETTLE_SECONDS
    while True:
        found = queue.overviews.overview()
        if found == expected or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def at(micros: int):
    return to_datetime(micros)


def test_every_state_is_counted_with_its_oldest(backend, traffic, clock):
    t0 = clock()
    held = traffic.enqueue(make_mail("held"))
    dead = traffic.enqueue(make_mail("dead"))
    t1 = clock.advance(1)
    traffic.enqueue(make_mail("ready"))
    t2 = clock.advance(1)
    traffic.enqueue(make_mail("soon"), delay="10m")
    t3 = clock.advance(1)
    traffic.enqueue(make_mail("later"), delay="1h")
    t4 = clock.advance(1)
    item = traffic.dequeue(timeout=0)
    assert item.enqueue_id == held
    poison = traffic.dequeue(timeout=0)
    assert poison.enqueue_id == dead
    poison.reject("550 no such user")

    knows = backend.broker_knows_leases
    expected = QueueOverview(
        queue=QUEUE,
        size=4,
        ready=1,
        in_flight=1,
        delayed=2,
        dead_letters=1,
        held=0,
        oldest_ready=at(t1) if knows else None,
        oldest_in_flight=at(t0) if knows else None,
        oldest_delayed=at(t2),
        next_due=at(t2 + 600_000_000),
        oldest_dead_letter=at(t4),
        unknown=() if knows else ("oldest_ready", "oldest_in_flight"),
    )
    assert settled(traffic, expected) == expected

    # The first delay falls due: until a publisher hands it over, it is ready all the same.
    clock.advance(600)
    expected = replace(expected, ready=2, delayed=1, oldest_delayed=at(t3), next_due=at(t3 + 3_600_000_000))
    assert settled(traffic, expected) == expected
    assert traffic.publisher.publish_due() == 1
    assert settled(traffic, expected) == expected

    # Delivered: nothing in flight, and the oldest of the ready mails is known on every broker.
    item.done()
    expected = replace(expected, size=3, in_flight=0, oldest_in_flight=None, oldest_ready=at(t1), unknown=())
    assert settled(traffic, expected) == expected


def test_an_empty_queue_and_one_holding_only_delays(traffic, clock):
    traffic.enqueue(make_mail("later"), delay="1h")  # never published: the broker has no queue yet
    enqueued = clock()
    expected = QueueOverview(
        queue=QUEUE,
        size=1,
        ready=0,
        in_flight=0,
        delayed=1,
        dead_letters=0,
        held=0,
        oldest_ready=None,
        oldest_in_flight=None,
        oldest_delayed=at(enqueued),
        next_due=at(enqueued + 3_600_000_000),
        oldest_dead_letter=None,
    )
    assert settled(traffic, expected) == expected
    assert traffic.flush() == 1
    expected = replace(
        expected, ready=1, delayed=0, oldest_delayed=None, next_due=None, oldest_ready=at(enqueued)
    )
    assert settled(traffic, expected) == expected
    with traffic.dequeue(timeout=5):
        pass
    expected = replace(expected, size=0, ready=0, oldest_ready=None)
    assert settled(traffic, expected) == expected


def test_dead_letter_reasons_without_their_messages(traffic, clock):
    for reason in ("550 no such user", "550 no such user", "552 mailbox full"):
        traffic.enqueue(make_mail())
        traffic.dequeue(timeout=5).reject(reason)
        clock.advance(60)
    died = [when for _, when in traffic.dead_letters.reasons()]
    assert sorted(reason for reason, _ in traffic.dead_letters.reasons()) == [
        "550 no such user",
        "550 no such user",
        "552 mailbox full",
    ]
    assert sorted(died) == [at(clock() - seconds * 1_000_000) for seconds in (180, 120, 60)]
    assert traffic.overviews.overview().dead_letters == 3
    assert traffic.overviews.overview().oldest_dead_letter == at(clock() - 180_000_000)
