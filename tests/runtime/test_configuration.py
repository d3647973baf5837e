"""Record 31's configuration rules: sliceWindow only to a divisor, bucketCount only up, the pace freely.
A rejected change is a clear error naming the rule, and appends nothing to the event log."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from mailq_runtime import ConfigurationRejected, InvalidInput
from mailq_runtime.clock import MICROS_PER_SECOND
from mailq_runtime.config import ConfigurationStore, QueueViewConfiguration
from mailq_runtime.model import parse_duration

from .conftest import QUEUE
from .helpers import make_mail
from .mailbox_checks import agent, results

BASE = {"slice_window": "4s", "bucket_count": 2, "update_browse_start_pace": 10**9}


def history(backend) -> list[QueueViewConfiguration]:
    return backend.open().configuration.history()


def drain(queue) -> list[str]:
    received = []
    while (item := queue.dequeue(timeout=0)) is not None:
        received.append(item.mail.name)
        item.done()
        assert len(received) < 100
    return received


def test_the_first_configuration_is_recorded(backend):
    runtime = backend.open(**BASE)
    assert runtime.view_configuration == QueueViewConfiguration(4 * MICROS_PER_SECOND, 2, 10**9)
    assert history(backend) == [runtime.view_configuration]


def test_reopening_with_the_same_configuration_appends_nothing(backend):
    backend.open(**BASE)
    backend.open(**BASE)
    assert len(history(backend)) == 1


def test_slice_window_may_shrink_to_a_divisor_and_old_mails_stay_browsable(backend, clock):
    first = backend.open(clock, clock_skew_grace="0s", **BASE).queue(QUEUE)
    t0 = clock()
    first.enqueue(make_mail("old1"))
    clock.advance(5)
    first.enqueue(make_mail("old2"))  # slice t0 + 4 s
    clock.advance(1)
    second = backend.open(clock, clock_skew_grace="0s", **{**BASE, "slice_window": "2s"}).queue(QUEUE)
    assert second.configuration.slice_window == 2 * MICROS_PER_SECOND
    second.enqueue(make_mail("new"))  # t0 + 6 s, a 2 s slice
    assert [item.name for item in second.browse()] == ["old1", "old2", "new"]
    assert second.size() == 3
    clock.advance(10)
    item = second.dequeue(timeout=0)
    assert item.mail.name == "old1"
    item.done()
    assert second.maintenance.update_browse_start() == t0 + 4 * MICROS_PER_SECOND
    assert [item.name for item in second.browse()] == ["old2", "new"]
    assert drain(second) == ["old2", "new"]
    assert second.maintenance.update_browse_start() == t0 + 16 * MICROS_PER_SECOND
    assert backend.queue_rows(QUEUE).rows() == 0
    assert [c.slice_window for c in history(backend)] == [4 * MICROS_PER_SECOND, 2 * MICROS_PER_SECOND]


@pytest.mark.parametrize(
    "change, rule",
    [
        ({"slice_window": "3s"}, "sliceWindow"),
        ({"slice_window": "8s"}, "sliceWindow"),
        ({"slice_window": "1h"}, "sliceWindow"),
        ({"bucket_count": 1}, "bucketCount"),
    ],
    ids=["slice-non-divisor", "slice-increase", "slice-default", "bucket-shrink"],
)
def test_a_forbidden_change_is_rejected_and_changes_nothing(backend, change, rule):
    queue = backend.open(**BASE).queue(QUEUE)
    queue.enqueue(make_mail("kept"))
    before = backend.state()
    with pytest.raises(ConfigurationRejected, match=rule):
        backend.open(**{**BASE, **change})
    assert backend.state() == before
    assert history(backend) == [QueueViewConfiguration(4 * MICROS_PER_SECOND, 2, 10**9)]
    assert [item.name for item in backend.open().queue(QUEUE).browse()] == ["kept"]


@pytest.mark.parametrize(
    "change",
    [
        {"bucket_count": 5},
        {"update_browse_start_pace": 1},
        {"update_browse_start_pace": 5000},
        {"slice_window": "1s"},
    ],
)
def test_an_allowed_change_is_appended(backend, change):
    backend.open(**BASE).queue(QUEUE).enqueue(make_mail("kept"))
    runtime = backend.open(**{**BASE, **change})
    assert len(history(backend)) == 2
    assert history(backend)[-1] == runtime.view_configuration
    assert [item.mail.name for item in runtime.queue(QUEUE).browse()] == ["kept"]


def test_options_left_out_of_the_url_keep_their_stored_values(backend):
    backend.open(**BASE)
    runtime = backend.open(bucket_count=3)
    assert runtime.view_configuration == QueueViewConfiguration(4 * MICROS_PER_SECOND, 3, 10**9)
    assert backend.open().view_configuration == runtime.view_configuration


def test_the_pace_may_go_down_and_up_again(backend):
    for pace in (10**9, 1, 10**9):
        backend.open(**{**BASE, "update_browse_start_pace": pace})
    assert [c.update_browse_start_pace for c in history(backend)] == [10**9, 1, 10**9]


def test_more_buckets_keep_every_mail_browsable_and_deliverable(backend):
    queue = backend.open(**BASE).queue(QUEUE)
    for i in range(6):
        queue.enqueue(make_mail(f"before{i}"))
    grown = backend.open(**{**BASE, "bucket_count": 7}).queue(QUEUE)
    for i in range(6):
        grown.enqueue(make_mail(f"after{i}"))
    expected = [f"before{i}" for i in range(6)] + [f"after{i}" for i in range(6)]
    assert [item.name for item in grown.browse()] == expected
    assert len(backend.queue_rows(QUEUE).buckets) > 2
    assert drain(grown) == expected


@pytest.mark.parametrize(
    "option",
    [
        {"slice_window": "0s"},
        {"slice_window": "1.5s"},
        {"slice_window": "soon"},
        {"bucket_count": 0},
        {"bucket_count": "x"},
        {"update_browse_start_pace": 0},
        {"update_browse_start_pace": -1},
    ],
)
def test_an_invalid_value_is_refused_and_appends_nothing(backend, option):
    backend.open(**BASE)
    before = backend.state()
    with pytest.raises(InvalidInput):
        backend.open(**{**BASE, **option})
    assert backend.state() == before


def test_a_process_holding_the_old_slice_window_never_writes_behind_browse_start(backend, clock):
    """A opened with 1h slices before B changed them to 30m: A still writes into 1h slices, and no mail of
    it may fall behind browse_start, where browse, size, remove and clear would not see it."""
    quiet = {"update_browse_start_pace": 10**9}
    a = backend.open(clock, slice_window="1h", **quiet).queue(QUEUE)
    clock.advance(5 * 60)
    a.enqueue(make_mail("first"))
    b_runtime = backend.open(clock, slice_window="30m", **quiet)
    b = b_runtime.queue(QUEUE)
    item = b.dequeue(timeout=0)
    item.done()
    clock.advance(30 * 60)  # 00:35
    b.maintenance.update_browse_start()
    clock.advance(60)  # 00:36: A, with its stale 1h window, writes into the slice starting 00:00
    for index in range(5):
        a.enqueue(make_mail(f"late{index}"))
    late = [f"late{index}" for index in range(5)]
    for reader in (a, b, backend.open(clock).queue(QUEUE)):
        assert [mail.name for mail in reader.browse()] == late
        assert reader.size() == 5
    assert b.remove(name="late0") == 1
    assert a.size() == 4
    assert b.clear() == 4
    assert b.size() == a.size() == 0
    clock.advance(2 * 3600)
    b.maintenance.update_browse_start()
    rows = backend.queue_rows(QUEUE)
    assert (rows.rows(), rows.deletion_marks) == (0, 0)
    assert b.dequeue(timeout=0) is None


GRACE_S = 2


def test_processes_holding_old_and_new_slice_windows_keep_every_mail_visible(backend, tmp_path):
    """Real clocks, real processes: one keeps enqueueing with the old 4 s window while this process, on the
    new 2 s window, advances browse_start as often as it can. Every mail stays browsable and counted until
    consumed, and the clean-up leaves no row behind. The clock-skew grace is short (the default is 60 s) so
    that browse_start moves within the run, but covers an enqueue's write on a loaded machine: a write
    slower than the grace may land behind browse_start, which is what the grace is for."""
    fast = {"clock_skew_grace": f"{GRACE_S}s", "update_browse_start_pace": 10**9}
    backend.open(slice_window="4s", **fast).queue(QUEUE).enqueue(make_mail("seed"))
    writer = backend.agent("trickle", QUEUE, "40", "0.25", slice_window="4s", **fast)
    assert writer.stdout.readline().strip() == "ready", writer.stderr.read()
    new = backend.open(slice_window="2s", **fast).queue(QUEUE)
    assert new.configuration.slice_window == 2 * MICROS_PER_SECOND
    enqueued: set[str] = set()
    consumed: set[str] = set()
    for line in writer.stdout:  # a line each time the writer has enqueued a mail, until it exits
        enqueued.add(line.strip())
        visible = {mail.name for mail in new.browse()}
        assert enqueued - consumed <= visible, "a mail fell behind browse_start"
        # Counted too; the writer's next mail may be counted already (its counter is written before
        # its row, and browse and size are two reads), never one fewer.
        assert len(visible) <= new.size() <= len(visible) + 1
        consumed.update(drain(new))  # an empty queue lets browse_start advance as far as it may
        new.maintenance.update_browse_start()
    assert writer.wait() == 0, writer.stderr.read()
    assert len(enqueued) == 40
    enqueued.add("seed")
    consumed.update(drain(new))
    assert consumed == enqueued
    time.sleep(4.1 + GRACE_S)
    new.maintenance.update_browse_start()
    assert backend.queue_rows(QUEUE).rows() == 0


# racing changes: without a transaction around the check and the append, one winner and the rules intact
class _Interleaved:
    """The store's configuration events, with another process's change landing just before this
    process's first append: the race a transaction around the check and the append used to rule out."""

    def __init__(self, events, other_change) -> None:
        self.inner = events
        self.other_change = other_change

    def events(self, aggregate: str) -> list[str]:
        return self.inner.events(aggregate)

    def append_event(self, aggregate: str, event: str, now: int, position: int) -> bool:
        if self.other_change is not None:
            change, self.other_change = self.other_change, None
            change()
        return self.inner.append_event(aggregate, event, now, position)


