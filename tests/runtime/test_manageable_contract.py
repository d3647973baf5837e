"""James's ManageableMailQueueContract: size, browse, remove and clear; plus dead letters, the item's
context manager and republish, which James tests on its RabbitMQ queue."""

from __future__ import annotations

import random
import threading
import time

import pytest

from mailq_runtime import InvalidInput

from .conftest import QUEUE
from .helpers import make_mail


def names(queue) -> list[str]:
    return [item.name for item in queue.browse()]


def test_size_is_zero_when_empty_and_counts_enqueued_mails(queue):
    assert queue.size() == 0
    for name in "abc":
        queue.enqueue(make_mail(name))
    assert queue.size() == 3


def test_size_after_done_retry_and_unsettled_dequeue(queue):
    for name in "abc":
        queue.enqueue(make_mail(name))
    queue.dequeue(timeout=5).done()
    assert queue.size() == 2
    queue.dequeue(timeout=5).retry()
    assert queue.size() == 2
    queue.dequeue(timeout=5)  # taken, never settled
    assert queue.size() == 2


def test_browse_empty_single_and_after_dequeue(queue):
    assert names(queue) == []
    queue.enqueue(make_mail("only"))
    assert names(queue) == ["only"]
    queue.dequeue(timeout=5).done()
    assert names(queue) == []


def test_browse_returns_enqueue_order(queue):
    expected = [f"m{i}" for i in range(10)]
    for name in expected:
        queue.enqueue(make_mail(name))
    assert names(queue) == expected
    items = list(queue.browse())
    assert [i.enqueued_time for i in items] == sorted(i.enqueued_time for i in items)


def test_browse_returns_enqueue_order_within_one_microsecond(clocked):
    """The clock does not always move between two enqueues (a coarse or an injected one)."""
    expected = [f"m{i}" for i in range(20)]
    for name in expected:
        clocked.enqueue(make_mail(name))
    assert names(clocked) == expected
    assert [clocked.dequeue(timeout=0).mail.name for _ in expected] == expected


def test_browse_shows_message_attributes_and_envelope(queue):
    sent = make_mail("m", attributes={"k": [1, 2]}, recipients=("a@example.com", "b@example.com"))
    enqueue_id = queue.enqueue(sent)
    (item,) = queue.browse()
    assert (item.enqueue_id, item.name, item.sender, item.recipients) == (
        enqueue_id,
        "m",
        "sender@example.com",
        ["a@example.com", "b@example.com"],
    )
    assert item.mail == sent
    assert item.next_delivery == item.enqueued_time


def test_browsing_does_not_affect_dequeue(queue):
    for name in "abc":
        queue.enqueue(make_mail(name))
    assert [item.mail.name for item in queue.browse()] == ["a", "b", "c"]
    assert [queue.dequeue(timeout=5).mail.name for _ in range(3)] == ["a", "b", "c"]


def _operation(queue, kind: str) -> None:
    if kind == "enqueue":
        queue.enqueue(make_mail("new"))
    elif kind == "dequeue":
        queue.dequeue(timeout=1).done()
    elif kind == "clear":
        queue.clear()
    elif kind == "flush":
        queue.flush()
    else:
        queue.remove(name="m1")


@pytest.mark.parametrize("when", ["before", "during"])
@pytest.mark.parametrize("kind", ["enqueue", "dequeue", "clear", "flush", "remove"])
def test_browse_never_fails_alongside_another_operation(queue, kind, when):
    for i in range(4):
        queue.enqueue(make_mail(f"m{i}"), delay="1h" if i == 3 else None)
    browsing = queue.browse()
    seen = []
    if when == "during":
        first = next(browsing)
        seen.append((first.name, first.mail.name))
    _operation(queue, kind)
    seen += [(item.name, item.mail.name) for item in browsing]
    assert all(a == b for a, b in seen)
    assert queue.size() == len(list(queue.browse()))


