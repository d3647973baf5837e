"""The queue by destination domain (qshape) on every deployment: counts per domain and state in doubling
age buckets, kept as mail is enqueued, retried and settled, with the last failure and the next attempt."""

from __future__ import annotations

from datetime import timedelta

from mailq_runtime.clock import MICROS_PER_SECOND, to_datetime
from mailq_runtime.queue import MailQueue
from mailq_runtime.stores.records import DestinationNote

from .helpers import make_mail

MINUTE = 60


def shape(queue: MailQueue) -> dict[str, dict[str, tuple[int, ...]]]:
    return {d.domain: {s: c for s, c in d.buckets.items() if any(c)} for d in queue.overviews.by_domain()}


def test_counts_by_domain_and_age_as_mail_moves(clocked, clock):
    clocked.enqueue(make_mail("a", recipients=("x@A.test", "y@a.test")))
    clocked.enqueue(make_mail("ab", recipients=("x@a.test", "z@b.test")))
    assert shape(clocked) == {
        "a.test": {"queued": (2, 0, 0, 0, 0, 0, 0)},
        "b.test": {"queued": (1, 0, 0, 0, 0, 0, 0)},
    }
    clock.advance(30 * MINUTE)
    clocked.enqueue(make_mail("later", recipients=("w@b.test",)), delay=600)
    assert shape(clocked) == {
        "a.test": {"queued": (0, 0, 0, 2, 0, 0, 0)},
        "b.test": {"queued": (0, 0, 0, 1, 0, 0, 0), "deferred": (1, 0, 0, 0, 0, 0, 0)},
    }
    first = clocked.dequeue(timeout=0)
    assert first.mail.name == "a"
    first.done()
    second = clocked.dequeue(timeout=0)
    second.retry(delay=300, recipients=["z@b.test"])  # a.test took it
    assert shape(clocked) == {"b.test": {"deferred": (1, 0, 0, 1, 0, 0, 0)}}  # a.test: none left
    clock.advance(200 * MINUTE)
    assert shape(clocked)["b.test"] == {"deferred": (0, 0, 0, 0, 0, 0, 2)}
    clocked.dequeue(timeout=0).reject("550 no such user")
    assert clocked.remove(name="later") == 1
    assert shape(clocked) == {}


def test_the_last_failure_and_next_attempt_per_domain(clocked, clock):
    now = clock()
    clocked.overviews.note_destination(
        DestinationNote("b.test", "451 try later", now, now + 300 * MICROS_PER_SECOND)
    )
    clocked.enqueue(make_mail("b", recipients=("z@b.test",)))
    (domain,) = clocked.overviews.by_domain()
    assert (domain.domain, domain.total("queued"), domain.last_error) == ("b.test", 1, "451 try later")
    assert domain.last_error_at == to_datetime(now)
    assert domain.next_attempt == to_datetime(now) + timedelta(minutes=5)
    clocked.overviews.note_destination(DestinationNote("b.test", "550 gone", now + 1, None))
    (domain,) = clocked.overviews.by_domain()
    assert (domain.last_error, domain.next_attempt) == ("550 gone", None)
