"""Races between two connections to one store, as between two processes, on both stores: the lightweight
transactions of the Cassandra store keep what the embedded store's transactions keep."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import asdict

import pytest

from mailq_runtime.blobs.dedup import REFERENCE_GENERATION
from mailq_runtime.config import AGGREGATE, QueueViewConfiguration
from mailq_runtime.errors import ConfigurationRejected

from .conftest import Tables
from .test_queue_view import HOUR, T0, mail

MAILBOX = "0" * 31 + "1"


def race(contenders: list[Tables], work: Callable[[Tables, int], object]) -> list:
    """Run `work(tables, index)` in one thread per contender, released together; their results."""
    start = threading.Barrier(len(contenders))
    results: list = [None] * len(contenders)
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            start.wait(timeout=60)
            results[index] = work(contenders[index], index)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(contenders))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=240)
    assert not errors, errors
    return results


def test_two_processes_allocating_uids_get_distinct_increasing_ones(connect):
    a, b = connect(), connect()
    assert a.mailboxes.create_mailbox(MAILBOX, "alice@example.com", "INBOX")
    taken = race([a, b], lambda tables, _: [tables.mailboxes.allocate_uid(MAILBOX) for _ in range(20)])
    for uids in taken:
        assert uids == sorted(uids) and len(set(uids)) == len(uids)
    every = taken[0] + taken[1]
    assert len(set(every)) == 40 and min(every) == 1
    assert a.mailboxes.allocate_uid(MAILBOX) > max(every)


def test_two_processes_changing_flags_read_alike_one_wins(connect):
    """The compare-and-set of the source of truth's flags: of two changes from the same flags read, one
    is applied and the other told to read again."""
    a, b = connect(), connect()
    message_id = "1" * 32
    assert a.mailboxes.create_mailbox(MAILBOX, "alice@example.com", "INBOX")
    assert a.mailboxes.add_to_source_of_truth(message_id, MAILBOX, 1, "")
    for round_ in range(5):
        read = a.mailboxes.entry(MAILBOX, 1)[1]
        wanted = [f"$Round{round_} \\Seen", f"$Round{round_} \\Flagged"]
        won = race(
            [a, b],
            lambda tables, index, read=read, wanted=wanted: tables.mailboxes.set_source_flags(
                message_id, MAILBOX, wanted[index], read
            ),
        )
        assert sorted(won) == [False, True]
        assert a.mailboxes.entry(MAILBOX, 1) == (message_id, wanted[won.index(True)])


def test_two_processes_emitting_the_same_generation_one_wins(connect):
    a, b = connect(), connect()
    for number in range(1, 6):
        won = race(
            [a, b],
            lambda tables, index, number=number: tables.blobs.emit(REFERENCE_GENERATION, number, T0 + index),
        )
        assert sorted(won) == [False, True]
    history = a.blobs.history(REFERENCE_GENERATION)
    assert [number for number, _ in history] == [1, 2, 3, 4, 5]


def test_two_processes_appending_conflicting_configuration_one_wins(connect):
    """Each change passes the rules against the history both read; together they would break them
    (3600 s -> 1800 s -> 1200 s: 1200 does not divide 1800). Only one is appended; the other, checked
    again against the winner's event, is refused."""
    a, b = connect(), connect()
    hour = QueueViewConfiguration(slice_window=3600 * 1_000_000)
    changes = [
        QueueViewConfiguration(slice_window=1800 * 1_000_000),
        QueueViewConfiguration(slice_window=1200 * 1_000_000),
    ]
    for round_ in range(3):
        aggregate = f"{AGGREGATE}-{round_}"
        assert a.configuration.append_event(aggregate, json.dumps(asdict(hour)), T0, 0)
        for change in changes:
            hour.validate_change(change)
        appended = race(
            [a, b],
            lambda tables, index, aggregate=aggregate: tables.configuration.append_event(
                aggregate, json.dumps(asdict(changes[index])), T0 + 1, 1
            ),
        )
        assert sorted(appended) == [False, True]
        history = [QueueViewConfiguration(**json.loads(event)) for event in b.configuration.events(aggregate)]
        assert history == [hour, changes[appended.index(True)]]
        with pytest.raises(ConfigurationRejected):
            history[-1].validate_change(changes[appended.index(False)])


def test_two_processes_marking_the_same_mails_count_each_once(connect):
    a, b = connect(), connect()
    a.view.create_queue("spool", T0, T0)
    mails = [mail("spool", T0, n % 2, n, T0 + n) for n in range(20)]
    for m in mails:
        a.view.insert(m)
    marked = race(
        [a, b],
        lambda tables, _: [tables.view.mark_deleted("spool", m.enqueue_id, T0, m.bucket) for m in mails],
    )
    assert [first or second for first, second in zip(*marked, strict=True)] == [True] * 20
    assert sum(marked[0]) + sum(marked[1]) == 20
    assert a.view.size("spool", T0) == 0 and b.view.live_mails("spool", T0) == []


def test_two_processes_creating_one_queue_a_slice_apart_start_it_once(connect):
    a, b = connect(), connect()
    for n in range(3):
        queue = f"queue-{n}"
        race(
            [a, b],
            lambda tables, index, queue=queue: tables.view.create_queue(queue, T0 + index * HOUR, T0 + index),
        )
        starts = {(t.view.browse_start(queue), t.view.content_start(queue)) for t in (a, b)}
        assert len(starts) == 1
        ((browse_start, content_start),) = starts
        assert browse_start == content_start and browse_start in (T0, T0 + HOUR)