def test_browse_never_fails_under_concurrent_load(queue):
    for i in range(20):
        queue.enqueue(make_mail(f"seed{i}"))
    stop = threading.Event()
    errors: list[BaseException] = []

    def churn() -> None:
        chance = random.Random(7)
        try:
            n = 0
            while not stop.is_set():
                n += 1
                roll = chance.random()
                if roll < 0.4:
                    queue.enqueue(
                        make_mail(f"c{n}", sender=f"s{n % 3}@example.com"), delay=chance.choice([None, "1h"])
                    )
                elif roll < 0.7:
                    item = queue.dequeue(timeout=0)
                    if item:
                        item.done() if chance.random() < 0.8 else item.retry()
                elif roll < 0.85:
                    queue.remove(sender=f"s{n % 3}@example.com")
                elif roll < 0.95:
                    queue.flush()
                else:
                    queue.clear()
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    worker = threading.Thread(target=churn)
    worker.start()
    browses = 0
    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            for item in queue.browse():
                assert item.mail.name == item.name
            queue.size()
            browses += 1
    finally:
        stop.set()
        worker.join(10)
    assert not errors
    assert browses > 0
    assert queue.size() == len(list(queue.browse()))


def _three_mails(queue) -> None:
    queue.enqueue(make_mail("m1", sender="s1@example.com", recipients=("r1@example.com",)))
    queue.enqueue(make_mail("m2", sender="s2@example.com", recipients=("r2@example.com", "r3@example.com")))
    queue.enqueue(make_mail("m3", sender="s3@example.com", recipients=("r4@example.com",)))


@pytest.mark.parametrize(
    "criterion",
    [
        {"name": "m2"},
        {"sender": "s2@example.com"},
        {"recipient": "r2@example.com"},
        {"recipient": "r3@example.com"},
    ],
    ids=["name", "sender", "first-of-two-recipients", "second-of-two-recipients"],
)
def test_remove_deletes_only_the_matching_mail(queue, criterion):
    _three_mails(queue)
    assert queue.remove(**criterion) == 1
    assert names(queue) == ["m1", "m3"]
    assert queue.size() == 2
    assert [queue.dequeue(timeout=5).mail.name for _ in range(2)] == ["m1", "m3"]
    assert queue.dequeue(timeout=0.2) is None


def test_remove_deletes_every_match(queue):
    for i in range(3):
        queue.enqueue(make_mail("dup", sender="s@example.com"))
        queue.enqueue(make_mail(f"other{i}", sender="t@example.com"))
    assert queue.remove(name="dup") == 3
    assert names(queue) == ["other0", "other1", "other2"]
    assert queue.remove(sender="t@example.com") == 3
    assert queue.size() == 0


@pytest.mark.parametrize(
    "criteria",
    [
        {},
        {"name": "m1", "sender": "s1@example.com"},
        {"sender": "s1@example.com", "recipient": "r1@example.com"},
    ],
)
def test_remove_needs_exactly_one_criterion(backend, queue, criteria):
    _three_mails(queue)
    before = backend.state()
    with pytest.raises(InvalidInput, match="exactly one"):
        queue.remove(**criteria)
    assert backend.state() == before
    assert names(queue) == ["m1", "m2", "m3"]


def test_remove_clear_and_flush_on_an_empty_queue(queue):
    assert queue.remove(name="x") == 0
    assert queue.remove(sender="x@example.com") == 0
    assert queue.remove(recipient="x@example.com") == 0
    assert queue.clear() == 0
    assert queue.flush() == 0
    assert queue.size() == 0


def test_clear_empties_the_queue(queue):
    _three_mails(queue)
    assert queue.clear() == 3
    assert names(queue) == []
    assert queue.size() == 0
    assert queue.dequeue(timeout=0.2) is None


def test_deleted_mails_are_not_dequeued(queue):
    _three_mails(queue)
    queue.remove(name="m2")
    assert [queue.dequeue(timeout=5).mail.name for _ in range(2)] == ["m1", "m3"]
    assert queue.dequeue(timeout=0.2) is None


