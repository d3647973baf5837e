"""The mail queue's assets: per-slice statistics and their two checks, and the content clean-up.

Mails are enqueued through a runtime on a fake clock with one-second slices, so each lands in a known
slice; the assets run on their own runtime (the resource's), on the real clock.
"""

from __future__ import annotations

import dagster as dg
import pytest
from pyspark.sql import SparkSession

from assets import queue as queue_assets
from mailq_runtime import Runtime
from mailq_runtime.clock import MICROS_PER_SECOND
from mailq_runtime.queue import MailQueue

from ..runtime.backends import Backend
from ..runtime.helpers import FakeClock, make_mail
from .pipeline import checks_passed, materialized

SLICE = MICROS_PER_SECOND
SLICE_ASSETS = [
    queue_assets.mail_queue_slices,
    queue_assets.slice_counters_match_recount,
    queue_assets.browse_start_not_ahead_of_live_mail,
]


def clocked_runtime(backend: Backend, clock: FakeClock) -> Runtime:
    """One-second slices, no clock-skew grace, browse_start moved only when asked."""
    return backend.open(clock, slice_window="1s", clock_skew_grace="0s", update_browse_start_pace=10**9)


def enqueue(queue: MailQueue, clock: FakeClock, at: int, *names: str) -> list[str]:
    """Enqueue the named mails `at` seconds after the clock's start; their enqueue ids."""
    clock.now = FakeClock().now + at * SLICE
    return [queue.enqueue(make_mail(name, body=f"Body of {name}.\r\n".encode())) for name in names]


def deliver(queue: MailQueue, *names: str) -> None:
    """Dequeue the next mails, which must be these, and acknowledge them."""
    for name in names:
        item = queue.dequeue(timeout=0)
        assert item is not None and item.mail.name == name
        item.done()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_slice_figures_and_both_checks_pass_then_each_fails_on_its_corruption(
    backend: Backend, clock: FakeClock, spark: SparkSession, deployment_resources: dict
) -> None:
    start = clock.now
    with clocked_runtime(backend, clock) as runtime:
        spool, outgoing = runtime.queue("spool"), runtime.queue("outgoing")
        enqueue(spool, clock, 0, "a1", "a2", "a3")
        enqueue(spool, clock, 1, "b1", "b2")
        enqueue(spool, clock, 2, "c1")
        enqueue(outgoing, clock, 2, "o1", "o2")
        deliver(spool, "a1", "a2")
        assert spool.remove(name="b2") == 1
        assert spool.size() == 3 and outgoing.size() == 2
    resources = deployment_resources

    consistent = dg.materialize(SLICE_ASSETS, resources=resources)

    assert checks_passed(consistent) == {
        "slice_counters_match_recount": True,
        "browse_start_not_ahead_of_live_mail": True,
    }
    figures = materialized(consistent, "mail_queue_slices")
    assert {key: figures[key] for key in ("queues", "slices", "live_mails")} == {
        "queues": 2,
        "slices": 4,
        "live_mails": 5,
    }
    slices = spark.read.parquet(figures["path"]).collect()
    assert sorted(
        (
            r.queue,
            (r.slice_start - start) // SLICE,
            r.enqueued,
            r.deleted,
            r.live,
            r.counted_enqueued,
            r.counted_deleted,
            r.browse_start,
            r.content_start,
        )
        for r in slices
    ) == [
        # outgoing was created by its first enqueue, in the third slice
        ("outgoing", 2, 2, 0, 2, 2, 0, start + 2 * SLICE, start + 2 * SLICE),
        ("spool", 0, 3, 2, 1, 3, 2, start, start),
        ("spool", 1, 2, 1, 1, 2, 1, start, start),
        ("spool", 2, 1, 0, 1, 1, 0, start, start),
    ]

    # A slice counter off by five in spool; outgoing's browse_start moved past its live mails.
    backend.miscount_slice("spool", start + SLICE, 5)
    backend.move_starts("outgoing", browse_start=start + 3 * SLICE)

    corrupted = dg.materialize(SLICE_ASSETS, resources=resources, raise_on_error=False)

    assert not corrupted.success
    evaluations = {e.check_name: e for e in corrupted.get_asset_check_evaluations()}
    assert {name: e.passed for name, e in evaluations.items()} == {
        "slice_counters_match_recount": False,
        "browse_start_not_ahead_of_live_mail": False,
    }
    assert evaluations["slice_counters_match_recount"].metadata["sample"].value == [
        {
            "queue": "spool",
            "slice_start": start + SLICE,
            "enqueued": 2,
            "counted_enqueued": 7,
            "deleted": 1,
            "counted_deleted": 1,
        },
    ]
    assert evaluations["browse_start_not_ahead_of_live_mail"].metadata["hidden_live_slices"].value == [
        {"queue": "outgoing", "slice_start": start + 2 * SLICE, "live": 2, "browse_start": start + 3 * SLICE},
    ]


def test_cleanup_finishes_a_clean_up_left_half_done(
    backend: Backend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, deployment_resources: dict
) -> None:
    start = clock.now
    with clocked_runtime(backend, clock) as runtime:
        spool = runtime.queue("spool")
        ids = {f"s{n}": enqueue(spool, clock, n, f"s{n}")[0] for n in range(4)}  # one mail a slice
        deliver(spool, "s0", "s1", "s2")
        clock.now = start + 5 * SLICE
        quiet = runtime.queue("quiet")
        (ids["q5"],) = enqueue(quiet, clock, 5, "q5")

        # browse_start moves to the first live mail (s3), then the content clean-up dies.
        def disk_went_away() -> int:
            raise OSError("disk went away")

        monkeypatch.setattr(spool.clean_up, "clean_content", disk_went_away)
        with pytest.raises(OSError, match="disk went away"):
            spool.maintenance.update_browse_start()
        assert (spool.maintenance.browse_start(), spool.maintenance.content_start()) == (
            start + 3 * SLICE,
            start,
        )
        assert backend.queue_rows("spool").rows() == 4

    result = dg.materialize([queue_assets.mail_queue_cleanup], resources=deployment_resources)

    assert result.success
    figures = materialized(result, "mail_queue_cleanup")
    assert (figures["queues"], figures["queues_cleaned"]) == (2, 1)
    with Runtime.open(backend.url()) as runtime:
        spool, quiet = runtime.queue("spool"), runtime.queue("quiet")
        assert (spool.maintenance.browse_start(), spool.maintenance.content_start()) == (
            start + 3 * SLICE,
            start + 3 * SLICE,
        )
        assert (quiet.maintenance.browse_start(), quiet.maintenance.content_start()) == (
            start + 5 * SLICE,
            start + 5 * SLICE,
        )
        # The delivered mails' rows, deletion marks and counters are gone; the live mail is intact.
        rows = backend.queue_rows("spool")
        assert (rows.rows(), rows.rows(slices_before=start + 3 * SLICE)) == (1, 0)
        assert rows.counted_slices == [start + 3 * SLICE]
        assert rows.deletion_marks == backend.queue_rows("quiet").deletion_marks == 0
        # Only the live mails still hold their content.
        assert set(backend.blob_state().held()) == {ids["s3"], ids["q5"]}
        assert [item.name for item in spool.browse()] == ["s3"] and spool.size() == 1
        item = spool.dequeue(timeout=0)
        assert item is not None and item.mail.message.endswith(b"Body of s3.\r\n")
