"""Delays as records of the metadata store (the broker carries only what is deliverable now), and the
broker payload as a named, versioned record that older and newer versions can read."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pytest

from mailq_runtime.clock import from_datetime
from mailq_runtime.errors import InvalidInput
from mailq_runtime.faults import ENQUEUE_AFTER_VIEW_ROW, InjectedFault
from mailq_runtime.model import BlobId, EnqueueId, MailAddress, PerRecipientHeader
from mailq_runtime.queue import PUBLISH_INTERVAL
from mailq_runtime.stores.records import EnqueuedMail

from .conftest import QUEUE
from .helpers import make_mail

# The positional row that versions before the named record published, in its order.
LEGACY_ORDER = (
    "queue",
    "slice_start",
    "bucket",
    "enqueue_id",
    "enqueued_time",
    "next_delivery",
    "priority",
    "name",
    "sender",
    "recipients",
    "header_blob_id",
    "body_blob_id",
    "metadata",
)


def test_a_delayed_mail_waits_in_the_delayed_mails_not_in_the_broker(backend, clocked):
    enqueue_id = clocked.enqueue(make_mail("later"), delay="5000y")
    (item,) = clocked.browse()
    (delayed,) = clocked.backends.delayed.all(QUEUE)
    assert (delayed.enqueue_id, delayed.due) == (enqueue_id, int(item.next_delivery.timestamp() * 1e6))
    assert backend.broker_messages() == 0
    assert clocked.publisher.publish_due() == 0
    assert clocked.flush() == 1
    assert (backend.broker_messages(), clocked.backends.delayed.all(QUEUE)) == (1, [])
    assert clocked.dequeue(timeout=0).mail.name == "later"


def test_a_consumer_publishes_the_delays_another_process_wrote(backend):
    producer, consumer = backend.open().queue(QUEUE), backend.open().queue(QUEUE)
    started = time.monotonic()
    producer.enqueue(make_mail("later"), delay=1)
    item = consumer.dequeue(timeout=10)
    waited = time.monotonic() - started
    assert item is not None and item.mail.name == "later"
    assert 1 <= waited < 1 + 2 * PUBLISH_INTERVAL


def test_removing_a_delayed_mail_drops_its_delayed_row(clocked):
    clocked.enqueue(make_mail("later"), delay="1h")
    assert clocked.remove(name="later") == 1
    assert clocked.backends.delayed.all(QUEUE) == []


def test_a_retry_after_a_delay_keeps_counting_the_attempts(clocked, clock):
    clocked.enqueue(make_mail("flaky"))
    attempts = []
    for delay in (5, None, 5):
        item = clocked.dequeue(timeout=0)
        attempts.append(item.attempts)
        item.retry(delay=delay)
        clock.advance(5)
    attempts.append(clocked.dequeue(timeout=0).attempts)
    assert attempts == [1, 2, 3, 4]


def test_a_retry_to_some_recipients_carries_only_those(clocked, clock):
    # Remote delivery's partial success: the delivered recipients are not in the mail that comes back,
    # also when it comes back at once; browse still shows the mail as it was enqueued.
    recipients = ("a@one.test", "b@two.test", "c@three.test")
    clocked.enqueue(make_mail("partial", recipients=recipients))
    clocked.dequeue(timeout=0).retry(recipients=["b@two.test", "c@three.test"])
    item = clocked.dequeue(timeout=0)
    assert (item.mail.recipients, item.attempts) == (("b@two.test", "c@three.test"), 2)
    item.retry(delay=5, recipients=["c@three.test"])
    assert clocked.dequeue(timeout=0) is None
    clock.advance(5)
    item = clocked.dequeue(timeout=0)
    assert (item.mail.recipients, item.mail.name, item.attempts) == (("c@three.test",), "partial", 3)
    (shown,) = clocked.browse()
    assert shown.mail.recipients == recipients


@pytest.mark.parametrize("recipients", [[], ["not an address"]])
def test_a_retry_to_no_or_bad_recipients_is_refused_and_leaves_the_mail_held(clocked, recipients):
    clocked.enqueue(make_mail("held"))
    item = clocked.dequeue(timeout=0)
    with pytest.raises(InvalidInput):
        item.retry(recipients=recipients)
    assert not item.settled
    item.done()
    assert clocked.size() == 0


def test_republish_delays_again_a_mail_whose_delayed_row_was_never_written(backend, clock):
    # Each write commits on its own, as without transactions.
    runtime = backend.open(clock, group_writes=False, slice_window="1s", clock_skew_grace="0s")
    queue = runtime.queue(QUEUE)
    queue.backends.faults.arm(ENQUEUE_AFTER_VIEW_ROW)
    with pytest.raises(InjectedFault):
        queue.enqueue(make_mail("later"), delay="1h")
    clock.advance(1)
    assert queue.republish("0s") == 1
    (item,) = queue.browse()
    (delayed,) = queue.backends.delayed.all(QUEUE)
    assert delayed.due == int(item.next_delivery.timestamp() * 1e6)
    assert backend.broker_messages() == 0
    assert queue.republish("0s") == 0


def republished(runtime, queue, change) -> None:
    """Take the broker message of the queue's one mail and publish `change(record)` in its place."""
    delivery = runtime.broker.receive(QUEUE, 0)
    record = json.loads(delivery.payload)
    assert record["v"] == 1
    assert runtime.broker.ack(delivery)
    runtime.broker.publish(QUEUE, delivery.enqueue_id, json.dumps(change(record)), record["priority"])


