"""Crash order: every write path of the queue dies after each of its writes in turn (faults.py), with the
embedded store's grouping of one operation's writes on (the fault rolls the group back, as a crash before
its commit) and off (every earlier write stays, as on a store without transactions).

After every fault: no accepted mail is lost, nothing half-written is delivered, the leftovers are healed
by the queue's own mechanisms (a lease expiring, republish, flush, the deletion marks, record 32's content
clean-up) and running the operation again completes it. (References whose owner never came to exist are
the orphan sweep's, tested with the blobs.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from mailq_runtime.clock import to_datetime
from mailq_runtime.faults import (
    CLEAN_AFTER_BROWSE_START,
    CLEAN_AFTER_DELETE,
    CLEAN_AFTER_RELEASE,
    DONE_AFTER_DELETION_MARK,
    DONE_AFTER_MARK,
    DONE_AFTER_RELEASE,
    ENQUEUE_AFTER_REFERENCES,
    ENQUEUE_AFTER_VIEW_ROW,
    FLUSH_AFTER_DELAYED_ROWS,
    PARK_AFTER_PAYLOAD,
    PUBLISH_DUE_AFTER_PUBLISH,
    PURGE_AFTER_REMOVE,
    QUEUE_POINTS,
    REJECT_AFTER_DEAD_LETTER,
    REJECT_AFTER_MARK,
    RELEASE_AFTER_DELAYED_ROW,
    REMOVE_AFTER_MARK,
    REMOVE_AFTER_RELEASE,
    REQUEUE_AFTER_ENQUEUE,
    REQUEUE_AFTER_REMOVE,
    RETRY_AFTER_ACK,
    RETRY_AFTER_DELAYED_ROW,
    InjectedFault,
)
from mailq_runtime.queue import MailQueue

from .conftest import QUEUE
from .helpers import make_mail

LEASE = 300  # seconds: the default visibility timeout, which these runtimes keep


@dataclass
class Crash:
    """One test's queue on the fake clock, and the mails it accepted (name -> message)."""

    queue: MailQueue
    clock: object
    grouped: bool
    settle: float  # seconds until what was counted has settled (conftest.py's `settling`)
    accepted: dict[str, bytes] = field(default_factory=dict)

    def enqueue(self, name: str, **options) -> str:
        mail = make_mail(name, body=f"the whole of {name}\r\n".encode() * 50)
        enqueue_id = self.queue.enqueue(mail, **options)
        self.accepted[name] = mail.message
        return enqueue_id

    def take(self, name: str):
        item = self.queue.dequeue(timeout=0)
        assert item is not None and item.mail.name == name
        return item

    def crash(self, point: str, operation: Callable[[], object]) -> None:
        self.queue.backends.faults.arm(point)
        with pytest.raises(InjectedFault, match=point):
            operation()
        assert self.queue.backends.faults.armed is None

    def references(self, enqueue_id: str) -> list:
        return self.queue.backends.blobs.references_of(enqueue_id)

    def drain(self) -> list[str]:
        """Deliver what is deliverable now; each mail must be whole."""
        names = []
        while (item := self.queue.dequeue(timeout=0)) is not None:
            assert item.mail.message == self.accepted[item.mail.name], "a half-written mail was delivered"
            names.append(item.mail.name)
            item.done()
        return names

    def heal(self) -> list[str]:
        """Everything the queue does on its own, or an operator does, after a crash: leases expire,
        republish sends what no broker holds, flush makes the delays due. Returns what was delivered."""
        self.clock.advance(LEASE + 1)
        self.queue.republish("0s")
        self.queue.flush()
        return self.drain()

    def settled(self, delivered: list[str], expected: set[str]) -> None:
        """Every accepted mail was delivered, and nothing is left in the queue, the broker, the delays,
        nor (once record 32's clean-up has run) in the blob references of delivered mails."""
        assert set(delivered) == expected
        time.sleep(self.settle)  # what a crash left in the counts settles; a dequeue recounts it
        assert self.queue.dequeue(timeout=0) is None
        self.clock.advance(2)
        self.queue.maintenance.update_browse_start()
        assert self.queue.size() == 0 and list(self.queue.browse()) == []
        assert self.queue.backends.delayed.all(QUEUE) == []
        assert self.queue.maintenance.content_start() == self.queue.maintenance.browse_start()


