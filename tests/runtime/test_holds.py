"""Hold and release (Postfix's postsuper -h/-H) on every deployment: a held mail is not delivered until
released, stays in browse and size and counts as held; one mail or every mail matching a sender, a
recipient or a recipient domain; bad input refused with one line, changing nothing."""

from __future__ import annotations

import pytest

from mailq_runtime import InvalidInput
from mailq_runtime.queue import MailQueue

from .conftest import QUEUE
from .helpers import make_mail


def names(queue: MailQueue) -> list[str]:
    delivered = []
    while (item := queue.dequeue(timeout=0)) is not None:
        delivered.append(item.mail.name)
        item.done()
    return delivered


def held_ids(queue: MailQueue) -> list[str]:
    return [item.enqueue_id for item in queue.holds.list()]


def test_a_held_mail_waits_in_view_until_released(clocked):
    held = clocked.enqueue(make_mail("held"))
    clocked.enqueue(make_mail("free"))
    assert clocked.holds.hold(held) == 1
    assert names(clocked) == ["free"]
    assert [item.name for item in clocked.browse()] == ["held"]
    assert clocked.size() == 1
    overview = clocked.overviews.overview()
    assert (overview.held, overview.ready, overview.delayed) == (1, 0, 0)
    assert held_ids(clocked) == [held]
    assert clocked.holds.release(held) == 1
    assert held_ids(clocked) == [] and clocked.overviews.overview().held == 0
    assert names(clocked) == ["held"]
    assert clocked.size() == 0


def test_a_delayed_mail_held_is_not_delivered_when_due_nor_flushed(clocked, clock):
    held = clocked.enqueue(make_mail("later"), delay=30)
    assert clocked.holds.hold(held) == 1
    clock.advance(31)
    clocked.flush()
    assert names(clocked) == []
    assert clocked.holds.release(held) == 1
    assert names(clocked) == ["later"]


def test_a_mail_held_and_released_before_any_consumer_saw_it_is_delivered_once(clocked):
    mail = clocked.enqueue(make_mail("quick"))
    clocked.holds.hold(mail)
    clocked.holds.release(mail)
    assert names(clocked) == ["quick"]
    assert clocked.dequeue(timeout=0) is None


def test_hold_and_release_by_sender_recipient_and_domain(clocked):
    a = clocked.enqueue(make_mail("a", sender="alice@one.test", recipients=("x@Dest.test",)))
    b = clocked.enqueue(make_mail("b", sender="bob@one.test", recipients=("y@other.test", "z@dest.test")))
    c = clocked.enqueue(make_mail("c", sender=None, recipients=("x@third.test",)))
    clocked.enqueue(make_mail("d", sender="carol@one.test", recipients=("w@fourth.test",)))
    assert clocked.holds.hold(domain="DEST.test") == 2
    assert clocked.holds.hold(sender="<>") == 1
    assert clocked.holds.hold(recipient="x@third.test") == 0  # held already
    assert sorted(held_ids(clocked)) == sorted([a, b, c])
    assert names(clocked) == ["d"]
    assert clocked.holds.release(sender="alice@ONE.test") == 1
    assert clocked.holds.release(recipient="y@other.test") == 1
    assert names(clocked) == ["a", "b"]
    assert clocked.holds.release(domain="third.test") == 1
    assert names(clocked) == ["c"]


def test_a_hold_by_another_process_is_honoured_once_it_returns(backend, queue):
    """The consumer looked a moment ago and found nothing held; a hold placed meanwhile by another
    process (the CLI's `mailq hold`) still keeps its mail from every delivery that starts after it."""
    other = backend.open().queue(QUEUE)
    queue.enqueue(make_mail("first"))
    held = queue.enqueue(make_mail("held"))
    free = queue.dequeue(timeout=5)
    assert free is not None and free.mail.name == "first"  # its look found no held row
    free.done()
    assert other.holds.hold(held) == 1
    assert queue.dequeue(timeout=1) is None
    assert held_ids(queue) == [held]


def test_a_held_mail_removed_leaves_no_hold(clocked):
    held = clocked.enqueue(make_mail("gone"))
    clocked.holds.hold(held)
    assert names(clocked) == []
    assert clocked.remove(name="gone") == 1
    assert held_ids(clocked) == [] and clocked.overviews.overview().held == 0


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda q, known: q.holds.hold("0" * 32), "holds no mail"),
        (lambda q, known: q.holds.hold("not-an-id"), "invalid enqueue id"),
        (lambda q, known: q.holds.hold(known), "is held already"),
        (lambda q, known: q.holds.hold(domain="bad..domain"), "invalid domain"),
        (lambda q, known: q.holds.hold(sender="no at sign"), "invalid mail address"),
        (lambda q, known: q.holds.hold(), "exactly one of"),
        (lambda q, known: q.holds.hold(sender="a@b.test", domain="b.test"), "exactly one of"),
        (lambda q, known: q.holds.hold(known, domain="b.test"), "not both"),
        (lambda q, known: q.holds.release("0" * 32), "holds no mail"),
        (lambda q, known: q.holds.release(domain="-x.test"), "invalid domain"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(clocked, call, message):
    known = clocked.enqueue(make_mail("known"))
    free = clocked.enqueue(make_mail("free"))
    clocked.holds.hold(known)
    with pytest.raises(InvalidInput, match=message) as refused:
        call(clocked, known)
    assert "\n" not in str(refused.value)
    assert held_ids(clocked) == [known]
    with pytest.raises(InvalidInput, match="is not held"):
        clocked.holds.release(free)
    assert names(clocked) == ["free"]
