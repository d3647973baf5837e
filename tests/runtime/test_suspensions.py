"""Suspend, resume and retry a destination domain now (postqueue -s) on every deployment, with bad input
refused in one line and nothing changed. (Remote delivery deferring a suspended domain: tests/relay.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from mailq_runtime import InvalidInput
from mailq_runtime.clock import to_datetime

from .helpers import make_mail


def test_suspend_until_a_time_or_for_a_while_then_resume(clocked, clock):
    end = to_datetime(clock()) + timedelta(hours=2)
    assert clocked.suspensions.suspend("Dest.test", end) == end
    assert clocked.suspensions.suspend("other.test", "30m") == to_datetime(clock()) + timedelta(minutes=30)
    assert clocked.suspensions.suspended() == {
        "dest.test": end,
        "other.test": to_datetime(clock()) + timedelta(minutes=30),
    }
    (shape,) = [d for d in clocked.overviews.by_domain() if d.domain == "dest.test"]
    assert shape.suspended_until == end
    clock.advance(31 * 60)
    assert list(clocked.suspensions.suspended()) == ["dest.test"]  # the other one ended
    assert clocked.suspensions.resume("dest.test") == 0
    assert clocked.suspensions.suspended() == {}


def test_retry_and_resume_make_the_domain_s_delayed_mails_due_now(clocked, clock):
    clocked.enqueue(make_mail("dest", recipients=("a@dest.test",)), delay=3600)
    clocked.enqueue(make_mail("both", recipients=("b@other.test", "c@DEST.test")), delay=3600)
    clocked.enqueue(make_mail("other", recipients=("d@other.test",)), delay=3600)
    assert clocked.suspensions.retry("dest.test") == 2
    names = set()
    while (item := clocked.dequeue(timeout=0)) is not None:
        names.add(item.mail.name)
        item.retry(delay=600)
    assert names == {"dest", "both"}
    assert {item.name: item.next_delivery for item in clocked.browse()}["other"] > to_datetime(clock())
    clocked.suspensions.suspend("dest.test", "1h")
    assert clocked.suspensions.resume("dest.test") == 2
    assert {clocked.dequeue(timeout=0).mail.name for _ in range(2)} == {"dest", "both"}


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda q, now: q.suspensions.suspend("dest.test", now - timedelta(seconds=1)), "is in the past"),
        (lambda q, now: q.suspensions.suspend("dest.test", now), "is in the past"),
        (
            lambda q, now: q.suspensions.suspend("dest.test", now.replace(tzinfo=None) + timedelta(1)),
            "time zone",
        ),
        (lambda q, now: q.suspensions.suspend("dest.test", "0s"), "longer than zero"),
        (lambda q, now: q.suspensions.suspend("dest.test", "-5m"), "invalid"),
        (lambda q, now: q.suspensions.suspend("bad..test", "1h"), "invalid domain"),
        (lambda q, now: q.suspensions.resume("other.test"), "is not suspended"),
        (lambda q, now: q.suspensions.resume("no domain"), "invalid domain"),
        (lambda q, now: q.suspensions.retry("@x"), "invalid domain"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(clocked, clock, call, message):
    clocked.enqueue(make_mail("kept", recipients=("a@dest.test",)), delay=60)
    until = clocked.suspensions.suspend("dest.test", "1h")
    with pytest.raises(InvalidInput, match=message) as refused:
        call(clocked, to_datetime(clock()).astimezone(UTC))
    assert "\n" not in str(refused.value)
    assert clocked.suspensions.suspended() == {"dest.test": until}
    assert clocked.dequeue(timeout=0) is None


def test_a_time_in_another_zone_is_the_same_instant(clocked, clock):
    later = datetime.fromtimestamp(clock() / 1e6 + 3600, UTC).astimezone()
    assert clocked.suspensions.suspend("dest.test", later) == later


def test_bounce_a_domain_now_and_for_a_window(clocked, clock):
    clocked.enqueue(make_mail("dest", recipients=("a@dest.test",)), delay=3600)
    assert clocked.suspensions.bounce("Dest.test", "  the domain  is gone ") == 1  # its delayed mail, due now
    (bounce,) = clocked.suspensions.bounced().values()
    assert (bounce.domain, bounce.reason, bounce.until) == ("dest.test", "the domain is gone", clock())
    clocked.suspensions.bounce("dest.test", "still gone", "2h")
    assert clocked.suspensions.bounced()["dest.test"].until == clock() + 2 * 3600 * 10**6


@pytest.mark.parametrize(
    ("domain", "reason", "window", "message"),
    [
        ("dest.test", "", None, "invalid bounce reason"),
        ("dest.test", "two\r\nlines", None, "invalid bounce reason"),
        ("dest.test", "gone", "-1h", "invalid"),
        ("dest..test", "gone", None, "invalid domain"),
    ],
)
def test_a_bad_bounce_is_refused_and_changes_nothing(clocked, domain, reason, window, message):
    clocked.enqueue(make_mail("kept", recipients=("a@dest.test",)), delay=60)
    with pytest.raises(InvalidInput, match=message):
        clocked.suspensions.bounce(domain, reason, window)
    assert clocked.suspensions.bounced() == {}
    assert clocked.dequeue(timeout=0) is None
