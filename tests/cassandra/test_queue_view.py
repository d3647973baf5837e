"""Records 31 and 32: the Cassandra queue view answers every call as the embedded one does, across slices
and buckets, deletions, browse_start and content_start, the clean-up and the configuration events."""

from __future__ import annotations

import time

import pytest

from mailq_runtime.model import EnqueueId
from mailq_runtime.stores.cassandra import slice_counts
from mailq_runtime.stores.records import EnqueuedMail

from .conftest import Tables, cassandra_tables, same_on_both

HOUR = 3600 * 1_000_000
T0 = 1_700_002_800 * 1_000_000  # a whole hour


def mail(queue: str, slice_start: int, bucket: int, n: int, at: int, sender: str | None = "a@example.com"):
    return EnqueuedMail(
        queue,
        slice_start,
        bucket,
        EnqueueId(f"{at:016x}{n:016x}"),
        at,
        at,
        5,
        f"mail-{n}",
        sender,
        '["rcpt@example.org"]',
        f"g1_{n:064x}",
        f"g1_{n + 100:064x}",
        '{"state": "root"}',
    )


def ids(mails: list[EnqueuedMail]) -> list[str]:
    return [m.enqueue_id for m in mails]


@pytest.fixture
def short_epochs(monkeypatch: pytest.MonkeyPatch) -> float:
    """Epochs settled within a fraction of a second, so a recount folds what was just counted: the
    seconds to wait before it does."""
    monkeypatch.setattr(slice_counts, "EPOCH", 0.1)
    monkeypatch.setattr(slice_counts, "SETTLE", 0.2)
    return 0.4


