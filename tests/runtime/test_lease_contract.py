"""Leases: a consumer slower than its visibility timeout is told it lost the mail, and a long delivery
can extend its lease."""

from __future__ import annotations

import pytest

from mailq_runtime import InvalidInput, LeaseExpired

from .conftest import QUEUE, WITH_QUORUM_QUEUES
from .helpers import make_mail

DEPLOYMENTS = WITH_QUORUM_QUEUES

TIMEOUT = 10  # seconds: the visibility timeout of these tests' runtimes


@pytest.fixture
def leased(backend, clock):
    """A queue on the fake clock whose leases last TIMEOUT seconds."""
    return backend.open(clock, visibility_timeout=f"{TIMEOUT}s").queue(QUEUE)


def leases(backend) -> list[tuple]:
    return backend.leases()


def taken_over(leased, clock):
    """A mail dequeued by a slow consumer, then by another once the slow one's lease expired."""
    leased.enqueue(make_mail("slow"))
    slow = leased.dequeue(timeout=0)
    clock.advance(TIMEOUT)
    other = leased.dequeue(timeout=0)
    assert other is not None and other.enqueue_id == slow.enqueue_id
    assert (slow.attempts, other.attempts) == (1, 2)
    return slow, other


SETTLES = {
    "done": lambda item: item.done(),
    "retry": lambda item: item.retry(),
    "reject": lambda item: item.reject("550 user unknown"),
}


def assert_gone(backend, leased, enqueue_id) -> None:
    """Settled for good: not in the queue nor the broker, its content released, no dead letter."""
    assert leased.size() == 0
    assert leased.dequeue(timeout=0) is None
    assert backend.broker_messages() == 0
    assert leased.dead_letters.list() == []
    assert backend.open().blobs.references_of(enqueue_id) == []


@pytest.mark.parametrize(("action", "done"), [("retry", "retried"), ("reject", "rejected")])
def test_a_slow_consumers_retry_or_reject_raises_and_changes_nothing(backend, leased, clock, action, done):
    slow, other = taken_over(leased, clock)
    before, held = backend.state(), leases(backend)
    with pytest.raises(LeaseExpired, match=f"mail {slow.enqueue_id} was not {done}, nothing changed"):
        SETTLES[action](slow)
    assert backend.state() == before
    assert leases(backend) == held
    assert slow.settled
    with pytest.raises(InvalidInput, match="already acknowledged"):
        SETTLES[action](slow)
    other.done()  # the mail is the other consumer's, and it settles it
    assert_gone(backend, leased, other.enqueue_id)


def test_a_slow_consumers_done_raises_but_records_the_delivery(backend, leased, clock):
    slow, _ = taken_over(leased, clock)
    with pytest.raises(LeaseExpired, match=f"mail {slow.enqueue_id} is recorded as delivered") as raised:
        slow.done()
    assert "another consumer took the mail, which may deliver it again (at-least-once)" in str(raised.value)
    assert slow.settled
    with pytest.raises(InvalidInput, match="already acknowledged"):
        slow.done()
    # Marked deleted and its content released, but still held by the broker under the other lease.
    assert leased.size() == 0
    assert [item.enqueue_id for item in leased.browse()] == []
    assert backend.open().blobs.references_of(slow.enqueue_id) == []
    assert backend.broker_messages() == 1


@pytest.mark.parametrize("action", list(SETTLES))
def test_after_a_lost_done_the_other_copy_settles_and_is_not_delivered_a_third_time(
    backend, leased, clock, action
):
    slow, other = taken_over(leased, clock)
    with pytest.raises(LeaseExpired):
        slow.done()
    SETTLES[action](other)  # its lease holds: no error
    clock.advance(2 * TIMEOUT)
    # Delivered by the slow consumer: gone, and a reject leaves no dead letter without content.
    assert_gone(backend, leased, slow.enqueue_id)


