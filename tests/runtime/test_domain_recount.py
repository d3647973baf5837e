"""The counts by destination domain through faults: a count a crash or a race left off where no live
mail of its domain and slot is, is zeroed by the queue's recount (the operator's, or a consumer's
on its own), while the counts of live mails and of the last two slots are left as they are."""

from __future__ import annotations

import pytest

from mailq_runtime.queue import MailQueue, destinations
from mailq_runtime.queue.destinations import slot_of
from mailq_runtime.stores.records import DestinationCount

from .conftest import QUEUE
from .helpers import FakeClock, make_mail

# The subject is the store of the counts, not the broker.
DEPLOYMENTS = ("embedded", "cassandra")


@pytest.fixture(autouse=True)
def short_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(destinations, "RECOUNT_SETTLE", 0.05)


def counts(queue: MailQueue) -> dict[tuple[str, str, int], int]:
    return {
        (c.domain, c.state, c.slot): c.mails for c in queue.backends.destinations.counts(QUEUE) if c.mails
    }


def test_the_recount_zeroes_a_count_where_no_mail_is_and_keeps_the_live_mails(
    clocked: MailQueue, clock: FakeClock
):
    first_slot = slot_of(clock())
    gone = clocked.enqueue(make_mail("gone", recipients=("y@b.test",)))
    clocked.enqueue(make_mail("live", recipients=("x@a.test",)))
    item = clocked.dequeue(timeout=0)
    assert item is not None and item.enqueue_id == gone
    # What a crash between the deletion mark and its count leaves: the delivered mail still counted.
    store = clocked.backends.destinations
    store.count(QUEUE, [DestinationCount("b.test", "queued", first_slot, 1)])
    item.done()
    # And counts no mail accounts for: a domain with no mail, one below zero, and one of a live mail's.
    store.count(
        QUEUE,
        [
            DestinationCount("c.test", "deferred", first_slot, 2),
            DestinationCount("d.test", "held", first_slot, -1),
            DestinationCount("a.test", "held", first_slot, 1),
        ],
    )
    clock.advance(11 * 60)
    recent = slot_of(clock())
    store.count(QUEUE, [DestinationCount("e.test", "queued", recent, 1)])
    wrong = counts(clocked)
    assert clocked.overviews.recount() == 4
    assert counts(clocked) == {
        ("a.test", "queued", first_slot): 1,
        ("a.test", "held", first_slot): 1,  # a live mail's domain and slot: left as it is
        ("e.test", "queued", recent): 1,  # the last two slots: an enqueue may be under way there
    }
    assert wrong.keys() - counts(clocked).keys() == {
        ("b.test", "queued", first_slot),
        ("c.test", "deferred", first_slot),
        ("d.test", "held", first_slot),
    }
    assert clocked.overviews.recount() == 0


def test_an_idle_consumer_zeroes_the_counts_of_an_empty_queue_by_itself(
    clocked: MailQueue, clock: FakeClock, settling: float
):
    first_slot = slot_of(clock())
    clocked.enqueue(make_mail("one", recipients=("x@a.test",)))
    item = clocked.dequeue(timeout=0)
    assert item is not None
    item.done()
    clocked.backends.destinations.count(QUEUE, [DestinationCount("a.test", "queued", first_slot, 1)])
    clock.advance(11 * 60)
    assert {d.domain: d.total("queued") for d in clocked.overviews.by_domain()} == {"a.test": 1}
    assert clocked.size() == 0
    assert clocked.dequeue(timeout=0) is None
    assert counts(clocked) == {}
    assert all(not d.total("queued") for d in clocked.overviews.by_domain())
