"""James's MailQueueFactoryContract: queues by name, created by their first enqueue, listed once."""

from __future__ import annotations

import pytest

from mailq_runtime import InvalidInput, UnknownQueue

from .conftest import WITH_EMBEDDED_BROKER
from .helpers import make_mail

DEPLOYMENTS = WITH_EMBEDDED_BROKER


def test_a_queue_is_created_by_its_first_enqueue_and_then_the_same(backend, runtime):
    queue = runtime.queue("spool")
    assert runtime.queue("spool") is queue
    # Naming a queue writes nothing; until its first mail it is empty and unknown to create=False.
    assert runtime.queues() == [] and backend.open().queues() == []
    assert (queue.size(), list(queue.browse()), queue.dequeue(timeout=0)) == (0, [], None)
    with pytest.raises(UnknownQueue, match="unknown queue 'spool'"):
        runtime.queue("spool", create=False)
    with pytest.raises(UnknownQueue, match="created by its first enqueue"):
        queue.maintenance.browse_start()
    queue.enqueue(make_mail("first"))
    assert runtime.queues() == ["spool"]
    assert runtime.queue("spool", create=False) is queue


def test_queues_are_listed_without_duplicates(backend, runtime):
    for name in ("b", "a", "b", "a", "c"):
        runtime.queue(name).enqueue(make_mail())
    backend.open().queue("a").enqueue(make_mail())  # an existing queue's enqueue from elsewhere
    assert runtime.queues() == ["a", "b", "c"]
    assert backend.open().queues() == ["a", "b", "c"]


def test_another_runtime_shares_the_queues(backend, runtime):
    runtime.queue("spool").enqueue(make_mail("shared"))
    other = backend.open()
    assert other.queues() == ["spool"]
    assert other.queue("spool", create=False).dequeue(timeout=5).mail.name == "shared"


def test_getting_an_unknown_queue_without_creating_it_raises(runtime):
    runtime.queue("known").enqueue(make_mail())
    with pytest.raises(UnknownQueue, match="unknown"):
        runtime.queue("unknown", create=False)
    assert runtime.queues() == ["known"]


def test_different_names_give_different_queues(runtime):
    runtime.queue("one").enqueue(make_mail("for-one"))
    two = runtime.queue("two")
    assert two.size() == 0
    assert two.dequeue(timeout=0.2) is None
    assert runtime.queue("one").size() == 1


@pytest.mark.parametrize("name", ["", "-dash-first", "with space", "x" * 65, "../etc", "a/b", "é", None, 5])
def test_an_invalid_queue_name_is_refused_and_creates_nothing(backend, runtime, name):
    runtime.queue("spool").enqueue(make_mail())
    before = backend.state()
    for create in (True, False):
        with pytest.raises(InvalidInput, match="queue name"):
            runtime.queue(name, create=create)
    assert backend.state() == before
    assert runtime.queues() == ["spool"]


def test_the_longest_valid_name(runtime):
    name = "q" + "x" * 63
    runtime.queue(name).enqueue(make_mail("m"))
    assert runtime.queues() == [name]
