"""Record 31's browse_start and record 32's content clean-up, on a fake clock with 1 s slices."""

from __future__ import annotations

import random

import pytest

from mailq_runtime.clock import MICROS_PER_SECOND
from mailq_runtime.model import NORMAL_PRIORITY

from .conftest import QUEUE
from .helpers import make_mail

SECOND = MICROS_PER_SECOND


def starts(queue) -> tuple[int, int]:
    return queue.maintenance.browse_start(), queue.maintenance.content_start()


def references(runtime, owner: str) -> int:
    return len(runtime.blobs.references_of(owner))


def take(queue):
    item = queue.dequeue(timeout=0)
    assert item is not None
    return item


def created(queue) -> None:
    """The queue exists, created by a first mail now delivered: its starts are the current slice."""
    queue.enqueue(make_mail("first"))
    take(queue).done()


def test_a_new_queue_starts_browsing_and_holding_content_at_its_first_enqueue_slice(clocked, clock):
    t0 = clock()
    clock.advance(2.5)
    clocked.enqueue(make_mail("first"))
    assert starts(clocked) == (t0 + 2 * SECOND, t0 + 2 * SECOND)


def test_browse_start_moves_to_the_first_live_slice_and_the_content_behind_it_goes(backend, clocked, clock):
    t0 = clock()
    clocked.enqueue(make_mail("a"))
    clock.advance(1.5)
    clocked.enqueue(make_mail("b"))
    clock.advance(1)
    clocked.enqueue(make_mail("c"))
    clock.advance(3)  # t0 + 5.5 s
    assert clocked.maintenance.update_browse_start() == t0  # a is live
    take(clocked).done()
    assert backend.queue_rows(QUEUE).deletion_marks == 1
    assert clocked.maintenance.update_browse_start() == t0 + SECOND
    assert starts(clocked) == (t0 + SECOND, t0 + SECOND)
    assert backend.queue_rows(QUEUE).rows(slices_before=t0 + SECOND) == 0
    assert backend.queue_rows(QUEUE).deletion_marks == 0
    assert [item.name for item in clocked.browse()] == ["b", "c"]
    assert clocked.size() == 2
    take(clocked).done()
    take(clocked).done()
    # Nothing live: as far as the current slice allows.
    assert clocked.maintenance.update_browse_start() == t0 + 5 * SECOND
    assert starts(clocked) == (t0 + 5 * SECOND, t0 + 5 * SECOND)
    rows = backend.queue_rows(QUEUE)
    assert (rows.rows(), rows.deletion_marks, rows.counted_slices) == (0, 0, [])
    assert list(clocked.browse()) == [] and clocked.size() == 0
    clocked.enqueue(make_mail("d"))
    assert [item.name for item in clocked.browse()] == ["d"]


def test_browse_start_never_passes_the_current_slice_minus_the_clock_skew_grace(backend, clock):
    queue = backend.open(
        clock, slice_window="1s", clock_skew_grace="3s", update_browse_start_pace=10**9
    ).queue(QUEUE)
    t0 = clock()
    created(queue)
    clock.advance(10.5)
    assert queue.maintenance.update_browse_start() == t0 + 7 * SECOND
    clock.advance(0.4)
    assert queue.maintenance.update_browse_start() == t0 + 7 * SECOND
    queue.enqueue(make_mail("late"))  # at t0 + 10.9 s
    clock.advance(100)
    assert queue.maintenance.update_browse_start() == t0 + 10 * SECOND
    assert [item.name for item in queue.browse()] == ["late"]


def test_browse_start_never_moves_back(clocked, clock):
    t0 = clock()
    created(clocked)
    clock.advance(5)
    assert clocked.maintenance.update_browse_start() == t0 + 5 * SECOND
    assert clocked.maintenance.update_browse_start() == t0 + 5 * SECOND


def test_clean_up_releases_what_a_delete_left_referenced_and_spares_other_queues(
    backend, clocked_runtime, clocked, clock
):
    t0 = clock()
    other = clocked_runtime.queue("other")
    other.enqueue(make_mail("o", body=b"other"))
    other.dequeue(timeout=0).done()
    enqueue_id = clocked.enqueue(make_mail("x", body=b"x content"))
    # A delete that stopped after marking the mail (a non-transactional store can do that): record 32's
    # clean-up is what releases its content.
    assert clocked.backends.view.mark_deleted(QUEUE, enqueue_id, t0, 0)
    assert references(clocked_runtime, enqueue_id) == 2
    deletions = len(backend.blob_state().deletions)
    clock.advance(2)
    clocked.maintenance.update_browse_start()
    assert references(clocked_runtime, enqueue_id) == 0
    assert len(backend.blob_state().deletions) == deletions + 2
    assert backend.queue_rows("other").rows() == 1
    assert backend.queue_rows("other").deletion_marks == 1
    assert starts(other) == (t0, t0)


