"""James's MailQueueContract: what every mail queue does, whatever its backend."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from datetime import UTC, datetime, timedelta, timezone

import pytest

from mailq_runtime import Mail, PerRecipientHeader
from mailq_runtime.model import NORMAL_PRIORITY

from .conftest import QUEUE, WITH_EVERY_BROKER
from .helpers import make_mail

DEPLOYMENTS = WITH_EVERY_BROKER


def full_mail() -> Mail:
    """A mail with every field set to something other than its default."""
    return Mail(
        recipients=("rcpt1@example.com", "rcpt2@example.org", '"quoted local"@[192.0.2.1]'),
        message=b"Subject: hello\r\nFrom: a@example.com\r\n\r\nbody \xe2\x9c\x93 \x00\xff\r\n.\r\n",
        sender="sender@example.com",
        name="mail-1 \u00fcn\u00efcode",
        attributes={
            "text": "v",
            "int": 3,
            "float": 1.5,
            "bool": True,
            "none": None,
            "list": [1, "a", [2]],
            "nested": {"k": ["v", {"deep": False}]},
            "\u00fcn\u00ef": "\u00f6",
        },
        state="transport",
        error_message="550 5.1.1 mailbox unavailable",
        remote_host="mx.example.net",
        remote_addr="2001:db8::1",
        per_recipient_headers=(
            PerRecipientHeader("rcpt1@example.com", "X-Tag", "one"),
            PerRecipientHeader("rcpt1@example.com", "X-Other", "two: with colon"),
            ("rcpt2@example.org", "X-Tag", "three"),
        ),
        last_updated=datetime(2024, 2, 29, 23, 59, 58, 123457, tzinfo=timezone(timedelta(hours=2))),
    )


FIELDS = (
    "recipients",
    "message",
    "sender",
    "name",
    "attributes",
    "state",
    "error_message",
    "remote_host",
    "remote_addr",
    "per_recipient_headers",
    "last_updated",
)


@pytest.mark.parametrize("field", FIELDS)
def test_dequeue_preserves_every_field(queue, field):
    sent = full_mail()
    queue.enqueue(sent)
    received = queue.dequeue(timeout=5).mail
    assert getattr(received, field) == getattr(sent, field)


def test_round_trip_is_the_same_mail_through_dequeue_and_browse(queue):
    sent = full_mail()
    queue.enqueue(sent)
    assert [item.mail for item in queue.browse()] == [sent]
    received = queue.dequeue(timeout=5).mail
    assert received == sent
    # Exact to the microsecond, and the same instant whatever the offset it is shown in.
    assert received.last_updated.astimezone(UTC) == datetime(2024, 2, 29, 21, 59, 58, 123457, tzinfo=UTC)


def test_per_recipient_headers_single_and_none(queue):
    single = make_mail("single", per_recipient_headers=(("rcpt@example.com", "X-One", "1"),))
    none = make_mail("none")
    queue.enqueue(single)
    queue.enqueue(none)
    assert queue.dequeue(timeout=5).mail.per_recipient_headers == single.per_recipient_headers
    assert queue.dequeue(timeout=5).mail.per_recipient_headers == ()


@pytest.mark.parametrize(
    "message",
    [
        b"Subject: only headers, no blank line\r\n",
        b"Subject: lf\n\nbody with lf\n",
        b"Subject: same\r\n\r\nSubject: same\r\n\r\n",  # body equal to headers: one blob, two uses
        b"Subject: binary body\r\n\r\n" + bytes(range(256)) * 4,
        b"Subject: 8bit header \xe9\xff\r\n\r\n\x00\r\n",
    ],
    ids=["headers-only", "lf", "body-equals-headers", "binary-body", "8bit-header"],
)
def test_message_bytes_survive_exactly(queue, message):
    queue.enqueue(Mail(recipients=("r@example.com",), message=message))
    assert queue.dequeue(timeout=5).mail.message == message


def test_twelve_mebibyte_mail(queue):
    body = (bytes(range(256)) * 4096) * 12 + b"end"
    sent = make_mail("big", body=body)
    assert len(sent.message) > 12 * 1024 * 1024
    queue.enqueue(sent)
    item = queue.dequeue(timeout=10)
    assert item.mail.message == sent.message
    item.done()


def test_null_sender(queue):
    queue.enqueue(make_mail("bounce", sender=None))
    assert [item.sender for item in queue.browse()] == [None]
    item = queue.dequeue(timeout=5)
    assert item.mail.sender is None
    item.done()


def test_same_name_enqueued_twice_is_dequeued_twice(queue):
    queue.enqueue(make_mail("twice"))
    queue.enqueue(make_mail("twice"))
    first, second = queue.dequeue(timeout=5), queue.dequeue(timeout=5)
    assert first.mail.name == second.mail.name == "twice"
    assert first.enqueue_id != second.enqueue_id


def test_dequeue_is_fifo(queue):
    names = [f"m{i}" for i in range(8)]
    for name in names:
        queue.enqueue(make_mail(name))
    received = []
    for _ in names:
        item = queue.dequeue(timeout=5)
        received.append(item.mail.name)
        item.done()
    assert received == names


def test_the_ready_mails_are_taken_at_once_in_order_up_to_the_limit(queue):
    names = [f"m{i}" for i in range(5)]
    for name in names:
        queue.enqueue(make_mail(name))
    first = queue.dequeue(timeout=5)
    taken = queue.dequeue_ready(3)
    assert [item.mail.name for item in [first, *taken]] == names[:4]
    assert queue.dequeue_ready(3)[0].mail.name == "m4"
    assert queue.dequeue_ready(3) == []  # all in flight: nothing ready, no waiting
    for item in taken:
        assert item.attempts == 1
        item.done()
    assert queue.size() == 2


def test_a_mail_taken_among_the_ready_ones_is_leased_like_a_dequeued_one(backend, clock):
    queue = backend.open(clock, visibility_timeout="10s").queue(QUEUE)
    for name in "ab":
        queue.enqueue(make_mail(name))
    taken = queue.dequeue_ready(2)
    clock.advance(9.9)
    assert queue.dequeue_ready(2) == []
    clock.advance(0.2)
    again = queue.dequeue_ready(2)
    assert [item.enqueue_id for item in again] == [item.enqueue_id for item in taken]
    assert [item.attempts for item in again] == [2, 2]


def test_several_items_in_flight_at_once(queue):
    queue.enqueue(make_mail("a"))
    queue.enqueue(make_mail("b"))
    first, second = queue.dequeue(timeout=5), queue.dequeue(timeout=5)
    assert {first.mail.name, second.mail.name} == {"a", "b"}
    first.done()
    second.done()
    assert queue.size() == 0


def test_out_of_order_acks(queue):
    for name in "abc":
        queue.enqueue(make_mail(name))
    a, b, c = (queue.dequeue(timeout=5) for _ in range(3))
    c.done()
    a.done()
    b.done()
    assert queue.size() == 0
    assert queue.dequeue(timeout=0.3) is None


def test_retry_redelivers(queue):
    queue.enqueue(make_mail("again"))
    first = queue.dequeue(timeout=5)
    first.retry()
    second = queue.dequeue(timeout=5)
    assert second.enqueue_id == first.enqueue_id
    assert second.mail == first.mail
    assert (first.attempts, second.attempts) == (1, 2)


def test_out_of_order_retry_loses_nothing(queue):
    for name in "abc":
        queue.enqueue(make_mail(name))
    a, b = queue.dequeue(timeout=5), queue.dequeue(timeout=5)
    b.retry()
    a.done()
    received = []
    for _ in range(2):
        item = queue.dequeue(timeout=5)
        received.append(item.mail.name)
        item.done()
    assert sorted(received) == ["b", "c"]
    assert queue.dequeue(timeout=0.2) is None


def test_retry_with_delay(clocked, clock):
    clocked.enqueue(make_mail("later"))
    clocked.dequeue(timeout=0).retry(delay="30s")
    assert clocked.dequeue(timeout=0.3) is None
    clock.advance(29.9)
    assert clocked.dequeue(timeout=0) is None
    clock.advance(0.1)
    assert clocked.dequeue(timeout=0).mail.name == "later"


def test_in_flight_item_is_not_redelivered_before_the_visibility_timeout(backend, clock):
    queue = backend.open(clock, visibility_timeout="10s").queue(QUEUE)
    queue.enqueue(make_mail("leased"))
    leased = queue.dequeue(timeout=0)
    clock.advance(9.9)
    assert queue.dequeue(timeout=0.3) is None
    clock.advance(0.2)
    again = queue.dequeue(timeout=0)
    assert again.enqueue_id == leased.enqueue_id
    assert again.attempts == 2


def test_killed_consumer_mail_is_redelivered_after_the_visibility_timeout(backend):
    queue = backend.open(visibility_timeout="2s").queue(QUEUE)
    sent = queue.enqueue(make_mail("orphan"))
    consumer = backend.agent("hold", QUEUE, visibility_timeout="2s")
    try:
        assert consumer.stdout.readline().strip() == sent
        leased_at = time.monotonic()
        assert queue.dequeue(timeout=0.5) is None  # leased to the living consumer
        os.kill(consumer.pid, signal.SIGKILL)
        consumer.wait(timeout=10)
        item = queue.dequeue(timeout=10)
    finally:
        if consumer.poll() is None:
            consumer.kill()
        consumer.wait(timeout=10)
    assert item is not None and item.enqueue_id == sent
    assert item.attempts == 2
    # Not before the lease's end; RabbitMQ gives the mail back at once when its consumer's connection dies.
    assert backend.leases_end_with_their_consumer or time.monotonic() - leased_at >= 1.9
    item.done()
    assert queue.size() == 0


def test_timed_dequeue_on_an_empty_queue_returns_none(queue):
    started = time.monotonic()
    assert queue.dequeue(timeout=0.5) is None
    assert 0.45 <= time.monotonic() - started < 3
    assert queue.dequeue(timeout=0) is None


def _dequeue_in_thread(queue, timeout):
    result = {}

    def take():
        result["item"] = queue.dequeue(timeout=timeout)
        result["at"] = time.monotonic()

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    return thread, result


def test_dequeue_blocks_until_a_later_enqueue(queue):
    thread, result = _dequeue_in_thread(queue, None)
    thread.join(0.5)
    assert thread.is_alive(), "dequeue() on an empty queue must block"
    enqueued_at = time.monotonic()
    queue.enqueue(make_mail("wake"))
    thread.join(10)
    assert not thread.is_alive()
    assert result["item"].mail.name == "wake"
    assert result["at"] - enqueued_at < 2


def test_timed_dequeue_is_woken_by_a_later_enqueue(queue):
    thread, result = _dequeue_in_thread(queue, 20)
    time.sleep(0.3)
    enqueued_at = time.monotonic()
    queue.enqueue(make_mail("wake"))
    thread.join(10)
    assert result["item"].mail.name == "wake"
    assert result["at"] - enqueued_at < 2


def test_concurrent_enqueue_and_dequeue_from_threads(queue):
    producers, per_producer, consumers = 4, 50, 4
    expected = {f"p{p}-{i}" for p in range(producers) for i in range(per_producer)}
    done: list[str] = []
    lock = threading.Lock()
    deadline = time.monotonic() + 60
    errors: list[BaseException] = []

    def produce(p: int) -> None:
        try:
            for i in range(per_producer):
                queue.enqueue(make_mail(f"p{p}-{i}"))
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    def consume(seed: int) -> None:
        chance = random.Random(seed)
        try:
            while time.monotonic() < deadline:
                with lock:
                    if len(done) >= len(expected):
                        return
                item = queue.dequeue(timeout=0.2)
                if item is None:
                    continue
                if chance.random() < 0.2:
                    item.retry()  # James's contract mixes nacks into the load
                    continue
                item.done()
                with lock:
                    done.append(item.mail.name)
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    threads += [threading.Thread(target=consume, args=(c,)) for c in range(consumers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()) + 5)
    assert not errors
    assert len(done) == len(expected), "a mail was lost or delivered twice"
    assert set(done) == expected
    assert queue.size() == 0
    assert queue.dequeue(timeout=0) is None


def test_concurrent_enqueue_and_dequeue_from_two_processes(backend, tmp_path):
    queue = backend.open().queue(QUEUE)
    per_process = 100
    workers = {tag: backend.agent("work", QUEUE, tag, str(per_process), str(tmp_path)) for tag in ("a", "b")}
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"produced-{tag}").exists() for tag in workers):
            assert time.monotonic() < deadline, "the workers did not finish enqueueing"
            assert all(w.poll() is None for w in workers.values()), [
                w.communicate() for w in workers.values()
            ]
            time.sleep(0.05)
        (tmp_path / "stop").touch()
        for worker in workers.values():
            _, stderr = worker.communicate(timeout=60)
            assert worker.returncode == 0, stderr
    finally:
        for worker in workers.values():
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    consumed = [n for tag in workers for n in (tmp_path / f"consumed-{tag}").read_text().split("\n") if n]
    expected = {f"{tag}-{i}" for tag in workers for i in range(per_process)}
    assert len(consumed) == len(expected), "a mail was lost or delivered twice"
    assert set(consumed) == expected
    assert queue.size() == 0
    assert list(queue.browse()) == []


def test_a_retry_delay_shows_in_browse(clocked, clock):
    clocked.enqueue(make_mail("later"))
    clocked.dequeue(timeout=0).retry(delay="30s")
    (item,) = list(clocked.browse())
    assert item.next_delivery - item.enqueued_time == timedelta(seconds=30)
    clock.advance(30)
    clocked.dequeue(timeout=0).retry()
    (item,) = list(clocked.browse())
    assert item.next_delivery - item.enqueued_time == timedelta(seconds=30)


def test_enqueues_written_in_one_group_are_each_its_own_mail(queue):
    # What the holder of the embedded store's turn writes for the enqueues handed over to it (`in_group`):
    # every backend's calls for several mails at once, two of them of the same content.
    sent = [full_mail(), full_mail(), make_mail("other", recipients=("rcpt@example.net",))]
    enqueue_ids = queue.enqueuer._write_all([(mail, None, NORMAL_PRIORITY) for mail in sent])
    assert len(set(enqueue_ids)) == 3
    assert queue.size() == 3
    counts = {domain.domain: domain.total("queued") for domain in queue.overviews.by_domain()}
    assert counts == {"example.com": 2, "example.org": 2, "[192.0.2.1]": 2, "example.net": 1}
    received = []
    for _ in sent:
        item = queue.dequeue(timeout=5)
        received.append((item.enqueue_id, item.mail))
        item.done()
    assert sorted(received, key=lambda pair: pair[0]) == sorted(
        zip(enqueue_ids, sent, strict=True), key=lambda pair: pair[0]
    )
    assert queue.size() == 0
