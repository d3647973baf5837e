"""The by-domain counts of held mails (qshape's `hold` queue) on every store: a hold moves a mail's counts
from its state to "held", a release back, and every way a held mail leaves the queue takes them from
"held", each mail counted once however many criteria name it."""

from __future__ import annotations

import threading
import time

import pytest

from mailq_runtime import InvalidInput
from mailq_runtime.queue import MailQueue

from .conftest import QUEUE, WITH_EMBEDDED_BROKER
from .helpers import make_mail

DEPLOYMENTS = WITH_EMBEDDED_BROKER


def counted(queue: MailQueue) -> dict[str, dict[str, int]]:
    """Per domain, the states counting any mail, with their totals."""
    shown = {
        d.domain: {state: d.total(state) for state in d.buckets if d.total(state)}
        for d in queue.overviews.by_domain()
    }
    return {domain: states for domain, states in shown.items() if states}


def test_a_hold_counts_the_mail_as_held_and_its_release_as_before(clocked):
    now = clocked.enqueue(make_mail("now", recipients=("x@a.test", "y@B.test")))
    later = clocked.enqueue(make_mail("later", recipients=("z@b.test",)), delay=600)
    assert clocked.holds.hold(now) == 1
    assert counted(clocked) == {"a.test": {"held": 1}, "b.test": {"held": 1, "deferred": 1}}
    assert clocked.holds.hold(later) == 1
    assert counted(clocked) == {"a.test": {"held": 1}, "b.test": {"held": 2}}
    shape = {d.domain: d for d in clocked.overviews.by_domain()}["b.test"]
    assert shape.buckets["held"][0] == 2  # both younger than 5 minutes
    assert clocked.holds.release(now) == 1
    assert counted(clocked) == {"a.test": {"queued": 1}, "b.test": {"queued": 1, "held": 1}}
    assert clocked.holds.release(domain="b.test") == 1
    assert counted(clocked) == {"a.test": {"queued": 1}, "b.test": {"queued": 1, "deferred": 1}}


def test_a_mail_named_by_several_holds_counts_once(clocked):
    mail = clocked.enqueue(make_mail("one", sender="alice@one.test", recipients=("x@a.test", "y@a.test")))
    assert clocked.holds.hold(domain="a.test") == 1
    assert clocked.holds.hold(sender="alice@one.test") == 0
    assert clocked.holds.hold(recipient="y@a.test") == 0
    with pytest.raises(InvalidInput, match="held already"):
        clocked.holds.hold(mail)
    assert counted(clocked) == {"a.test": {"held": 1}}
    assert clocked.holds.release(recipient="x@a.test") == 1
    assert clocked.holds.release(domain="a.test") == 0
    assert counted(clocked) == {"a.test": {"queued": 1}}


def test_a_held_mail_removed_leaves_no_count(clocked):
    parked = clocked.enqueue(make_mail("parked", recipients=("x@a.test",)))
    waiting = clocked.enqueue(make_mail("waiting", recipients=("y@a.test",)), delay=600)
    clocked.holds.hold(domain="a.test")
    assert clocked.dequeue(timeout=0) is None  # the consumer parks the first one
    assert counted(clocked) == {"a.test": {"held": 2}}
    assert clocked.remove(name="parked") == 1
    assert clocked.remove(name="waiting") == 1
    assert counted(clocked) == {}
    assert clocked.holds.list() == [] and clocked.overviews.overview().held == 0
    assert {parked, waiting}.isdisjoint(item.enqueue_id for item in clocked.browse())


@pytest.mark.parametrize("ending", ["done", "reject"])
def test_a_mail_held_while_its_delivery_runs_leaves_held_when_it_leaves(clocked, ending):
    clocked.enqueue(make_mail("under way", recipients=("x@a.test",)))
    item = clocked.dequeue(timeout=0)
    assert clocked.holds.hold(item.enqueue_id) == 1  # the delivery had started: it goes on
    assert counted(clocked) == {"a.test": {"held": 1}}
    if ending == "done":
        item.done()
    else:
        item.reject("550 5.1.1 no such user")
        assert [letter.enqueue_id for letter in clocked.dead_letters.list()] == [item.enqueue_id]
    assert counted(clocked) == {}
    assert clocked.holds.list() == [] and clocked.size() == 0


def test_a_mail_held_while_its_delivery_runs_stays_held_through_a_retry(clocked, clock):
    clocked.enqueue(make_mail("retried", recipients=("x@a.test", "y@b.test")))
    item = clocked.dequeue(timeout=0)
    clocked.holds.hold(item.enqueue_id)
    item.retry(delay=60, recipients=["y@b.test"])  # a.test took it
    assert counted(clocked) == {"b.test": {"held": 1}}
    clock.advance(61)
    assert clocked.dequeue(timeout=0) is None  # due, and parked
    assert clocked.holds.release(item.enqueue_id) == 1
    assert counted(clocked) == {"b.test": {"deferred": 1}}
    again = clocked.dequeue(timeout=0)
    assert again.mail.recipients == ("y@b.test",)
    again.done()
    assert counted(clocked) == {}


@pytest.mark.parametrize("leaving", ["released", "removed"])
def test_a_partly_delivered_mail_is_held_for_the_recipients_left(clocked, leaving):
    """The view row keeps every recipient; the counts follow the copy waiting for its retry."""
    mail = clocked.enqueue(make_mail("partly", recipients=("x@a.test", "y@b.test")))
    clocked.dequeue(timeout=0).retry(delay=60, recipients=["y@b.test"])  # a.test took it
    assert counted(clocked) == {"b.test": {"deferred": 1}}
    assert clocked.holds.hold(domain="b.test") == 1
    assert counted(clocked) == {"b.test": {"held": 1}}
    if leaving == "released":
        assert clocked.holds.release(mail) == 1
        assert counted(clocked) == {"b.test": {"deferred": 1}}
    else:
        assert clocked.remove(name="partly") == 1
        assert counted(clocked) == {}


def test_a_delivery_done_while_the_hold_is_placed_leaves_no_count(backend, queue):
    """The consumer looked at the holds just before another process held its mail, so its done() takes
    the mail from "queued": the hold, once every look postdates it, finds the mail gone with its held row
    still there, and gives its counts back."""
    operator = backend.open().queue(QUEUE)
    queue.enqueue(make_mail("quick", recipients=("x@a.test",)))
    item = queue.dequeue(timeout=5)  # its look finds nothing held, trusted for half a second
    holding = threading.Thread(target=operator.holds.hold, args=(item.enqueue_id,))
    holding.start()
    try:
        deadline = time.monotonic() + 10
        while counted(queue) != {"a.test": {"held": 1}}:  # then the hold sleeps out the earlier looks
            assert time.monotonic() < deadline, "the hold wrote nothing"
        item.done()
    finally:
        holding.join()
    assert counted(queue) == {}
    assert operator.holds.list() == [] and queue.size() == 0