@pytest.fixture(params=["grouped", "ungrouped"])
def crash(request, backend, clock, settling) -> Crash:
    # Grouped only where the deployment can group writes; elsewhere both params commit every write alone
    # (as a store without transactions).
    grouped = request.param == "grouped" and backend.groups_writes
    runtime = backend.open(
        clock, group_writes=grouped, slice_window="1s", clock_skew_grace="0s", update_browse_start_pace=10**9
    )
    return Crash(runtime.queue(QUEUE), clock, grouped, settling)


# One scenario per point (some points have two); each ends with the queue settled.


def enqueue_dies(point: str, delay: int | None) -> Callable[[Crash, object], None]:
    def scenario(c: Crash, backend) -> None:
        c.enqueue("before")
        c.queue.backends.faults.arm(point)
        with pytest.raises(InjectedFault):
            c.queue.enqueue(make_mail("faulted", body=b"half\r\n"), delay=delay)
        # Not accepted: never delivered while it is half-written.
        assert c.drain() == ["before"]
        names = [item.name for item in c.queue.browse()]
        if c.grouped or point == ENQUEUE_AFTER_REFERENCES:
            assert names == [] and c.queue.size() == 0
            delivered = c.heal()
            assert delivered == []
        else:
            # A view row without a message: browse shows it, republish sends it whole.
            assert names == ["faulted"]
            c.accepted["faulted"] = make_mail("faulted", body=b"half\r\n").message
            assert c.heal() == ["faulted"]
        c.enqueue("again", delay=delay)  # the rerun completes
        delivered = c.heal()
        c.settled(delivered, {"again"})

    return scenario


def done_dies(point: str) -> Callable[[Crash, object], None]:
    def scenario(c: Crash, backend) -> None:
        enqueue_id = c.enqueue("a")
        item = c.take("a")
        c.crash(point, item.done)
        if c.grouped:
            assert c.queue.size() == 1  # rolled back: still leased, delivered again after the lease
            c.settled(c.heal(), {"a"})
        else:
            assert c.queue.size() == 0 and list(c.queue.browse()) == []
            # The broker message is still there: the next consumer acks it as not live.
            c.clock.advance(LEASE + 1)
            assert c.queue.dequeue(timeout=0) is None
            assert backend.broker_messages() == 0
            assert bool(c.references(enqueue_id)) == (point == DONE_AFTER_MARK)
            c.settled([], set())
        assert c.references(enqueue_id) == []

    return scenario


def done_dies_before_its_count(c: Crash, backend) -> None:
    """The gap the consumers' SIGKILLs found: a done() dies between its deletion mark and its count. The
    embedded store's transaction takes both back; on Cassandra the mark stays and the count still
    counts the mail, until the queue's own recount corrects it once it settled."""
    enqueue_id = c.enqueue("a")
    item = c.take("a")
    c.crash(DONE_AFTER_DELETION_MARK, item.done)
    if backend.name == "embedded":
        assert c.queue.size() == 1 and [i.enqueue_id for i in c.queue.browse()] == [enqueue_id]
        c.settled(c.heal(), {"a"})
        return
    assert list(c.queue.browse()) == []
    assert (
        c.queue.backends.view.size(QUEUE, c.queue.maintenance.browse_start()) == 1
    )  # the crash's leftover count
    c.clock.advance(LEASE + 1)
    time.sleep(c.settle)
    # The broker's message is acked as not live; the consumer recounts the slice.
    assert c.queue.dequeue(timeout=0) is None
    assert backend.broker_messages() == 0
    assert c.queue.backends.view.size(QUEUE, c.queue.maintenance.browse_start()) == 0 and c.queue.size() == 0
    assert c.queue.overviews.recount() == 0  # nothing left to correct
    c.settled([], set())


def retry_dies(point: str) -> Callable[[Crash, object], None]:
    def scenario(c: Crash, backend) -> None:
        c.enqueue("a")
        item = c.take("a")
        c.crash(point, lambda: item.retry(delay=10))
        assert c.queue.size() == 1
        # Delivered again, whether from the lease, the delayed row or both (at-least-once), and the
        # rerun of the retry works.
        delivered = []
        c.clock.advance(LEASE + 1)
        again = c.queue.dequeue(timeout=0)
        assert again is not None and again.mail.message == c.accepted["a"]
        again.retry(delay=10)
        c.clock.advance(10)
        delivered += c.drain()
        delivered += c.heal()
        assert delivered.count("a") >= 1
        c.settled(delivered, {"a"})

    return scenario


