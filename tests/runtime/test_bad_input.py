"""Bad input gets a clear error naming what was wrong, and changes nothing: not the queue, not the
tables behind it (enqueued_mails, broker_messages, blobs ... as counted in the store).

The rules at the edges, one for the API, the command line and every deployment: numbers that overflow,
infinities and NaN are refused wherever a duration or a count is read; a delay is never negative nor ends
after the year 9999; a priority is an integer 0..9; a long value is echoed cut short; a message the worker
would dead-letter as malformed is refused at enqueue; a URL never carries a password."""

from __future__ import annotations

import os
import re
from datetime import datetime, timedelta

import pytest

from mailq_runtime import InvalidInput, Mail, Runtime, UnknownQueue, run_worker
from mailq_runtime.errors import ECHO_LIMIT
from mailq_runtime.mailbox import parse_flags
from mailq_runtime.settings import redact

from .conftest import QUEUE
from .helpers import make_mail

MAX = 1000
HUGE = "1" * 310  # past a float's range, in any unit
LONG = "x" * 10_000
BEYOND_THE_CALENDAR = "7990y"  # a valid duration, but from now it ends after 9999-12-31


@pytest.fixture
def limited_runtime(backend) -> Runtime:
    return backend.open(max_message_size=MAX)


@pytest.fixture
def limited(limited_runtime):
    """A queue accepting messages up to 1000 bytes, holding one mail and one in-flight mail already."""
    queue = limited_runtime.queue(QUEUE)
    queue.enqueue(make_mail("resident"))
    queue.enqueue(make_mail("in-flight"))
    return queue


def state(backend, queue) -> tuple:
    return backend.state(), queue.size(), [(i.enqueue_id, i.next_delivery) for i in queue.browse()]


def sized(total: int) -> Mail:
    header = b"Subject: x\r\n\r\n"
    return Mail(recipients=("r@example.com",), message=header + b"x" * (total - len(header)))


def raw(message: bytes) -> Mail:
    return Mail(recipients=("r@example.com",), message=message)


def test_a_message_of_exactly_the_maximum_size_is_accepted(limited):
    limited.enqueue(sized(MAX))
    assert limited.size() == 3