def test_remove_does_not_touch_mails_enqueued_later(queue):
    queue.enqueue(make_mail("same"))
    queue.remove(name="same")
    queue.enqueue(make_mail("same"))
    assert names(queue) == ["same"]
    assert queue.dequeue(timeout=5).mail.name == "same"
    assert queue.dequeue(timeout=0.2) is None


def test_a_mail_removed_while_in_flight_is_gone_after_its_retry(queue):
    queue.enqueue(make_mail("x"))
    item = queue.dequeue(timeout=5)
    queue.remove(name="x")
    item.retry()
    assert queue.dequeue(timeout=0.2) is None
    assert queue.size() == 0


def _references(runtime, enqueue_id: str) -> int:
    return len(runtime.blobs.references_of(enqueue_id))


@pytest.mark.parametrize("how", ["done", "remove", "clear"])
def test_content_is_released_when_a_mail_leaves(backend, runtime, queue, how):
    """Record 32: blob references go on dequeue and on delete/purge (the GC then collects the blobs)."""
    enqueue_id = queue.enqueue(make_mail("x", body=b"unique content " + how.encode()))
    assert _references(runtime, enqueue_id) == 2
    deletions = len(backend.blob_state().deletions)
    if how == "done":
        queue.dequeue(timeout=5).done()
    elif how == "remove":
        queue.remove(name="x")
    else:
        queue.clear()
    assert _references(runtime, enqueue_id) == 0
    assert len(backend.blob_state().deletions) == deletions + 2


def test_retry_and_unsettled_dequeue_keep_content(runtime, queue):
    enqueue_id = queue.enqueue(make_mail("x"))
    queue.dequeue(timeout=5).retry()
    queue.dequeue(timeout=5)
    assert _references(runtime, enqueue_id) == 2


def test_reject_moves_the_mail_to_the_dead_letters(runtime, queue):
    enqueue_id = queue.enqueue(make_mail("poison"))
    queue.enqueue(make_mail("fine"))
    queue.dequeue(timeout=5).reject("unparseable")
    assert [(d.enqueue_id, d.reason) for d in queue.dead_letters.list()] == [(enqueue_id, "unparseable")]
    assert names(queue) == ["fine"]
    assert queue.size() == 1
    queue.dequeue(timeout=5).done()
    assert queue.dequeue(timeout=0.3) is None
    assert _references(runtime, enqueue_id) == 2, "dead letters keep their content"


def test_rejecting_a_mail_removed_while_in_flight_leaves_no_dead_letter(backend, queue):
    queue.enqueue(make_mail("poison"))
    item = queue.dequeue(timeout=5)
    assert queue.remove(name="poison") == 1  # its content is released
    item.reject("unparseable")
    assert queue.dead_letters.list() == []  # a dead letter would have no content
    assert backend.broker_messages() == 0
    assert queue.dequeue(timeout=0.3) is None


def test_a_mail_whose_content_is_lost_is_dead_lettered_not_retried(backend, runtime, queue):
    body = b"content that goes missing"
    enqueue_id = queue.enqueue(make_mail("lost", body=body))
    queue.enqueue(make_mail("fine"))
    (body_blob,) = [b for b in runtime.blobs.references_of(enqueue_id) if runtime.blobs.read(b) == body]
    backend.lose_content(str(body_blob))
    item = queue.dequeue(timeout=5)
    assert item.mail.name == "fine"
    item.done()
    assert queue.dequeue(timeout=0.2) is None
    (letter,) = queue.dead_letters.list()
    assert letter.enqueue_id == enqueue_id and "content missing" in letter.reason


def test_an_unreadable_broker_message_is_dead_lettered_and_does_not_stop_the_queue(backend, queue):
    enqueue_id = queue.enqueue(make_mail("garbled"))
    queue.enqueue(make_mail("fine"))
    backend.corrupt_broker_message(QUEUE, enqueue_id)
    item = queue.dequeue(timeout=5)
    assert item.mail.name == "fine"
    item.done()
    assert queue.dequeue(timeout=0.2) is None
    (letter,) = queue.dead_letters.list()
    assert letter.enqueue_id == enqueue_id and "unreadable" in letter.reason
    assert backend.broker_messages() == 0