def reject_dies(point: str) -> Callable[[Crash, object], None]:
    def scenario(c: Crash, backend) -> None:
        enqueue_id = c.enqueue("poison")
        item = c.take("poison")
        c.crash(point, lambda: item.reject("550 no such user"))
        c.clock.advance(LEASE + 1)
        redelivered = c.queue.dequeue(timeout=0)
        if c.grouped or point == REJECT_AFTER_DEAD_LETTER:
            # Still live: delivered again, and rejected again (the rerun).
            assert redelivered is not None and redelivered.mail.message == c.accepted["poison"]
            redelivered.reject("550 no such user")
        else:
            assert redelivered is None  # marked deleted: its message is acked as not live
        (letter,) = c.queue.dead_letters.list()
        assert letter.enqueue_id == enqueue_id
        assert c.queue.dead_letters.get(enqueue_id).mail.message == c.accepted["poison"]
        c.settled(c.heal(), set())
        assert len(c.references(enqueue_id)) == 2, "a dead letter keeps its content"

    return scenario


def remove_dies(point: str) -> Callable[[Crash, object], None]:
    def scenario(c: Crash, backend) -> None:
        removed = c.enqueue("removed", delay=60)
        c.enqueue("kept")
        c.crash(point, lambda: c.queue.remove(name="removed"))
        assert c.queue.remove(name="removed") == (1 if c.grouped else 0)  # the rerun finds the rest
        assert [item.name for item in c.queue.browse()] == ["kept"]
        c.settled(c.heal(), {"kept"})
        assert c.references(removed) == []

    return scenario


def publish_dies(flushing: bool) -> Callable[[Crash, object], None]:
    def scenario(c: Crash, backend) -> None:
        c.enqueue("later", delay=5)
        c.clock.advance(5)
        c.crash(PUBLISH_DUE_AFTER_PUBLISH, c.queue.flush if flushing else c.queue.publisher.publish_due)
        # The rerun publishes it: again when the crash left the delayed row (ungrouped), and the second
        # copy is delivered once, the deletion mark absorbing the other.
        assert c.queue.publisher.publish_due() == 1
        assert backend.broker_messages() == (1 if c.grouped else 2)
        assert c.drain() == ["later"]
        assert backend.broker_messages() == 0
        c.settled(["later"], {"later"})

    return scenario


def flush_dies(c: Crash, backend) -> None:
    c.enqueue("later", delay=3600)
    c.crash(FLUSH_AFTER_DELAYED_ROWS, c.queue.flush)
    # Deliverable (each hand-over is written on its own); browse shows the former next delivery until
    # the rerun of the flush.
    now = to_datetime(c.clock())
    (item,) = c.queue.browse()
    assert item.next_delivery > now
    assert c.queue.flush() == 0
    (item,) = c.queue.browse()
    assert item.next_delivery <= now
    c.settled(c.drain(), {"later"})


def clean_dies(point: str) -> Callable[[Crash, object], None]:
    def scenario(c: Crash, backend) -> None:
        gone = c.enqueue("gone")
        c.take("gone").done()
        c.clock.advance(1)
        c.enqueue("live")
        c.clock.advance(1)
        c.crash(point, c.queue.maintenance.update_browse_start)
        assert c.queue.maintenance.content_start() < c.queue.maintenance.browse_start() or c.grouped
        c.queue.maintenance.update_browse_start()  # the rerun
        assert c.queue.maintenance.content_start() == c.queue.maintenance.browse_start()
        assert c.references(gone) == []
        c.settled(c.drain(), {"live"})

    return scenario


def requeue_dies(point: str) -> Callable[[Crash, object], None]:
    def scenario(c: Crash, backend) -> None:
        old = c.enqueue("poison")
        c.take("poison").reject("550 no such user")
        c.crash(point, lambda: c.queue.dead_letters.requeue(old))
        # Requeued before the fault: it is in the queue, and (after the enqueue) still a dead letter.
        assert [item.name for item in c.queue.browse()] == ["poison"]
        letters = [letter.enqueue_id for letter in c.queue.dead_letters.list()]
        if point == REQUEUE_AFTER_ENQUEUE:
            assert letters == [old]
            assert len(c.queue.dead_letters.requeue(old)) == 1  # the rerun: a second copy
        else:
            assert letters == []
        delivered = c.heal()
        assert set(delivered) == {"poison"}
        c.settled(delivered, {"poison"})
        assert c.queue.dead_letters.list() == []
        assert c.references(old) == []  # released with its slice

    return scenario


def purge_dies(c: Crash, backend) -> None:
    old = c.enqueue("poison")
    c.take("poison").reject("550 no such user")
    c.crash(PURGE_AFTER_REMOVE, lambda: c.queue.dead_letters.purge(old))
    if c.grouped:
        assert c.queue.dead_letters.purge(old) == 1  # the rerun
    assert c.queue.dead_letters.list() == []
    c.settled(c.heal(), set())
    assert c.references(old) == []  # released by the clean-up when the purge did not


