"""An enqueue that a backend fails once its view row may be written leaves no mail behind: its producer was
told it failed (and sends the mail again), so the process withdraws the row once the store answers, rather
than leave a live mail that no broker holds in the queue's size until a `republish`. Under load, the
outage of tests/runtime/test_outage_recovery.py left such a row now and then: an INSERT that Cassandra
applied and whose answer the lost connection took."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from mailq_runtime.errors import StoreUnavailable
from mailq_runtime.queue import MailQueue
from mailq_runtime.stores.records import EnqueuedMail

from .backends import Backend
from .helpers import make_mail


class AnswerLost:
    """A queue view whose store writes a mail's row, or not (`applied`), then loses the connection before
    it answers. A store whose one transaction writes a mail's row and count writes both or neither; on
    Cassandra, which counts before it writes the row, the count stands whether the row's write failed or
    not."""

    def __init__(self, view: object, applied: bool, backend: Backend) -> None:
        self._view = view
        self._applied = applied
        self._backend = backend

    def __getattr__(self, name: str) -> object:
        return getattr(self._view, name)

    def insert(self, mail: EnqueuedMail) -> None:
        self.row = mail
        if self._applied or self._backend.counts_apart_from_rows:
            self._view.insert(mail)
        if not self._applied and self._backend.counts_apart_from_rows:
            self._backend.lose_row(mail)
        raise StoreUnavailable("Cassandra at 127.0.0.1 failed INSERT on enqueued_mails: connection lost")


def idle_consumer(queue: MailQueue) -> list[str]:
    """An idle consumer's wait withdraws them; the mails left live."""
    held = queue.dequeue(timeout=5)
    assert held is not None and held.mail.name == "kept"  # held: the next wait finds nothing
    assert queue.dequeue(timeout=0) is None
    return ["kept"]


def next_enqueue(queue: MailQueue) -> list[str]:
    """The next enqueue withdraws them (a process that only produces, `mailq smtp`); the mails left live."""
    queue.enqueue(make_mail("next"))
    return ["kept", "next"]


@pytest.mark.parametrize("applied", [True, False], ids=["row written", "row not written"])
@pytest.mark.parametrize("withdrawer", [idle_consumer, next_enqueue], ids=["idle consumer", "next enqueue"])
def test_a_failed_enqueue_is_withdrawn_once_the_store_answers(
    backend: Backend,
    queue: MailQueue,
    monkeypatch: pytest.MonkeyPatch,
    applied: bool,
    withdrawer: Callable[[MailQueue], list[str]],
):
    queue.enqueue(make_mail("kept"))  # in the same slice: an inexact count of it would show
    view = AnswerLost(queue.enqueuer.view, applied, backend)
    monkeypatch.setattr(queue.enqueuer, "view", view)
    with pytest.raises(StoreUnavailable):
        queue.enqueue(make_mail("failed"))
    monkeypatch.undo()  # the store answers again

    live = withdrawer(queue)

    assert sorted(item.name for item in queue.browse()) == live
    assert queue.size() == len(live) and queue.overviews.overview().size == len(live)
    assert view.row.enqueue_id not in backend.blob_state().held(), "its content is still referenced"
    assert queue.republish("0s") == 0