def test_queue_view_answers_as_the_embedded_one(both):
    m1 = mail("spool", T0, 0, 1, T0 + 30_000_000)
    m2 = mail("spool", T0, 1, 2, T0 + 10_000_000, sender=None)
    m3 = mail("spool", T0 + HOUR, 0, 3, T0 + HOUR + 5)
    m4 = mail("spool", T0 + 2 * HOUR, 1, 4, T0 + 2 * HOUR + 9)
    m5 = mail("spool", T0 + 2 * HOUR, 0, 5, T0 + 2 * HOUR + 7)
    other = mail("other", T0, 0, 6, T0 + 1)
    late = mail("spool", T0 + HOUR, 0, 7, T0 + HOUR + 8)
    slices = (T0, T0 + HOUR, T0 + 2 * HOUR, T0 + 3 * HOUR)

    def scenario(t: Tables) -> dict:
        v = t.view
        seen: dict = {}
        v.create_queue("spool", T0, T0)
        v.create_queue("spool", T0 + HOUR, T0 + 5)  # exists already: its starts stay
        v.create_queue("other", T0, T0)
        seen["queues"] = [v.queue_names(), v.queue_exists("spool"), v.queue_exists("nope")]
        seen["starts"] = [v.browse_start("spool"), v.content_start("spool")]
        for m in (m1, m2, m3, m4, m5, other):
            v.insert(m)
        seen["slices"] = [v.slices_from("spool", T0), v.slices_from("spool", T0 + HOUR)]
        seen["sizes"] = [v.size("spool", T0), v.size("spool", T0 + 2 * HOUR), v.size("other", T0)]
        seen["live"] = [ids(v.live_mails("spool", s)) for s in slices]
        seen["row read back"] = v.live_mails("spool", T0)[0] == m2
        seen["marked"] = [v.mark_deleted("spool", m2.enqueue_id, T0, 1) for _ in range(2)]
        seen["after mark"] = [
            v.size("spool", T0),
            v.is_live(m2),
            v.is_live(m1),
            ids(v.live_mails("spool", T0)),
        ]
        v.reschedule([m1, m3], T0 + 9 * HOUR)
        seen["rescheduled"] = [(m.enqueue_id, m.next_delivery) for m in v.live_mails("spool", T0)]
        seen["advanced"] = [
            v.advance_browse_start("spool", T0 + 2 * HOUR),
            v.advance_browse_start("spool", T0 + HOUR),
            v.browse_start("spool"),
            v.size("spool", v.browse_start("spool")),
        ]
        # Behind browse_start: a row still there and unmarked is live.
        seen["live behind"] = [v.is_live(m1), v.is_live(m2), v.is_live(m3)]
        seen["before"] = [v.mails_before("spool", T0, T0 + 2 * HOUR), v.mails_before("spool", T0, T0 + HOUR)]
        v.mark_deleted("spool", m1.enqueue_id, T0, 0)
        seen["deleted slices"] = [v.delete_slices("spool", T0, T0 + 2 * HOUR) for _ in range(2)]
        v.advance_content_start("spool", T0 + 2 * HOUR)
        v.advance_content_start("spool", T0)  # never backwards
        seen["cleaned"] = [
            v.content_start("spool"),
            v.slices_from("spool", T0),
            v.size("spool", T0),
            v.mails_before("spool", T0, T0 + 3 * HOUR),
            v.is_live(m1),
            v.is_live(m3),
        ]
        # A reschedule landing after the clean-up shows nowhere.
        v.reschedule([m3], T0 + 10 * HOUR)
        seen["late reschedule"] = [
            v.is_live(m3),
            v.mails_before("spool", T0, T0 + 2 * HOUR),
            v.live_mails("spool", T0 + HOUR),
        ]
        # A lagging writer's row behind browse_start is live while there and unmarked.
        v.insert(late)
        seen["late row"] = [v.is_live(late), v.slices_from("spool", v.browse_start("spool"))]
        seen["other"] = [ids(v.live_mails("other", T0)), v.browse_start("other"), v.size("other", T0)]
        return seen

    seen = same_on_both(both, scenario)
    assert seen["queues"] == [["other", "spool"], True, False]
    assert seen["starts"] == [T0, T0]
    assert seen["slices"] == [[T0, T0 + HOUR, T0 + 2 * HOUR], [T0 + HOUR, T0 + 2 * HOUR]]
    assert seen["sizes"] == [5, 2, 1]
    assert seen["live"] == [ids([m2, m1]), ids([m3]), ids([m5, m4]), []]
    assert seen["row read back"] is True
    assert seen["marked"] == [True, False]
    assert seen["after mark"] == [4, False, True, ids([m1])]
    assert seen["rescheduled"] == [(m1.enqueue_id, T0 + 9 * HOUR)]
    assert seen["advanced"] == [True, False, T0 + 2 * HOUR, 2]
    assert seen["live behind"] == [True, False, True]
    assert seen["before"] == [ids([m1, m2, m3]), ids([m1, m2])]
    assert seen["deleted slices"] == [3, 0]
    assert seen["cleaned"] == [T0 + 2 * HOUR, [T0 + 2 * HOUR], 2, ids([m5, m4]), False, False]
    assert seen["late reschedule"] == [False, [], []]
    assert seen["late row"] == [True, [T0 + 2 * HOUR]]
    assert seen["other"] == [ids([other]), T0, 1]


def test_configuration_events_append_only_at_the_position_read(both):
    def scenario(t: Tables) -> list:
        v = t.configuration
        return [
            v.events("view"),
            v.append_event("view", '{"n": 1}', T0, 0),
            v.append_event("view", '{"n": "lost"}', T0 + 1, 0),
            v.append_event("view", '{"n": 2}', T0 + 2, 1),
            v.append_event("view", '{"n": "lost"}', T0 + 3, 1),
            v.events("view"),
            v.events("another"),
        ]

    assert same_on_both(both, scenario) == [[], True, False, True, False, ['{"n": 1}', '{"n": 2}'], []]


def _no_fault() -> None:
    """Nothing between a done()'s mark and its count."""