ENQUEUES = {
    "not-a-mail": (lambda q: q.enqueue("Subject: x\r\n\r\nbody"), "takes a Mail"),
    "none": (lambda q: q.enqueue(None), "takes a Mail"),
    "dict": (lambda q: q.enqueue({"recipients": ["r@example.com"], "message": b"x"}), "takes a Mail"),
    "too-big": (lambda q: q.enqueue(sized(MAX + 1)), "exceeds the maximum size of 1000"),
    "delay-soon": (lambda q: q.enqueue(make_mail(), delay="soon"), "invalid delay 'soon'"),
    "delay-nan": (lambda q: q.enqueue(make_mail(), delay=float("nan")), "must be finite"),
    "delay-inf": (lambda q: q.enqueue(make_mail(), delay=float("inf")), "must be finite"),
    "delay-minus-inf": (lambda q: q.enqueue(make_mail(), delay=float("-inf")), "must be finite"),
    "delay-nan-text": (lambda q: q.enqueue(make_mail(), delay="nan"), "invalid delay"),
    "delay-inf-text": (lambda q: q.enqueue(make_mail(), delay="inf"), "invalid delay"),
    "delay-exponent": (lambda q: q.enqueue(make_mail(), delay="1e308"), "invalid delay"),
    "delay-unit": (lambda q: q.enqueue(make_mail(), delay="5 parsecs"), "invalid delay"),
    "delay-bool": (lambda q: q.enqueue(make_mail(), delay=True), "invalid delay"),
    "delay-list": (lambda q: q.enqueue(make_mail(), delay=[5]), "invalid delay"),
    "delay-huge-text": (lambda q: q.enqueue(make_mail(), delay=HUGE), "longer than 8000 years"),
    "delay-huge-years": (lambda q: q.enqueue(make_mail(), delay=HUGE + "y"), "longer than 8000 years"),
    "delay-huge-float": (lambda q: q.enqueue(make_mail(), delay=1e308), "longer than 8000 years"),
    "delay-huge-int": (lambda q: q.enqueue(make_mail(), delay=10**400), "longer than 8000 years"),
    "delay-timedelta-max": (lambda q: q.enqueue(make_mail(), delay=timedelta.max), "longer than 8000"),
    "delay-beyond-calendar": (
        lambda q: q.enqueue(make_mail(), delay=BEYOND_THE_CALENDAR),
        "would be due after 9999-12-31",
    ),
    "delay-negative": (lambda q: q.enqueue(make_mail(), delay=-5), "invalid delay -5: must not be negative"),
    "delay-negative-fraction": (lambda q: q.enqueue(make_mail(), delay=-0.5), "must not be negative"),
    "delay-negative-text": (lambda q: q.enqueue(make_mail(), delay="-1h"), "must not be negative"),
    "delay-negative-timedelta": (
        lambda q: q.enqueue(make_mail(), delay=timedelta(-1)),
        "must not be negative",
    ),
    "priority-text": (lambda q: q.enqueue(make_mail(), priority="high"), "invalid priority"),
    "priority-digits": (lambda q: q.enqueue(make_mail(), priority="7"), "invalid priority"),
    "priority-float": (lambda q: q.enqueue(make_mail(), priority=5.5), "invalid priority"),
    "priority-bool": (lambda q: q.enqueue(make_mail(), priority=True), "invalid priority"),
    "priority-negative": (
        lambda q: q.enqueue(make_mail(), priority=-1),
        "invalid priority -1: expected an integer 0..9",
    ),
    "priority-ten": (
        lambda q: q.enqueue(make_mail(), priority=10),
        "invalid priority 10: expected an integer 0..9",
    ),
    "priority-huge": (lambda q: q.enqueue(make_mail(), priority=10**400), "invalid priority"),
    "message-no-header": (
        lambda q: q.enqueue(raw(b"just a body\r\n")),
        "malformed message: no header section",
    ),
    "message-not-a-field": (
        lambda q: q.enqueue(raw(b"not a header line\r\n\r\nbody\r\n")),
        "malformed message: no header section",
    ),
    "message-blank-first": (lambda q: q.enqueue(raw(b"\r\nSubject: x\r\n\r\nbody\r\n")), "malformed message"),
    "message-mbox-from": (
        lambda q: q.enqueue(raw(b"From alice@example.com Thu Jan  1 00:00:00 2024\nSubject: x\n\nbody\n")),
        "an mbox 'From ' separator line",
    ),
    "timeout-negative": (lambda q: q.dequeue(timeout=-1), "invalid dequeue timeout -1: must not be negative"),
    "timeout-text": (lambda q: q.dequeue(timeout="soon"), "invalid dequeue timeout"),
    "timeout-bool": (lambda q: q.dequeue(timeout=True), "invalid dequeue timeout"),
    "timeout-nan": (lambda q: q.dequeue(timeout=float("nan")), "invalid dequeue timeout"),
    "timeout-inf": (lambda q: q.dequeue(timeout=float("inf")), "invalid dequeue timeout"),
    "timeout-huge": (lambda q: q.dequeue(timeout=1e308), "invalid dequeue timeout 1e\\+308: longer than"),
    "timeout-huge-text": (lambda q: q.dequeue(timeout=HUGE), "invalid dequeue timeout"),
    "remove-none": (lambda q: q.remove(), "exactly one"),
    "remove-two": (lambda q: q.remove(name="resident", sender="sender@example.com"), "exactly one"),
    "remove-bad-sender": (lambda q: q.remove(sender="not an address"), "invalid mail address"),
    "remove-bad-recipient": (lambda q: q.remove(recipient="@example.com"), "invalid mail address"),
    "republish-soon": (lambda q: q.republish("soon"), "invalid older_than 'soon'"),
    "republish-huge": (lambda q: q.republish(HUGE), "invalid older_than"),
    "republish-huge-float": (lambda q: q.republish(1e308), "invalid older_than"),
    "republish-timedelta-max": (lambda q: q.republish(timedelta.max), "invalid older_than"),
    "republish-nan": (lambda q: q.republish(float("nan")), "invalid older_than"),
    "republish-negative": (lambda q: q.republish("-1h"), "must not be negative"),
}