def test_a_removed_mail_is_not_delivered_after_its_slice_is_cleaned(backend, clocked, clock):
    clocked.enqueue(make_mail("removed"))
    assert clocked.remove(name="removed") == 1  # its broker message stays, as with RabbitMQ
    clock.advance(2)
    clocked.maintenance.update_browse_start()
    assert backend.queue_rows(QUEUE).deletion_marks == 0  # the clean-up dropped the mark with the slice
    assert backend.broker_messages() == 1
    assert clocked.dequeue(timeout=0.2) is None
    assert backend.broker_messages() == 0
    assert backend.queue_rows(QUEUE).deletion_marks == 0
    assert clocked.size() == 0


def test_a_mail_enqueued_into_an_already_cleaned_slice_is_still_delivered(backend, clocked, clock):
    """A writer whose clock lags (or whose commit was slow) can land behind browse_start: browse no longer
    shows the mail, but the broker message must still deliver it (at-least-once), not drop it."""
    t0 = clock()
    created(clocked)
    clock.advance(3)
    clocked.maintenance.update_browse_start()
    clock.now = t0 + 1  # the lagging writer
    clocked.enqueue(make_mail("late"))
    clock.advance(3)
    assert clocked.dequeue(timeout=0).mail.name == "late"


def test_a_failed_clean_up_leaves_content_start_behind_and_the_next_update_redoes_it(
    backend, clocked_runtime, clocked, clock, monkeypatch
):
    t0 = clock()
    enqueue_id = clocked.enqueue(make_mail("a"))
    clocked.backends.view.mark_deleted(QUEUE, enqueue_id, t0, 0)
    clock.advance(2)
    release = clocked.backends.blobs.release
    failures = []

    def release_failing_once(*args, **kwargs):
        if not failures:
            failures.append(args)
            raise OSError("blob store unavailable")
        return release(*args, **kwargs)

    monkeypatch.setattr(clocked.backends.blobs, "release", release_failing_once)
    with pytest.raises(OSError, match="unavailable"):
        clocked.maintenance.update_browse_start()
    assert starts(clocked) == (t0 + 2 * SECOND, t0)
    assert backend.queue_rows(QUEUE).rows(slices_before=t0 + 2 * SECOND) == 1
    assert references(clocked_runtime, enqueue_id) == 2
    assert list(clocked.browse()) == [] and clocked.size() == 0
    clocked.maintenance.update_browse_start()
    assert starts(clocked) == (t0 + 2 * SECOND, t0 + 2 * SECOND)
    assert backend.queue_rows(QUEUE).rows(slices_before=t0 + 2 * SECOND) == 0
    assert references(clocked_runtime, enqueue_id) == 0
    assert backend.queue_rows(QUEUE).deletion_marks == 0


def test_browse_start_advances_on_its_own_with_pace_one(backend, clock):
    queue = backend.open(clock, slice_window="1s", clock_skew_grace="0s", update_browse_start_pace=1).queue(
        QUEUE
    )
    t0 = clock()
    queue.enqueue(make_mail("a"))
    clock.advance(1.5)
    queue.enqueue(make_mail("b", sender="b@example.com"))
    clock.advance(2)  # t0 + 3.5 s
    take(queue).done()
    assert starts(queue) == (t0 + SECOND, t0 + SECOND)
    queue.remove(sender="b@example.com")
    assert starts(queue) == (t0 + 3 * SECOND, t0 + 3 * SECOND)
    assert backend.queue_rows(QUEUE).rows() == 0


def test_a_failed_clean_up_does_not_fail_the_dequeue_that_triggered_it(backend, clock, monkeypatch):
    """The update is piggy-backed on dequeue (record 31): its failure is retried by the next one, and
    must not make a delivered mail look undelivered."""
    queue = backend.open(clock, slice_window="1s", clock_skew_grace="0s", update_browse_start_pace=1).queue(
        QUEUE
    )
    t0 = clock()
    queue.enqueue(make_mail("a"))
    clock.advance(2)
    queue.enqueue(make_mail("b"))
    clock.advance(2)  # t0 + 4 s
    delete_slices = queue.backends.view.delete_slices
    calls = []

    def delete_slices_failing_once(*args):
        calls.append(args)
        if len(calls) == 1:
            raise OSError("store unavailable")
        return delete_slices(*args)

    monkeypatch.setattr(queue.backends.view, "delete_slices", delete_slices_failing_once)
    take(queue).done()
    assert calls, "the clean-up ran"
    assert starts(queue) == (t0 + 2 * SECOND, t0)
    assert [item.name for item in queue.browse()] == ["b"]
    take(queue).done()
    assert starts(queue) == (t0 + 4 * SECOND, t0 + 4 * SECOND)
    assert backend.queue_rows(QUEUE).rows() == 0