def test_a_lost_done_stops_a_consumer_that_has_not_loaded_the_mail_yet(backend, leased, clock):
    slow, other = taken_over(leased, clock)
    clock.advance(TIMEOUT)  # the other consumer is slow too: a third one may take the mail
    with pytest.raises(LeaseExpired):
        slow.done()
    assert leased.dequeue(timeout=0) is None  # the broker's delivery is skipped: the mail is done
    with pytest.raises(LeaseExpired):
        other.done()
    assert_gone(backend, leased, slow.enqueue_id)


def test_a_lease_past_its_timeout_that_nobody_took_still_settles(backend, leased, clock):
    leased.enqueue(make_mail("late"))
    item = leased.dequeue(timeout=0)
    clock.advance(3 * TIMEOUT)
    item.done()
    assert_gone(backend, leased, item.enqueue_id)


def test_the_context_manager_lets_lease_expired_through_from_done(leased, clock):
    slow, _ = taken_over(leased, clock)
    with pytest.raises(LeaseExpired, match="recorded as delivered"):
        with slow:
            pass


def test_the_context_manager_lets_lease_expired_through_from_retry(leased, clock):
    slow, _ = taken_over(leased, clock)
    with pytest.raises(LeaseExpired, match="was not retried") as raised:
        with slow:
            raise RuntimeError("delivery failed")
    assert isinstance(raised.value.__context__, RuntimeError)  # the delivery's error stays attached


def test_extend_lease_keeps_the_mail_past_the_original_timeout(backend, leased, clock):
    leased.enqueue(make_mail("long"))
    item = leased.dequeue(timeout=0)
    clock.advance(TIMEOUT - 2)
    item.extend_lease()  # the visibility timeout again, from now
    clock.advance(TIMEOUT - 1)
    assert leased.dequeue(timeout=0) is None
    item.extend_lease(60)
    clock.advance(59)
    assert leased.dequeue(timeout=0) is None
    item.done()
    assert_gone(backend, leased, item.enqueue_id)


def test_an_extended_lease_still_expires(backend, leased, clock):
    leased.enqueue(make_mail("long"))
    item = leased.dequeue(timeout=0)
    item.extend_lease(2.5)  # shorter than the visibility timeout: the lease ends 2.5 s from now
    clock.advance(2.5)
    other = leased.dequeue(timeout=0)
    assert other.enqueue_id == item.enqueue_id


def test_extend_lease_after_another_consumer_took_the_mail_raises_and_changes_nothing(backend, leased, clock):
    slow, other = taken_over(leased, clock)
    before, held = backend.state(), leases(backend)
    with pytest.raises(LeaseExpired, match=f"the lease on mail {slow.enqueue_id} was lost"):
        slow.extend_lease()
    assert (backend.state(), leases(backend)) == (before, held)
    assert not slow.settled  # settling it still says what became of the mail
    with pytest.raises(LeaseExpired):
        slow.retry()
    other.done()
    assert_gone(backend, leased, other.enqueue_id)


@pytest.mark.parametrize(
    "seconds", [0, "0s", -1, float("nan"), float("inf"), True, "soon", 1j, 1e300, 10**400]
)
def test_a_malformed_lease_extension_is_refused_and_changes_nothing(backend, leased, seconds):
    leased.enqueue(make_mail("held"))
    item = leased.dequeue(timeout=0)
    held = leases(backend)
    with pytest.raises(InvalidInput, match="invalid lease extension"):
        item.extend_lease(seconds)
    assert leases(backend) == held
    item.done()


@pytest.mark.parametrize("seconds", ["1000y", 8000 * 365 * 86400])
def test_a_lease_of_centuries_is_kept_within_the_latest_time(backend, leased, clock, seconds):
    leased.enqueue(make_mail("held"))
    item = leased.dequeue(timeout=0)
    item.extend_lease(seconds)
    clock.advance(100 * 365 * 86400)
    assert leased.dequeue(timeout=0) is None
    item.done()


def test_a_settled_item_has_no_lease_to_extend(leased):
    leased.enqueue(make_mail("held"))
    item = leased.dequeue(timeout=0)
    item.done()
    with pytest.raises(InvalidInput, match="already acknowledged: it holds no lease"):
        item.extend_lease()