def legacy(record: dict) -> list:
    return [record[name] for name in LEGACY_ORDER]


def test_a_mail_in_flight_across_an_upgrade_still_dequeues(clocked_runtime, clocked):
    mail = make_mail("old", attributes={"a": 1}, remote_addr="192.0.2.1")
    clocked.enqueue(mail)
    republished(clocked_runtime, clocked, legacy)
    item = clocked.dequeue(timeout=0)
    assert item.mail == mail
    item.done()
    assert clocked.size() == 0


def test_unknown_fields_are_ignored_and_missing_optional_ones_take_their_defaults(clocked_runtime, clocked):
    mail = make_mail("new")
    clocked.enqueue(mail)

    def from_a_later_version(record: dict) -> dict:
        del record["metadata"], record["attempts"]
        return {**record, "v": 7, "added_later": {"anything": [1, 2]}}

    republished(clocked_runtime, clocked, from_a_later_version)
    item = clocked.dequeue(timeout=0)
    assert (item.mail.name, item.mail.message, item.mail.recipients) == (
        mail.name,
        mail.message,
        mail.recipients,
    )
    assert (item.mail.attributes, item.mail.state, item.attempts) == ({}, "root", 1)


def test_a_record_without_a_required_field_is_dead_lettered(clocked_runtime, clocked):
    enqueue_id = clocked.enqueue(make_mail("broken"))
    republished(
        clocked_runtime, clocked, lambda record: {k: v for k, v in record.items() if k != "body_blob_id"}
    )
    assert clocked.dequeue(timeout=0) is None
    (letter,) = clocked.dead_letters.list()
    assert letter.enqueue_id == enqueue_id
    assert letter.reason == "unreadable message: mail record without 'body_blob_id'"


# Mails whose every field the payload carries: the defaults, and text that JSON must escape.
UNUSUAL = make_mail(
    'na\u0308me \u2603 "quoted" \\',
    sender=None,
    recipients=("a@example.com", '"odd \\"local"@example.org'),
    attributes={"list": [1, 2.5, None, True, "\u00e9"], "nested": {"k": "v"}},
    state="ghost",
    error_message='550 "no"\r\nsecond line',
    remote_host="h\u00f4te",
    remote_addr="::1",
    per_recipient_headers=(PerRecipientHeader("a@example.com", "X-Tag", "v\u00e9"),),
    last_updated=datetime(2001, 2, 3, 4, 5, 6, 7, tzinfo=UTC),
)


@pytest.mark.parametrize("mail", [make_mail("plain"), UNUSUAL], ids=["plain", "unusual"])
def test_the_row_and_the_payload_are_the_texts_json_writes(mail):
    blob_id = BlobId(3, "ab" * 32)
    row = EnqueuedMail.of(mail, QUEUE, EnqueueId("0" * 32), 1, 2, 7, 0, 1, blob_id, blob_id)
    metadata = {
        "attributes": mail.attributes,
        "state": mail.state,
        "error_message": mail.error_message,
        "remote_host": mail.remote_host,
        "remote_addr": mail.remote_addr,
        "per_recipient_headers": [[h.recipient, h.name, h.value] for h in mail.per_recipient_headers],
        "last_updated": from_datetime(mail.last_updated),
    }
    assert (row.recipients, row.metadata) == (json.dumps(list(mail.recipients)), json.dumps(metadata))
    record = dict(zip(LEGACY_ORDER, row.row(), strict=True))
    assert row.to_payload(4) == json.dumps({"v": 1, **record, "attempts": 4}, separators=(",", ":"))
    assert EnqueuedMail.from_payload(row.to_payload(4)) == (row, 4)
    # Whitespace around the record, as another writer may leave, is read too.
    assert EnqueuedMail.from_payload(f" {row.to_payload(4)}\n") == (row, 4)
    read = row.to_mail(mail.message)
    assert read == mail
    assert all(type(address) is MailAddress for address in (*read.recipients, read.sender) if address)


def test_a_stored_mail_lacking_optional_fields_takes_their_defaults():
    blob_id = BlobId(1, "cd" * 32)
    row = EnqueuedMail.of(make_mail("bare"), QUEUE, EnqueueId("0" * 32), 1, 1, 5, 0, 0, blob_id, blob_id)
    before = datetime.now(UTC)
    read = EnqueuedMail(*row.row()[:-1], "{}").to_mail(b"Subject: x\r\n\r\n")
    assert (read.attributes, read.state, read.error_message, read.remote_host, read.remote_addr) == (
        {},
        "root",
        None,
        "localhost",
        "127.0.0.1",
    )
    assert read.per_recipient_headers == () and read.last_updated >= before