@pytest.mark.parametrize("case", list(ENQUEUES))
def test_a_refused_operation_changes_nothing(backend, limited, case):
    operation, message = ENQUEUES[case]
    before = state(backend, limited)
    with pytest.raises(InvalidInput, match=message):
        operation(limited)
    assert state(backend, limited) == before


@pytest.mark.parametrize(
    "delay",
    [
        "soon",
        float("nan"),
        float("inf"),
        "1 fortnight",
        object(),
        1e308,
        HUGE,
        timedelta.max,
        BEYOND_THE_CALENDAR,
        -5,
        "-1h",
        timedelta(-1),
    ],
)
def test_a_retry_with_a_malformed_delay_leaves_the_item_unsettled(backend, limited, delay):
    item = limited.dequeue(timeout=5)
    before = state(backend, limited)
    leases = backend.leases()
    with pytest.raises(InvalidInput, match="invalid delay"):
        item.retry(delay=delay)
    assert state(backend, limited) == before
    assert backend.leases() == leases
    assert not item.settled
    item.retry()  # the item can still be settled properly: it is delivered again
    # Among the queue's two mails, in either order: on RabbitMQ the in-flight mail, given back by a consumer
    # left idle during the checks above, may come back first.
    again = {limited.dequeue(timeout=5).enqueue_id for _ in range(2)}
    assert item.enqueue_id in again and len(again) == 2


MAILS = {
    "bad-recipient": (
        lambda: make_mail(recipients=("not-an-address",)),
        "invalid mail address 'not-an-address'",
    ),
    "bad-recipient-domain": (lambda: make_mail(recipients=("a@b..c",)), "invalid mail address"),
    "display-name": (lambda: make_mail(recipients=("Bob <bob@example.com>",)), "invalid mail address"),
    "bad-sender": (lambda: make_mail(sender="sender@"), "invalid mail address 'sender@'"),
    "no-recipients": (lambda: make_mail(recipients=()), "at least one recipient"),
    "recipients-string": (lambda: make_mail(recipients="r@example.com"), "at least one recipient"),
    "message-text": (lambda: Mail(recipients=("r@example.com",), message="Subject: x"), "raw RFC 5322 bytes"),
    "message-empty": (lambda: Mail(recipients=("r@example.com",), message=b""), "empty"),
    "name-empty": (lambda: make_mail(name=""), "invalid mail name"),
    "name-control": (lambda: make_mail(name="a\nb"), "invalid mail name"),
    "attributes": (lambda: make_mail(attributes={"k": object()}), "JSON-serialisable"),
    "attributes-nan": (lambda: make_mail(attributes={"k": float("nan")}), "JSON-serialisable"),
    "header-recipient": (
        lambda: make_mail(per_recipient_headers=(("nobody", "X-A", "v"),)),
        "invalid mail address 'nobody'",
    ),
    "header-name": (
        lambda: make_mail(per_recipient_headers=(("r@example.com", "X A", "v"),)),
        "invalid header name",
    ),
    "header-value": (
        lambda: make_mail(per_recipient_headers=(("r@example.com", "X-A", "v\r\nBcc: x"),)),
        "no line breaks",
    ),
    "naive-last-updated": (lambda: make_mail(last_updated=datetime(2024, 1, 1)), "timezone"),
}


@pytest.mark.parametrize("case", list(MAILS))
def test_an_invalid_mail_cannot_be_built(backend, limited, case):
    build, message = MAILS[case]
    before = state(backend, limited)
    with pytest.raises(InvalidInput, match=message):
        limited.enqueue(build())
    assert state(backend, limited) == before


FRESH = "fresh"
# Every refused enqueue: the operations above that enqueue, and a mail that cannot be built.
REFUSED_ENQUEUES = {
    **{case: ENQUEUES[case] for case in ENQUEUES if not case.startswith(("timeout", "remove", "republish"))},
    **{
        f"mail-{case}": (lambda queue, build=build: queue.enqueue(build()), message)
        for case, (build, message) in MAILS.items()
    },
}


def assert_no_queue_created(backend, runtime: Runtime, before: dict[str, int]) -> None:
    assert backend.state() == before
    assert runtime.queues() == [QUEUE]
    with pytest.raises(UnknownQueue, match=f"unknown queue '{FRESH}'"):
        runtime.queue(FRESH, create=False)