@pytest.mark.parametrize(
    ("ours", "theirs", "appended"),
    [
        ("20m", "30m", False),  # each a divisor of 1h, but 20m is no divisor of 30m: refused on the recheck
        ("30m", "30m", False),  # the same change: already in force
        ("15m", "30m", True),  # 15m divides 30m too: appended after theirs
    ],
)
def test_a_change_racing_another_is_checked_again_against_the_winner(backend, ours, theirs, appended):
    runtime = backend.open()
    current = runtime.configuration.current()
    other = backend.open().configuration
    racing = ConfigurationStore(
        _Interleaved(
            runtime.configuration.events,
            lambda: other.register(replace(current, slice_window=parse_duration(theirs))),
        ),
        runtime.clock,
    )
    change = replace(current, slice_window=parse_duration(ours))
    if ours == "20m":
        with pytest.raises(ConfigurationRejected, match="divisor"):
            racing.register(change)
    else:
        assert racing.register(change) is appended
    windows = [c.slice_window // (60 * MICROS_PER_SECOND) for c in runtime.configuration.history()]
    assert windows == [60, 30] + ([15] if appended else [])


def test_racing_processes_leave_one_winner_and_the_rules_intact(backend):
    backend.open()  # the store and its first configuration (1h) before the processes race
    processes = [agent(backend, "configure", window, grouped=False) for window in ("30m", "20m")]
    outcomes = [json.loads(out) for out in results(processes)]
    # Whichever registered first won; the other's change is no divisor of the winner's window.
    assert outcomes.count(True) == 1
    (refusal,) = [outcome for outcome in outcomes if outcome is not True]
    assert "divisor" in refusal
    history = [c.slice_window // (60 * MICROS_PER_SECOND) for c in backend.open().configuration.history()]
    assert history in ([60, 30], [60, 20])
    for older, newer in zip(history, history[1:], strict=False):
        assert older % newer == 0