def test_dead_letters_keep_their_content_through_the_clean_up(backend, clocked_runtime, clocked, clock):
    enqueue_id = clocked.enqueue(make_mail("poison"))
    take(clocked).reject("bad")
    clock.advance(2)
    clocked.maintenance.update_browse_start()
    assert backend.queue_rows(QUEUE).rows() == 0
    (letter,) = clocked.dead_letters.list()
    assert letter.enqueue_id == enqueue_id
    assert references(clocked_runtime, enqueue_id) == 2


def test_browse_spans_slices(clocked, clock):
    for name, step in (("a", 0), ("b", 1.5), ("c", 0.2), ("d", 3.7)):
        clock.advance(step)
        clocked.enqueue(make_mail(name))
    assert [item.name for item in clocked.browse()] == ["a", "b", "c", "d"]
    assert clocked.size() == 4


NAMES = [f"n{i}" for i in range(8)]
SENDERS = [f"s{i}@example.com" for i in range(3)] + [None]
RECIPIENTS = [f"r{i}@example.com" for i in range(5)]


@pytest.mark.parametrize("seed", [31, 32, 3132])
def test_size_matches_browse_after_random_operations(backend, clock, seed):
    """A model of the queue checked after each of several hundred random operations: browse is the live
    mails in enqueue order, size is their count, dequeue hands out the deliverable one that ranks first."""
    queue = backend.open(
        clock, slice_window="1s", clock_skew_grace="0s", update_browse_start_pace=7, bucket_count=3
    ).queue(QUEUE)
    queue.maintenance.random.seed(seed)  # the pace's draws too, so that a failing seed replays exactly
    chance = random.Random(seed)
    live: dict[str, dict] = {}  # enqueue id -> what the model knows of the mail
    sequence = 0
    operations = ["enqueue", "delayed", "done", "retry", "retry-later", "remove", "clear", "flush", "update"]
    weights = [30, 10, 20, 6, 4, 8, 1, 3, 5]
    for step in range(backend.model_steps):
        clock.advance(chance.choice([0.000001, 0.01, 0.2, 0.45, 1.3]))
        now = clock()
        operation = chance.choices(operations, weights)[0]
        if operation in ("enqueue", "delayed"):
            recipients = tuple(chance.sample(RECIPIENTS, chance.choice([1, 2])))
            mail = make_mail(chance.choice(NAMES), sender=chance.choice(SENDERS), recipients=recipients)
            priority = chance.choice([None, 1, 5, 9])
            delay = chance.choice([0.5, 2, 5]) if operation == "delayed" else None
            enqueue_id = queue.enqueue(mail, delay=delay, priority=priority)
            sequence += 1
            live[enqueue_id] = {
                "mail": mail,
                "seq": sequence,
                "priority": NORMAL_PRIORITY if priority is None else priority,
                "at": now + round((delay or 0) * MICROS_PER_SECOND),
                "enqueued": now,
            }
        elif operation in ("done", "retry", "retry-later"):
            ready = [e for e, m in live.items() if m["at"] <= now]
            item = queue.dequeue(timeout=0)
            if not ready:
                assert (
                    item is None
                ), f"step {step}: dequeued {item and item.mail.name} with nothing deliverable"
                continue
            expected = min(ready, key=lambda e: (-live[e]["priority"], live[e]["seq"]))
            assert item is not None and item.enqueue_id == expected, f"step {step}"
            assert item.mail == live[expected]["mail"]
            if operation == "done":
                item.done()
                del live[expected]
            elif operation == "retry":
                item.retry()
            else:
                item.retry(delay=3)
                live[expected]["at"] = now + 3 * MICROS_PER_SECOND
        elif operation == "remove":
            kind = chance.choice(["name", "sender", "recipient"])
            value = chance.choice({"name": NAMES, "sender": SENDERS[:-1], "recipient": RECIPIENTS}[kind])
            matching = [
                e
                for e, m in live.items()
                if (kind == "name" and m["mail"].name == value)
                or (kind == "sender" and m["mail"].sender == value)
                or (kind == "recipient" and value in m["mail"].recipients)
            ]
            assert queue.remove(**{kind: value}) == len(matching), f"step {step}"
            for enqueue_id in matching:
                del live[enqueue_id]
        elif operation == "clear":
            assert queue.clear() == len(live)
            live.clear()
        elif operation == "flush":
            queue.flush()
            for known in live.values():
                known["at"] = min(known["at"], now)
        else:
            browse_start = queue.maintenance.update_browse_start()
            first_live = min((m["enqueued"] for m in live.values()), default=None)
            if first_live is not None:
                assert browse_start <= first_live, f"step {step}: browse_start passed a live mail"
            assert browse_start <= now
            assert starts(queue) == (browse_start, browse_start)
            assert backend.queue_rows(QUEUE).rows(slices_before=browse_start) == 0
        browsed = [item.enqueue_id for item in queue.browse()]
        assert browsed == sorted(live, key=lambda e: live[e]["seq"]), f"step {step} ({operation})"
        assert queue.size() == len(browsed), f"step {step} ({operation})"
    assert queue.backends.view.browse_start(QUEUE) > clock() - 400 * SECOND, "browse_start never moved"
