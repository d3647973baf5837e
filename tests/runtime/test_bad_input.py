"""Bad input gets a clear error naming what was wrong, and changes nothing: not the queue, not the
tables behind it (enqueued_mails, broker_messages, blobs ... as counted in the store)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from mailq_runtime import InvalidInput, Mail, Runtime, UnknownQueue, run_worker

from .conftest import QUEUE
from .helpers import make_mail

MAX = 1000


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
    return backend.counts(), queue.size(), [(i.enqueue_id, i.next_delivery) for i in queue.browse()]


def sized(total: int) -> Mail:
    header = b"Subject: x\r\n\r\n"
    return Mail(recipients=("r@example.com",), message=header + b"x" * (total - len(header)))


def test_a_message_of_exactly_the_maximum_size_is_accepted(limited):
    limited.enqueue(sized(MAX))
    assert limited.size() == 3


ENQUEUES = {
    "not-a-mail": (lambda q: q.enqueue("Subject: x\r\n\r\nbody"), "takes a Mail"),
    "none": (lambda q: q.enqueue(None), "takes a Mail"),
    "dict": (lambda q: q.enqueue({"recipients": ["r@example.com"], "message": b"x"}), "takes a Mail"),
    "too-big": (lambda q: q.enqueue(sized(MAX + 1)), "exceeds the maximum size of 1000"),
    "delay-soon": (lambda q: q.enqueue(make_mail(), delay="soon"), "invalid duration 'soon'"),
    "delay-nan": (lambda q: q.enqueue(make_mail(), delay=float("nan")), "invalid duration"),
    "delay-inf": (lambda q: q.enqueue(make_mail(), delay=float("inf")), "invalid duration"),
    "delay-nan-text": (lambda q: q.enqueue(make_mail(), delay="nan"), "invalid duration"),
    "delay-unit": (lambda q: q.enqueue(make_mail(), delay="5 parsecs"), "invalid duration"),
    "delay-bool": (lambda q: q.enqueue(make_mail(), delay=True), "invalid duration"),
    "delay-list": (lambda q: q.enqueue(make_mail(), delay=[5]), "invalid duration"),
    "priority-text": (lambda q: q.enqueue(make_mail(), priority="high"), "invalid priority"),
    "priority-float": (lambda q: q.enqueue(make_mail(), priority=5.5), "invalid priority"),
    "priority-bool": (lambda q: q.enqueue(make_mail(), priority=True), "invalid priority"),
    "timeout-negative": (lambda q: q.dequeue(timeout=-1), "invalid dequeue timeout"),
    "timeout-text": (lambda q: q.dequeue(timeout="1"), "invalid dequeue timeout"),
    "timeout-bool": (lambda q: q.dequeue(timeout=True), "invalid dequeue timeout"),
    "timeout-nan": (lambda q: q.dequeue(timeout=float("nan")), "invalid dequeue timeout"),
    "remove-none": (lambda q: q.remove(), "exactly one"),
    "remove-two": (lambda q: q.remove(name="resident", sender="sender@example.com"), "exactly one"),
    "remove-bad-sender": (lambda q: q.remove(sender="not an address"), "invalid mail address"),
    "remove-bad-recipient": (lambda q: q.remove(recipient="@example.com"), "invalid mail address"),
    "republish-soon": (lambda q: q.republish("soon"), "invalid duration"),
}


@pytest.mark.parametrize("case", list(ENQUEUES))
def test_a_refused_operation_changes_nothing(backend, limited, case):
    operation, message = ENQUEUES[case]
    before = state(backend, limited)
    with pytest.raises(InvalidInput, match=message):
        operation(limited)
    assert state(backend, limited) == before


@pytest.mark.parametrize("delay", ["soon", float("nan"), "1 fortnight", object()])
def test_a_retry_with_a_malformed_delay_leaves_the_item_unsettled(backend, limited, delay):
    item = limited.dequeue(timeout=5)
    before = state(backend, limited)
    leases = backend.rows("SELECT id, lease, available_at FROM broker_messages ORDER BY id")
    with pytest.raises(InvalidInput, match="invalid duration"):
        item.retry(delay=delay)
    assert state(backend, limited) == before
    assert backend.rows("SELECT id, lease, available_at FROM broker_messages ORDER BY id") == leases
    assert not item.settled
    item.retry()  # the item can still be settled properly
    assert limited.dequeue(timeout=5).enqueue_id == item.enqueue_id


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
    assert backend.counts() == before
    assert runtime.queues() == [QUEUE]
    with pytest.raises(UnknownQueue, match=f"unknown queue '{FRESH}'"):
        runtime.queue(FRESH, create=False)


@pytest.mark.parametrize("case", list(REFUSED_ENQUEUES))
def test_a_refused_enqueue_creates_no_queue(backend, limited_runtime, limited, case):
    operation, message = REFUSED_ENQUEUES[case]
    before = backend.counts()
    with pytest.raises(InvalidInput, match=message):
        operation(limited_runtime.queue(FRESH))
    assert_no_queue_created(backend, limited_runtime, before)


def test_naming_a_queue_and_using_it_before_its_first_enqueue_writes_nothing(
    backend, limited_runtime, limited
):
    before = backend.counts()
    fresh = limited_runtime.queue(FRESH)
    assert (fresh.size(), list(fresh.browse()), fresh.dequeue(timeout=0), fresh.dead_letters()) == (
        0,
        [],
        None,
        [],
    )
    assert (fresh.remove(name="x"), fresh.clear(), fresh.flush(), fresh.republish("0s")) == (0, 0, 0, 0)
    for operation in (fresh.browse_start, fresh.content_start, fresh.update_browse_start):
        with pytest.raises(UnknownQueue, match="created by its first enqueue"):
            operation()
    assert_no_queue_created(backend, limited_runtime, before)


def test_a_worker_on_an_unknown_queue_is_refused_and_writes_nothing(backend, limited_runtime, limited):
    before = backend.counts()
    with pytest.raises(UnknownQueue, match=r"unknown queue 'fresh': known queues are \['spool'\]"):
        run_worker(limited_runtime, FRESH, local_domains=["example.com"], idle_timeout=0)
    assert_no_queue_created(backend, limited_runtime, before)


@pytest.mark.parametrize(
    "query, message",
    [
        ("bogus=1", "unknown mailq URL option"),
        ("visibility_timeout=-1s", "must not be negative"),
        ("visibility_timeout=later", "invalid duration"),
        ("max_message_size=0", "max_message_size"),
        ("max_message_size=big", "max_message_size"),
        ("durability=never", "invalid durability"),
    ],
)
def test_an_invalid_runtime_url_is_refused(backend, query, message):
    with pytest.raises(InvalidInput, match=message):
        Runtime.open(f"{backend.url()}?{query}")


def test_an_unsupported_url_scheme_is_refused():
    with pytest.raises(InvalidInput, match="scheme"):
        Runtime.open("cassandra://localhost")


def test_a_clamped_delay_is_not_bad_input(limited):
    limited.enqueue(make_mail("far"), delay=timedelta.max)
    assert limited.size() == 3
