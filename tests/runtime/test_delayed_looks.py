"""One process of a deployment at a time looks for a queue's due delayed mails (queue/publisher_lease.py):
where the store and the broker are not one transaction, two processes reading the same due rows would
both publish them, and the mail would be delivered twice with no fault at all."""

from __future__ import annotations

from mailq_runtime.queue.mail_queue import MailQueue
from mailq_runtime.stores.records import EnqueuedMail

from .conftest import QUEUE, WITH_EMBEDDED_BROKER
from .helpers import FakeClock, make_mail

# Where the store and the broker are one transaction (embedded) too: one process looks there as well.
DEPLOYMENTS = WITH_EMBEDDED_BROKER


def _look(queue: MailQueue) -> None:
    """A waiting consumer's look, now rather than at its next interval."""
    queue.publisher.schedule.look_later()
    queue.publisher.schedule.look_at = 0.0
    queue.publisher.publish_if_due()


def _delayed(queue: MailQueue) -> list[str]:
    delayed = queue.backends.delayed.all(queue.name)
    return sorted(EnqueuedMail.from_payload(mail.payload)[0].name for mail in delayed)


def _deliverable(queue: MailQueue) -> list[str]:
    names = []
    while (item := queue.backends.broker.receive(queue.name, 1)) is not None:
        names.append(EnqueuedMail.from_payload(item.payload)[0].name)
        queue.backends.broker.ack(item)
    return sorted(names)


def test_one_process_at_a_time_publishes_the_due_delayed_mails(backend):
    clock = FakeClock()
    first, second = (backend.open(clock).queue(QUEUE) for _ in range(2))
    # Every step within the lease (LEASE, 10 s), on the clock of the store's leases too.
    first.enqueue(make_mail("a"), delay=5)
    clock.advance(5.5)
    _look(first)  # takes the lease of the looks, and publishes
    assert _delayed(first) == []
    first.enqueue(make_mail("b"), delay=5)
    clock.advance(5.5)
    _look(second)  # the first holds the lease: the due mail is left to it
    assert _delayed(second) == ["b"]
    _look(first)
    assert _delayed(first) == []
    first.enqueue(make_mail("c"), delay=5)
    clock.advance(5.5)
    first.close()  # its runtime closes: the looks are handed over at once
    _look(second)
    assert _delayed(second) == []
    assert _deliverable(second) == ["a", "b", "c"]  # each published once