def test_settling_twice_is_an_error(queue):
    queue.enqueue(make_mail("x"))
    item = queue.dequeue(timeout=5)
    item.done()
    for settle in (item.done, item.retry, item.reject):
        with pytest.raises(InvalidInput, match="already"):
            settle()
    assert queue.size() == 0


def test_item_context_manager_is_done_on_success(queue):
    queue.enqueue(make_mail("x"))
    with queue.dequeue(timeout=5) as item:
        assert item.mail.name == "x"
    assert item.settled
    assert queue.size() == 0
    assert queue.dequeue(timeout=0.2) is None


def test_item_context_manager_retries_on_exception(queue):
    queue.enqueue(make_mail("x"))
    with pytest.raises(RuntimeError, match="delivery failed"):
        with queue.dequeue(timeout=5):
            raise RuntimeError("delivery failed")
    again = queue.dequeue(timeout=5)
    assert again.mail.name == "x" and again.attempts == 2
    assert queue.size() == 1


def test_item_context_manager_leaves_an_explicit_settlement_alone(queue):
    queue.enqueue(make_mail("x"))
    with pytest.raises(RuntimeError):
        with queue.dequeue(timeout=5) as item:
            item.done()
            raise RuntimeError("after done")
    assert queue.size() == 0
    assert queue.dequeue(timeout=0.2) is None


def test_republish_resends_only_what_the_broker_lost(backend, clocked, clock):
    ids = {name: clocked.enqueue(make_mail(name)) for name in ("a", "b", "c")}
    clock.advance(1)
    ids["young"] = clocked.enqueue(make_mail("young"))
    backend.lose_broker_message(QUEUE, ids["b"])
    backend.lose_broker_message(QUEUE, ids["young"])
    in_flight = clocked.dequeue(timeout=0)  # a: leased, still held by the broker
    assert in_flight.mail.name == "a"
    clock.advance(0.5)
    assert clocked.republish("1s") == 1  # b; young is newer than the cut-off
    assert clocked.republish("1s") == 0  # b is held again
    in_flight.done()
    received = []
    while (item := clocked.dequeue(timeout=0)) is not None:
        received.append(item.mail.name)
        item.done()
    # The broker delivers by priority, then in enqueue order: the republished b takes its place again.
    assert received == ["b", "c"]
    assert clocked.republish("0s") == 1  # now young, which nothing else would ever deliver
    assert clocked.dequeue(timeout=0).mail.name == "young"


def test_republish_skips_deleted_mails(backend, clocked, clock):
    enqueue_id = clocked.enqueue(make_mail("gone"))
    backend.lose_broker_message(QUEUE, enqueue_id)
    clocked.remove(name="gone")
    clock.advance(5)
    assert clocked.republish("1s") == 0
    assert clocked.dequeue(timeout=0) is None


def test_remove_by_the_null_sender_takes_the_bounces_only(queue):
    queue.enqueue(make_mail("bounce", sender=None))
    queue.enqueue(make_mail("plain", sender="s@example.com"))
    assert queue.remove(sender="<>") == 1
    assert names(queue) == ["plain"]
    queue.enqueue(make_mail("bounce-again", sender=None))
    assert queue.remove(sender="") == 1
    assert names(queue) == ["plain"]


def test_remove_matches_the_domain_in_any_case_and_the_local_part_exactly(queue):
    queue.enqueue(make_mail("exact", sender="Ann@Example.COM", recipients=("Bob@Example.org",)))
    queue.enqueue(make_mail("other-local-case", sender="ann@example.com", recipients=("bob@example.org",)))
    assert queue.remove(sender="Ann@example.com") == 1
    assert names(queue) == ["other-local-case"]
    assert queue.remove(recipient="bob@EXAMPLE.ORG") == 1
    assert names(queue) == []
