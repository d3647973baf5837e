"""James's DelayedMailQueueContract, DelayedManageableMailQueueContract and the priority contracts."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from mailq_runtime.clock import MICROS_PER_SECOND, to_datetime

from .conftest import WITH_QUORUM_QUEUES
from .helpers import make_mail

DEPLOYMENTS = WITH_QUORUM_QUEUES


def names(queue) -> list[str]:
    return [item.name for item in queue.browse()]


def drain(queue) -> list[str]:
    received = []
    for _ in range(100):
        item = queue.dequeue(timeout=0)
        if item is None:
            return received
        received.append(item.mail.name)
        item.done()
    raise AssertionError("the queue never ran dry")


def test_a_delay_is_honoured(clocked, clock):
    clocked.enqueue(make_mail("later"), delay=timedelta(seconds=5))
    assert clocked.dequeue(timeout=0.5) is None
    (item,) = clocked.browse()
    assert item.next_delivery - item.enqueued_time == timedelta(seconds=5)
    clock.advance(4.999999)
    assert clocked.dequeue(timeout=0) is None
    clock.advance(0.000001)
    assert clocked.dequeue(timeout=0).mail.name == "later"


def test_a_delayed_mail_is_eventually_dequeued_no_sooner_than_its_delay(queue):
    started = time.monotonic()
    queue.enqueue(make_mail("soon"), delay=1)
    item = queue.dequeue(timeout=10)
    assert item.mail.name == "soon"
    assert time.monotonic() - started >= 0.99


# A negative delay is refused (test_bad_input.py), not taken to mean now.
@pytest.mark.parametrize("delay", [0, 0.0, "0s", timedelta(0)])
def test_a_zero_delay_means_now(clocked, delay):
    clocked.enqueue(make_mail("now"), delay=delay)
    (item,) = clocked.browse()
    assert item.next_delivery == item.enqueued_time
    assert clocked.dequeue(timeout=0).mail.name == "now"


@pytest.mark.parametrize(
    "delay, years",
    [
        (timedelta(days=3653), 10),
        ("10y", 10),
        ("291y", 291),
        (timedelta(days=365 * 291), 291),
        (291 * 31557600, 291),
    ],
)
def test_far_delays_do_not_overflow(clocked, clock, delay, years):
    clocked.enqueue(make_mail("far"), delay=delay)
    (item,) = clocked.browse()
    assert item.next_delivery.year == to_datetime(clock()).year + years
    assert clocked.dequeue(timeout=0.2) is None
    assert clocked.size() == 1
    assert clocked.flush() == 1
    assert clocked.dequeue(timeout=0).mail.name == "far"


def test_a_delay_up_to_the_end_of_the_calendar_is_kept(clocked, clock):
    # The latest due time a delay may reach is 9999-12-31 (clock.LATEST); one past it is refused
    # (test_bad_input.py) rather than clamped, as a typo is likelier than a mail for the year 10000.
    due = datetime(9999, 12, 31, tzinfo=UTC)
    clocked.enqueue(make_mail("last"), delay=due - to_datetime(clock()))
    (item,) = clocked.browse()
    assert item.next_delivery == due
    assert clocked.dequeue(timeout=0.2) is None
    clocked.flush()
    assert clocked.dequeue(timeout=0).mail.name == "last"


def test_delayed_mails_are_browsable_deletable_and_clearable(clocked):
    clocked.enqueue(make_mail("d1"), delay="1h")
    clocked.enqueue(make_mail("now"))
    clocked.enqueue(make_mail("d2", sender="other@example.com"), delay="2h")
    assert names(clocked) == ["d1", "now", "d2"]
    assert clocked.remove(name="d1") == 1
    assert names(clocked) == ["now", "d2"]
    clocked.flush()
    assert drain(clocked) == ["now", "d2"]
    clocked.enqueue(make_mail("d3"), delay="1h")
    clocked.enqueue(make_mail("now2"))
    assert clocked.clear() == 2
    clocked.flush()
    assert drain(clocked) == []


def test_deleted_delayed_mails_are_not_browsable(clocked):
    clocked.enqueue(make_mail("d", sender="bye@example.com"), delay="1h")
    clocked.remove(sender="bye@example.com")
    assert names(clocked) == []
    assert clocked.size() == 0


@pytest.mark.parametrize("first_immediate", [True, False])
def test_flush_makes_delayed_mails_deliverable(clocked, clock, first_immediate):
    if first_immediate:
        clocked.enqueue(make_mail("immediate"))
    clocked.enqueue(make_mail("delayed"), delay="1h")
    assert clocked.flush() == 1
    assert drain(clocked) == (["immediate"] if first_immediate else []) + ["delayed"]


def test_flush_preserves_browse_order_and_shows_the_new_delivery_time(clocked, clock):
    clocked.enqueue(make_mail("a"), delay="10s")
    clock.advance(0.001)
    clocked.enqueue(make_mail("b"))
    clock.advance(0.001)
    clocked.enqueue(make_mail("c"), delay="5s")
    assert names(clocked) == ["a", "b", "c"]
    clock.advance(0.001)
    clocked.flush()
    items = list(clocked.browse())
    assert [i.name for i in items] == ["a", "b", "c"]
    assert all(i.next_delivery <= to_datetime(clock()) for i in items)
    assert drain(clocked) == ["a", "b", "c"]


def test_flush_also_releases_a_retry_delay(clocked):
    clocked.enqueue(make_mail("x"))
    clocked.dequeue(timeout=0).retry(delay="1h")
    assert clocked.dequeue(timeout=0) is None
    clocked.flush()
    assert drain(clocked) == ["x"]


def test_higher_priority_is_dequeued_first(clocked):
    for name, priority in (("low", 1), ("high", 9), ("normal", 5), ("default", None), ("high2", 9)):
        clocked.enqueue(make_mail(name), priority=priority)
    assert drain(clocked) == ["high", "high2", "normal", "default", "low"]


def test_the_bounds_are_valid_priorities(clocked):
    # Out of 0..9 a priority is refused (test_bad_input.py), where James clamps it silently.
    for name, priority in (("zero", 0), ("nine", 9), ("default", None)):
        clocked.enqueue(make_mail(name), priority=priority)
    assert drain(clocked) == ["nine", "default", "zero"]


def test_delayed_high_priority_waits_for_its_delay_then_jumps_the_queue(clocked, clock):
    clocked.enqueue(make_mail("low-a"), priority=1)
    clocked.enqueue(make_mail("high-delayed"), priority=9, delay="5s")
    clocked.enqueue(make_mail("low-b"), priority=1)
    first = clocked.dequeue(timeout=0)
    assert first.mail.name == "low-a"
    first.done()
    clock.advance(5)
    assert drain(clocked) == ["high-delayed", "low-b"]


def test_priority_and_delay_survive_in_browse(clocked, clock):
    clocked.enqueue(make_mail("x"), priority=7, delay="90s")
    (item,) = clocked.browse()
    assert item.next_delivery == datetime.fromtimestamp(clock() / MICROS_PER_SECOND + 90, UTC)
