"""The embedded store's transactions and turns: a queue operation inside a caller's transaction joins it,
and threads taking turns for whole operations lose and duplicate nothing. Embedded-only: these tests run
on the embedded deployment whatever the contract suite's backends."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from mailq_runtime import Runtime

from .backends import EmbeddedBackend
from .conftest import QUEUE
from .helpers import make_mail


@pytest.fixture
def backend(tmp_path) -> Iterator[EmbeddedBackend]:
    embedded = EmbeddedBackend(tmp_path / "data")
    yield embedded
    embedded.close()


@pytest.fixture
def runtime(backend: EmbeddedBackend) -> Runtime:
    return backend.open()


def test_an_enqueue_inside_a_transaction_rolls_back_with_it(runtime, backend):
    queue = runtime.queue(QUEUE)
    with pytest.raises(RuntimeError):
        with runtime.work.writes():
            queue.enqueue(make_mail("rolled-back"))
            raise RuntimeError("abort the outer transaction")
    assert queue.size() == 0
    assert list(queue.browse()) == []
    assert queue.dequeue(timeout=0) is None
    assert backend.blob_state().references == []


def test_threads_taking_turns_enqueue_and_dequeue_every_mail_once(runtime):
    queue = runtime.queue(QUEUE)
    names = [f"m{i}" for i in range(400)]
    taken: list[str] = []
    errors: list[BaseException] = []
    produced = threading.Event()

    def produce(lane: int) -> None:
        for name in names[lane::4]:
            queue.enqueue(make_mail(name))

    def consume() -> None:
        # Until the producers are done and the queue stays empty: a slow producer must not end it.
        try:
            while (item := queue.dequeue(timeout=0.5)) is not None or not produced.is_set():
                if item is not None:
                    with item:
                        taken.append(item.mail.name)
        except BaseException as error:
            errors.append(error)

    producers = [threading.Thread(target=produce, args=(lane,)) for lane in range(4)]
    consumers = [threading.Thread(target=consume) for _ in range(4)]
    for thread in producers + consumers:
        thread.start()
    for thread in producers:
        thread.join(timeout=120)
    produced.set()
    for thread in consumers:
        thread.join(timeout=120)
    assert errors == []
    assert sorted(taken) == sorted(names)
    assert queue.size() == 0