def test_a_mail_done_twice_is_counted_once_after_a_recount(both, short_epochs):
    """Without a transaction, two done() of one mail (its lease expired while its first consumer still
    worked) both count it on Cassandra; the recount, once their epoch settled, takes the second count
    back. The embedded store counts it once, and its recount finds nothing to correct."""
    m1, m2 = mail("spool", T0, 0, 1, T0 + 1), mail("spool", T0, 1, 2, T0 + 2)

    def scenario(t: Tables) -> list:
        v = t.view
        v.create_queue("spool", T0, T0)
        v.insert(m1)
        v.insert(m2)
        for _ in range(2):
            v.mark_done("spool", m1.enqueue_id, T0, 0, _no_fault)
        counted = v.size("spool", T0)
        time.sleep(short_epochs)
        corrected = v.recount("spool", T0)
        return [
            counted,
            corrected,
            v.size("spool", T0),
            v.recount("spool", T0),
            ids(v.live_mails("spool", T0)),
        ]

    embedded, cassandra = both
    assert scenario(embedded) == [1, 0, 1, 0, ids([m2])]
    assert scenario(cassandra) == [0, 1, 1, 0, ids([m2])]


def test_a_recount_counts_a_mark_whose_count_was_lost_and_an_insert_without_its_row(cassandra, short_epochs):
    """The crash's leftovers on Cassandra: a done() that died between its mark and its count, and an
    insert that died between its count and its row; the recount corrects both once their epoch settled,
    and leaves alone what was counted since."""
    view = cassandra_tables(cassandra).view
    m1, m2, lost, late = (
        mail("spool", T0, 0, 1, T0 + 1),
        mail("spool", T0, 0, 2, T0 + 2),
        mail("spool", T0, 0, 3, 3),
        mail("spool", T0, 0, 4, T0 + 4),
    )
    view.create_queue("spool", T0, T0)
    view.insert(m1)
    view.insert(m2)

    def crash() -> None:
        raise RuntimeError("killed")

    try:
        view.mark_done("spool", m1.enqueue_id, T0, 0, crash)
    except RuntimeError:
        pass
    counts = view.slice_counters
    counts.count([counts.counting("spool", T0, lost.bucket, slice_counts.now_micros(), enqueued=1)])
    assert view.size("spool", T0) == 3 and ids(view.live_mails("spool", T0)) == ids([m2])
    time.sleep(short_epochs)
    # An insert under way in an epoch not settled yet (a minute ahead, however slow the machine): the
    # recount leaves its count alone, without its row.
    later = slice_counts.now_micros() + 60_000_000
    counts.count([counts.counting("spool", T0, late.bucket, later, enqueued=1)])
    assert view.recount("spool", T0) == 2
    assert view.size("spool", T0) == 2 and view.recount("spool", T0) == 0
    view.enqueued_mails.insert(late, later)
    assert view.size("spool", T0) == 2 and ids(view.live_mails("spool", T0)) == ids([m2, late])


def test_is_live_with_the_current_slice_answers_as_without(both):
    """A mail from the current slice on is live by its mark alone; one behind it still gets the full
    check, browse_start and its row, whatever the current slice."""
    behind, m1 = mail("spool", T0, 0, 1, T0 + 1), mail("spool", T0 + HOUR, 0, 2, T0 + HOUR + 1)
    m2 = mail("spool", T0 + HOUR, 0, 3, T0 + HOUR + 2)

    def scenario(t: Tables) -> list:
        v = t.view
        v.create_queue("spool", T0, T0)
        for m in (behind, m1, m2):
            v.insert(m)
        v.mark_done("spool", m2.enqueue_id, T0 + HOUR, 0, _no_fault)
        v.mark_deleted("spool", behind.enqueue_id, T0, 0)
        v.advance_browse_start("spool", T0 + HOUR)
        v.delete_slices("spool", T0, T0 + HOUR)  # the clean-up: the mark goes with the row
        return [[v.is_live(m, T0 + HOUR), v.is_live(m)] for m in (behind, m1, m2)]

    assert same_on_both(both, scenario) == [[False, False], [True, True], [False, False]]