@pytest.mark.parametrize("case", list(REFUSED_ENQUEUES))
def test_a_refused_enqueue_creates_no_queue(backend, limited_runtime, limited, case):
    operation, message = REFUSED_ENQUEUES[case]
    before = backend.state()
    with pytest.raises(InvalidInput, match=message):
        operation(limited_runtime.queue(FRESH))
    assert_no_queue_created(backend, limited_runtime, before)


def test_naming_a_queue_and_using_it_before_its_first_enqueue_writes_nothing(
    backend, limited_runtime, limited
):
    before = backend.state()
    fresh = limited_runtime.queue(FRESH)
    assert (fresh.size(), list(fresh.browse()), fresh.dequeue(timeout=0), fresh.dead_letters.list()) == (
        0,
        [],
        None,
        [],
    )
    assert (fresh.remove(name="x"), fresh.clear(), fresh.flush(), fresh.republish("0s")) == (0, 0, 0, 0)
    for operation in (
        fresh.maintenance.browse_start,
        fresh.maintenance.content_start,
        fresh.maintenance.update_browse_start,
    ):
        with pytest.raises(UnknownQueue, match="created by its first enqueue"):
            operation()
    assert_no_queue_created(backend, limited_runtime, before)


def test_a_worker_on_an_unknown_queue_is_refused_and_writes_nothing(backend, limited_runtime, limited):
    before = backend.state()
    with pytest.raises(UnknownQueue, match=r"unknown queue 'fresh': known queues are \['spool'\]"):
        run_worker(limited_runtime, FRESH, local_domains=["example.com"], idle_timeout=0)
    assert_no_queue_created(backend, limited_runtime, before)


@pytest.mark.parametrize(
    "query, message",
    [
        ("bogus=1", "unknown mailq URL option"),
        ("visibility_timeout=-1s", "must not be negative"),
        ("visibility_timeout=later", "invalid visibility_timeout 'later'"),
        (f"visibility_timeout={HUGE}", "invalid visibility_timeout .* longer than 8000 years"),
        ("visibility_timeout=nan", "invalid visibility_timeout"),
        ("visibility_timeout=inf", "invalid visibility_timeout"),
        ("clock_skew_grace=1e308", "invalid clock_skew_grace"),
        (f"clock_skew_grace={HUGE}s", "invalid clock_skew_grace"),
        ("max_message_size=0", "max_message_size"),
        ("max_message_size=big", "max_message_size"),
        (f"max_message_size={HUGE}", "invalid max_message_size"),
        ("max_message_size=1e308", "invalid max_message_size"),
        (f"max_message_size={2**63}", "invalid max_message_size"),
        (f"slice_window={HUGE}", "invalid slice_window"),
        ("slice_window=nan", "invalid slice_window"),
        ("slice_window=-1h", "invalid slice_window"),
        (f"bucket_count={HUGE}", "invalid bucket_count"),
        ("bucket_count=inf", "invalid bucket_count"),
        (f"update_browse_start_pace={HUGE}", "invalid update_browse_start_pace"),
        ("durability=never", "invalid durability"),
    ],
)
def test_an_invalid_runtime_url_is_refused(backend, query, message):
    with pytest.raises(InvalidInput, match=message):
        Runtime.open(backend.url(**dict([query.split("=", 1)])))


def test_an_unsupported_url_scheme_is_refused():
    with pytest.raises(InvalidInput, match="unsupported mailq URL scheme 'redis'"):
        Runtime.open("redis://localhost")


def test_a_delay_of_centuries_is_kept(limited):
    limited.enqueue(make_mail("far"), delay="1000y")
    far = next(item for item in limited.browse() if item.name == "far")
    assert far.next_delivery.year - far.enqueued_time.year == 1000


