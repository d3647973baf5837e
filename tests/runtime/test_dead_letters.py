"""Dead letters as records of the metadata store (as James's mail repositories): rejected mails keep their
content, and an operator lists, shows, requeues and purges them."""

from __future__ import annotations

from datetime import timedelta

import pytest

from mailq_runtime import InvalidInput, Mail
from mailq_runtime.clock import to_datetime

from .conftest import QUEUE, WITH_QUORUM_QUEUES
from .helpers import make_mail

DEPLOYMENTS = WITH_QUORUM_QUEUES


def full_mail(name: str) -> Mail:
    return make_mail(
        name,
        sender="alice@example.com",
        recipients=("bob@example.org", "carol@example.net"),
        attributes={"spam_score": 0.5},
        remote_host="mx.example.com",
    )


def rejected(queue, mail: Mail, reason: str = "550 no such user", priority: int | None = None) -> str:
    """Enqueue `mail` and reject it; returns its enqueue id."""
    enqueue_id = queue.enqueue(mail, priority=priority)
    item = queue.dequeue(timeout=0)
    assert item.enqueue_id == enqueue_id
    item.reject(reason)
    return enqueue_id


def test_a_rejected_mail_is_a_dead_letter_with_its_whole_content(clocked, clock):
    mail = full_mail("poison")
    enqueue_id = rejected(clocked, mail)
    (letter,) = clocked.dead_letters.list()
    assert (letter.enqueue_id, letter.reason, letter.name) == (enqueue_id, "550 no such user", "poison")
    assert (letter.sender, letter.recipients) == (
        "alice@example.com",
        ["bob@example.org", "carol@example.net"],
    )
    assert letter.died_at == to_datetime(clock())
    assert clocked.dead_letters.get(enqueue_id).mail == mail
    assert clocked.size() == 0 and list(clocked.browse()) == []
    assert len(clocked.backends.blobs.references_of(enqueue_id)) == 2


def test_requeue_puts_the_mail_back_under_a_new_enqueue_id(clocked, clock):
    mail = full_mail("poison")
    old = rejected(clocked, mail, priority=9)
    clocked.enqueue(make_mail("waiting"), priority=1)
    clock.advance(1)
    (new,) = clocked.dead_letters.requeue(old)
    assert new != old
    assert clocked.dead_letters.list() == []
    assert [item.name for item in clocked.browse()] == ["waiting", "poison"]
    assert clocked.size() == 2
    item = clocked.dequeue(timeout=0)  # its priority came back with it
    assert (item.enqueue_id, item.mail, item.attempts) == (new, mail, 1)
    item.done()
    assert clocked.backends.blobs.references_of(old) == []


def test_requeue_every_dead_letter_in_enqueue_order(clocked, clock):
    first = rejected(clocked, make_mail("first"))
    clock.advance(0.1)
    second = rejected(clocked, make_mail("second"))
    assert [letter.enqueue_id for letter in clocked.dead_letters.list()] == [first, second]
    assert len(clocked.dead_letters.requeue(every=True)) == 2
    assert [item.name for item in clocked.browse()] == ["first", "second"]
    assert clocked.dead_letters.list() == []


def test_purge_deletes_the_letter_and_releases_its_content(clocked):
    enqueue_id = rejected(clocked, make_mail("poison"))
    assert clocked.dead_letters.purge(enqueue_id) == 1
    assert clocked.dead_letters.list() == []
    assert clocked.backends.blobs.references_of(enqueue_id) == []
    with pytest.raises(InvalidInput, match=f"holds no dead letter {enqueue_id}"):
        clocked.dead_letters.get(enqueue_id)


def test_purge_older_than_keeps_the_younger_letters(clocked, clock):
    old = rejected(clocked, make_mail("old"))
    clock.advance(timedelta(hours=2).total_seconds())
    young = rejected(clocked, make_mail("young"))
    clock.advance(1)
    assert clocked.dead_letters.purge(older_than="1h") == 1
    assert [letter.enqueue_id for letter in clocked.dead_letters.list()] == [young]
    assert clocked.backends.blobs.references_of(old) == []
    assert len(clocked.backends.blobs.references_of(young)) == 2
    assert clocked.dead_letters.purge(older_than="0s") == 1
    assert clocked.dead_letters.list() == []


@pytest.mark.parametrize(
    ("operation", "message"),
    [
        (lambda q, i: q.dead_letters.get("0" * 32), "holds no dead letter"),
        (lambda q, i: q.dead_letters.requeue("0" * 32), "holds no dead letter"),
        (lambda q, i: q.dead_letters.purge("0" * 32), "holds no dead letter"),
        (lambda q, i: q.dead_letters.get("not-an-id"), "invalid enqueue id"),
        (lambda q, i: q.dead_letters.requeue(), "exactly one of"),
        (lambda q, i: q.dead_letters.requeue(i, every=True), "exactly one of"),
        (lambda q, i: q.dead_letters.purge(), "exactly one of"),
        (lambda q, i: q.dead_letters.purge(i, older_than="1h"), "exactly one of"),
        (lambda q, i: q.dead_letters.purge(older_than="-1h"), "older_than"),
    ],
)
def test_bad_input_changes_nothing(backend, clocked, operation, message):
    enqueue_id = rejected(clocked, make_mail("poison"))
    before = backend.state()
    with pytest.raises(InvalidInput, match=message):
        operation(clocked, enqueue_id)
    assert backend.state() == before


def test_an_unreadable_letter_is_listed_and_purged_but_not_requeued(backend, clocked):
    enqueue_id = clocked.enqueue(make_mail("garbled"))
    backend.corrupt_broker_message(QUEUE, enqueue_id)
    assert clocked.dequeue(timeout=0) is None  # dead-lettered as unreadable
    (letter,) = clocked.dead_letters.list()
    assert letter.enqueue_id == enqueue_id and letter.name is None and "unreadable" in letter.reason
    with pytest.raises(InvalidInput, match="holds no readable mail"):
        assert clocked.dead_letters.get(enqueue_id).mail is None
    before = backend.state()
    with pytest.raises(InvalidInput, match="cannot be requeued, only purged"):
        clocked.dead_letters.requeue(every=True)
    assert backend.state() == before
    assert clocked.dead_letters.purge(enqueue_id) == 1
    assert clocked.dead_letters.list() == []