def park_dies(c: Crash, backend) -> None:
    held = c.enqueue("held")
    assert c.queue.holds.hold(held) == 1
    c.crash(PARK_AFTER_PAYLOAD, lambda: c.queue.dequeue(timeout=0))
    # Its broker message comes back once the lease expires, and is parked again, not delivered.
    assert c.heal() == []
    assert [item.enqueue_id for item in c.queue.holds.list()] == [held]
    assert c.queue.holds.release(held) == 1
    assert c.drain() == ["held"]
    c.settled(["held"], {"held"})


def release_dies(c: Crash, backend) -> None:
    held = c.enqueue("held")
    c.enqueue("free")
    assert c.queue.holds.hold(held) == 1
    assert c.drain() == ["free"]  # the held one is parked
    c.crash(RELEASE_AFTER_DELAYED_ROW, lambda: c.queue.holds.release(held))
    # Still held: its payload, published, is parked again; the rerun of the release delivers it.
    assert c.queue.overviews.overview().held == 1
    assert c.drain() == []
    assert c.queue.holds.release(held) == 1
    assert c.drain() == ["held"]
    c.settled(["free", "held"], {"free", "held"})


SCENARIOS: dict[str, dict[str, Callable[[Crash, object], None]]] = {
    ENQUEUE_AFTER_REFERENCES: {
        "now": enqueue_dies(ENQUEUE_AFTER_REFERENCES, None),
        "delayed": enqueue_dies(ENQUEUE_AFTER_REFERENCES, 30),
    },
    ENQUEUE_AFTER_VIEW_ROW: {
        "now": enqueue_dies(ENQUEUE_AFTER_VIEW_ROW, None),
        "delayed": enqueue_dies(ENQUEUE_AFTER_VIEW_ROW, 30),
    },
    DONE_AFTER_DELETION_MARK: {"done": done_dies_before_its_count},
    DONE_AFTER_MARK: {"done": done_dies(DONE_AFTER_MARK)},
    DONE_AFTER_RELEASE: {"done": done_dies(DONE_AFTER_RELEASE)},
    RETRY_AFTER_DELAYED_ROW: {"retry": retry_dies(RETRY_AFTER_DELAYED_ROW)},
    RETRY_AFTER_ACK: {"retry": retry_dies(RETRY_AFTER_ACK)},
    REJECT_AFTER_DEAD_LETTER: {"reject": reject_dies(REJECT_AFTER_DEAD_LETTER)},
    REJECT_AFTER_MARK: {"reject": reject_dies(REJECT_AFTER_MARK)},
    REMOVE_AFTER_MARK: {"remove": remove_dies(REMOVE_AFTER_MARK)},
    REMOVE_AFTER_RELEASE: {"remove": remove_dies(REMOVE_AFTER_RELEASE)},
    PUBLISH_DUE_AFTER_PUBLISH: {"publish_due": publish_dies(False), "flush": publish_dies(True)},
    FLUSH_AFTER_DELAYED_ROWS: {"flush": flush_dies},
    CLEAN_AFTER_BROWSE_START: {"update": clean_dies(CLEAN_AFTER_BROWSE_START)},
    CLEAN_AFTER_RELEASE: {"update": clean_dies(CLEAN_AFTER_RELEASE)},
    CLEAN_AFTER_DELETE: {"update": clean_dies(CLEAN_AFTER_DELETE)},
    REQUEUE_AFTER_ENQUEUE: {"requeue": requeue_dies(REQUEUE_AFTER_ENQUEUE)},
    REQUEUE_AFTER_REMOVE: {"requeue": requeue_dies(REQUEUE_AFTER_REMOVE)},
    PURGE_AFTER_REMOVE: {"purge": purge_dies},
    PARK_AFTER_PAYLOAD: {"dequeue": park_dies},
    RELEASE_AFTER_DELAYED_ROW: {"release": release_dies},
}
CASES = [(point, name) for point, scenarios in SCENARIOS.items() for name in scenarios]


def test_every_queue_fault_point_has_a_scenario():
    assert set(SCENARIOS) == set(QUEUE_POINTS)


@pytest.mark.parametrize(("point", "scenario"), CASES, ids=[f"{p}-{s}" for p, s in CASES])
def test_a_crash_after_each_write_loses_nothing_and_heals(backend, crash, point, scenario):
    SCENARIOS[point][scenario](crash, backend)