# Secrets ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "redis://admin:secret@host/0",
        "cassandra://admin:secret@host/keyspace",
        "embedded://admin:secret@/tmp/mailq-test-x",
        "embedded://admin:secret@data",
        "embedded://:secret@data",
        "embedded://admin:secret@data?durability=fsync",
        "embedded://admin:p@ss:secret@data",
    ],
)
def test_a_url_with_a_password_is_refused_redacted_and_creates_nothing(url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the relative data dirs would land here
    with pytest.raises(InvalidInput) as refused:
        Runtime.open(url, create=True)
    message = str(refused.value)
    assert "secret" not in message
    assert "carries a password" in message and "environment" in message
    assert redact(url) in message and ":***@" in message
    assert os.listdir(tmp_path) == []
    assert not os.path.exists("/tmp/mailq-test-x")


@pytest.mark.parametrize(
    "url", ["embedded://admin@data", "embedded://@data", "embedded://admin@/tmp/mailq-test-y"]
)
def test_the_embedded_url_takes_no_user_and_creates_nothing(url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidInput, match="takes no user name"):
        Runtime.open(url, create=True)
    assert os.listdir(tmp_path) == []
    assert not os.path.exists("/tmp/mailq-test-y")


def test_a_password_in_mailq_url_is_refused_without_showing_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MAILQ_URL", "redis://admin:secret@host/0")
    with pytest.raises(InvalidInput, match="carries a password") as refused:
        Runtime.open()
    assert "secret" not in str(refused.value)


@pytest.mark.parametrize(
    "url, shown",
    [
        ("redis://admin:secret@host/0", "redis://admin:***@host/0"),
        ("redis://admin:p@ss@host:6379/0", "redis://admin:***@host:6379/0"),
        ("redis://:secret@host", "redis://:***@host"),
        ("redis://admin@host/0", "redis://admin@host/0"),
        ("redis://host/0?password=secret&x=1", "redis://host/0?password=***&x=***"),
        ("embedded:///data?durability=fsync&token=secret", "embedded:///data?durability=fsync&token=***"),
        ("embedded://[::1/x", "embedded://[::1/x"),
        ("embedded://.mailq", "embedded://.mailq"),
    ],
)
def test_redact_hides_passwords_and_the_options_mailq_does_not_know(url, shown):
    assert redact(url) == shown


def test_a_malformed_url_is_bad_input():
    with pytest.raises(InvalidInput, match="invalid mailq URL 'embedded://\\[::1/x'"):
        Runtime.open("embedded://[::1/x")


# Long values are echoed cut short -----------------------------------------------------------------------


def _with_option(runtime: Runtime, name: str, value: str) -> str:
    """The runtime's own URL with one more option."""
    url = runtime.settings.to_url()
    return f"{url}{'&' if '?' in url else '?'}{name}={value}"


LONG_VALUES = {
    "queue-name": lambda runtime: runtime.queue(LONG),
    "sender": lambda runtime: make_mail(sender=LONG + "@example.com"),
    "recipient": lambda runtime: make_mail(recipients=(LONG,)),
    "mail-name": lambda runtime: make_mail(name=LONG),
    "remove-sender": lambda runtime: runtime.queue(QUEUE).remove(sender=LONG),
    "delay": lambda runtime: runtime.queue(QUEUE).enqueue(make_mail(), delay=LONG),
    "priority": lambda runtime: runtime.queue(QUEUE).enqueue(make_mail(), priority=LONG),
    "first-line": lambda runtime: runtime.queue(QUEUE).enqueue(raw(LONG.encode())),
    "blob-id": lambda runtime: runtime.blobs.read(LONG),
    "blob-owner": lambda runtime: runtime.blobs.save(LONG, b"x"),
    "mailbox-name": lambda runtime: runtime.mailboxes.get("user@example.com", LONG),
    "flag": lambda runtime: parse_flags([LONG]),
    "url-option": lambda runtime: Runtime.open(_with_option(runtime, "durability", LONG)),
    "url-option-name": lambda runtime: Runtime.open(_with_option(runtime, LONG, "1")),
    "url-scheme": lambda runtime: Runtime.open(f"{LONG}://host"),
}


@pytest.mark.parametrize("case", list(LONG_VALUES))
def test_a_long_value_is_echoed_cut_short(backend, case):
    runtime = backend.open()
    runtime.queue(QUEUE)
    before = backend.state()
    with pytest.raises(InvalidInput) as refused:
        LONG_VALUES[case](runtime)
    message = str(refused.value)
    assert "x" * ECHO_LIMIT in message and "x" * (ECHO_LIMIT + 1) not in message, message
    assert re.search(r"'\.\.\. \(100[0-9][0-9] (characters|bytes)\)", message), message
    assert len(message) < 400
    assert backend.state() == before
