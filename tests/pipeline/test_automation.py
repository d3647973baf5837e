"""What starts the maintenance work: the three sensors on their conditions, and the generation schedule.

Sensors are evaluated as the daemon would, with their resources and the cursor of the previous tick.
None of them needs Spark.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import dagster as dg
import pytest

from assets import automation, queue
from assets.definitions import defs
from mailq_runtime import InvalidInput, Mail, NoStore, Runtime
from mailq_runtime.clock import system_clock
from mailq_runtime.queue import slice_of
from resources import MailqRuntime
from tests.runtime.backends import Backend

HOUR = 3600 * 1_000_000
USER = "alice@example.com"


@pytest.fixture
def runtime(backend: Backend) -> Runtime:
    return backend.open()


def resources(runtime: Runtime) -> dict:
    return {"mailq": MailqRuntime(url=runtime.settings.url)}


def evaluate(
    sensor: dg.SensorDefinition,
    runtime: Runtime,
    cursor: str | None = None,
    instance: dg.DagsterInstance | None = None,
) -> dg.SensorResult:
    """One tick; in `instance` (runs recorded there), or else in an empty one, as the daemon's always is."""
    with dg.build_sensor_context(
        resources=resources(runtime), cursor=cursor, instance=instance or dg.DagsterInstance.ephemeral()
    ) as context:
        return sensor(context)


def requested(result: dg.SensorResult) -> bool:
    """A run requested (with a run key, so the daemon would not launch the same one twice) or a skip."""
    if result.run_requests:
        assert len(result.run_requests) == 1 and result.run_requests[0].run_key
        assert result.skip_reason is None
        return True
    assert result.skip_reason.skip_message
    return False


def skipped_because(result: dg.SensorResult) -> str:
    assert not requested(result)
    return result.skip_reason.skip_message


# deletions waiting for an eligible generation
def test_deletions_sensor_thresholds_cursor_and_rotations(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    sensor = automation.deletions_waiting_sensor
    assert sensor.job_name == "blob_gc_job"
    blobs = runtime.blobs
    for n in range(3):
        blobs.save(f"a{n}", b"generation 1, blob %d" % n)
    runtime.generations.rotate()
    for n in range(3):
        blobs.save(f"b{n}", b"generation 2, blob %d" % n)
    # Generation 2's deletions come first: they are older than generation 1's, yet become eligible later.
    for owner in ("b0", "b1", "b2", "a0", "a1", "a2"):
        blobs.release(owner)
    monkeypatch.setenv("MAILQ_GC_MIN_DELETIONS", "1000")
    monkeypatch.setenv("MAILQ_GC_MAX_WAIT", "1d")

    nothing_eligible = evaluate(sensor, runtime)
    assert "no deletion waiting" in skipped_because(nothing_eligible)

    runtime.generations.rotate()  # generation 3: generation 1's three deletions are eligible
    below = evaluate(sensor, runtime)
    assert skipped_because(below).startswith("3 deletion(s) waiting")
    assert below.cursor is None  # nothing consumed: they keep adding up
    monkeypatch.setenv("MAILQ_GC_MAX_WAIT", "0s")
    assert requested(evaluate(sensor, runtime))  # old enough
    monkeypatch.setenv("MAILQ_GC_MAX_WAIT", "1d")
    monkeypatch.setenv("MAILQ_GC_MIN_DELETIONS", "3")
    first = evaluate(sensor, runtime)
    assert requested(first)  # many enough

    # The same deletions do not start another run.
    assert not requested(evaluate(sensor, runtime, first.cursor))

    runtime.generations.rotate()  # generation 4: generation 2's deletions become eligible
    second = evaluate(sensor, runtime, first.cursor)
    assert requested(second)
    assert second.run_requests[0].run_key != first.run_requests[0].run_key
    assert json.loads(second.cursor)["generation"] == 4

    again = evaluate(sensor, runtime, second.cursor)
    assert not requested(again), again.run_requests
    runtime.blobs.save("c0", b"generation 4 blob")
    runtime.blobs.release("c0")  # not eligible: no reason to run
    assert not requested(evaluate(sensor, runtime, second.cursor))


# queues whose clean-up is unfinished or whose browse_start lags
def reachable_slice(runtime: Runtime) -> int:
    """The newest slice browse_start may reach now (the sensor's runtime has the same settings)."""
    grace, window = runtime.settings.clock_skew_grace, runtime.view_configuration.slice_window
    return slice_of(system_clock() - grace, window)


def evaluate_at(runtime: Runtime, arrange: Callable[[int], None]) -> dg.SensorResult:
    """Sets the queues' state relative to the newest reachable slice with `arrange`, then evaluates the
    clean-up sensor; done again should a slice boundary pass in between."""
    for _ in range(2):
        reachable = reachable_slice(runtime)
        arrange(reachable)
        result = evaluate(automation.queue_cleanup_sensor, runtime)
        if reachable_slice(runtime) == reachable:
            return result
    raise AssertionError("two slice boundaries passed during two sensor evaluations")


def test_queue_cleanup_sensor_requests_a_run_only_for_a_queue_to_clean(
    runtime: Runtime, backend: Backend
) -> None:
    assert automation.queue_cleanup_sensor.job_name == "queue_cleanup_job"
    assert runtime.view_configuration.slice_window == HOUR
    for name in ("current", "other"):
        created = runtime.queue(name)
        created.enqueue(Mail(recipients=(USER,), message=b"Subject: x\r\n\r\nhi\r\n"))  # creates it
        created.dequeue(timeout=0).done()

    def starts(other_browse: int, other_content: int) -> Callable[[int], None]:
        def arrange(reachable: int) -> None:
            for queue_name, browse, content in (
                ("current", reachable, reachable),
                ("other", reachable + other_browse * HOUR, reachable + other_content * HOUR),
            ):
                backend.move_starts(queue_name, browse_start=browse, content_start=content)

        return arrange

    assert not requested(evaluate_at(runtime, starts(0, 0)))
    assert not requested(evaluate_at(runtime, starts(-1, -1)))  # one slice behind: not yet worth a run
    lagging = evaluate_at(runtime, starts(-2, -2))
    assert requested(lagging) and lagging.run_requests[0].tags["queues"] == "other"
    half_cleaned = evaluate_at(runtime, starts(0, -1))  # browse_start ahead of content_start
    assert requested(half_cleaned) and half_cleaned.run_requests[0].tags["queues"] == "other"
    assert half_cleaned.run_requests[0].run_key != lagging.run_requests[0].run_key

    # The run it asks for (the clean-up, Spark-free) settles both conditions.
    both = evaluate_at(runtime, starts(-3, -4))
    assert requested(both)
    result = dg.materialize([queue.mail_queue_cleanup], resources=resources(runtime))
    assert result.success
    assert not requested(evaluate(automation.queue_cleanup_sensor, runtime))
    reachable = reachable_slice(runtime)
    assert (
        runtime.queue("other").maintenance.browse_start()
        == runtime.queue("other").maintenance.content_start()
        >= reachable - HOUR
    )


def test_queue_cleanup_sensor_asks_for_no_run_that_a_live_mail_holds_back(
    runtime: Runtime, backend: Backend
) -> None:
    # A mail enqueued two hours ago and still live: browse_start cannot pass its slice, however far the
    # queue lags; the sensor asked for a run that cleaned nothing at every tick before.
    enqueued_at = system_clock() - 2 * HOUR
    held_at = slice_of(enqueued_at, HOUR)
    past = backend.open(clock=lambda: enqueued_at)
    past.queue("spool").enqueue(Mail(recipients=(USER,), message=b"Subject: x\r\n\r\nold\r\n"))
    past.close()

    def starts(browse: int) -> Callable[[int], None]:
        def arrange(reachable: int) -> None:
            start = held_at + browse * HOUR
            backend.move_starts("spool", browse_start=start, content_start=start)

        return arrange

    held = evaluate_at(runtime, starts(-1))  # one slice to gain before the live mail: not worth a run
    assert skipped_because(held) == (
        "nothing to clean in 1 queue(s): no clean-up left unfinished, no browse_start that can advance by "
        "two slices"
    )
    assert requested(evaluate_at(runtime, starts(-2)))
    assert dg.materialize([queue.mail_queue_cleanup], resources=resources(runtime)).success
    assert runtime.queue("spool").maintenance.browse_start() == held_at
    # Two slices behind the current one, and held there by the live mail: no run.
    assert not requested(evaluate(automation.queue_cleanup_sensor, runtime))


# counter drift
def test_counter_drift_sensor_requests_a_recompute_only_on_drift(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    sensor = automation.counter_drift_sensor
    assert sensor.job_name == "mailbox_counters_job"
    boxes = runtime.mailboxes
    mailboxes = [boxes.create(USER, name) for name in ("INBOX", "Archive", "Sent")]
    for n, mailbox in enumerate(mailboxes):
        boxes.append(mailbox, b"Subject: %d\r\n\r\nbody\r\n" % n)
    boxes.set_flags(mailboxes[0], 1, add=["\\Seen"])

    consistent = evaluate(sensor, runtime)
    assert "no drift" in skipped_because(consistent)

    assert boxes.reset_counters(mailboxes[1], 1, 0, observed=(1, 1))  # one unseen counted as seen
    drift = evaluate(sensor, runtime)
    assert requested(drift) and mailboxes[1] in drift.run_requests[0].tags["drifting"]
    # Still drifting at the next tick (the run has not repaired it yet): not asked again so soon ...
    assert "already being repaired" in skipped_because(evaluate(sensor, runtime, drift.cursor))
    # ... but again once the retry period has passed, under a new key.
    monkeypatch.setenv("MAILQ_COUNTER_RETRY", "0s")
    later = evaluate(sensor, runtime, drift.cursor)
    assert requested(later) and later.run_requests[0].run_key != drift.run_requests[0].run_key

    boxes.reset_counters(mailboxes[1], 1, 1, observed=(1, 0))
    assert not requested(evaluate(sensor, runtime, later.cursor))


@pytest.mark.parametrize(
    ("sensor", "variable", "value"),
    [
        (automation.deletions_waiting_sensor, "MAILQ_GC_MIN_DELETIONS", "1" * 310),
        (automation.deletions_waiting_sensor, "MAILQ_GC_MIN_DELETIONS", "nan"),
        (automation.deletions_waiting_sensor, "MAILQ_GC_MAX_WAIT", "1" * 310),
        (automation.deletions_waiting_sensor, "MAILQ_GC_MAX_WAIT", "inf"),
        (automation.counter_drift_sensor, "MAILQ_COUNTER_SAMPLE", "0"),
        (automation.counter_drift_sensor, "MAILQ_COUNTER_RETRY", "-1h"),
    ],
)
def test_a_bad_threshold_in_the_environment_is_a_clear_error(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, sensor: dg.SensorDefinition, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(InvalidInput, match=f"invalid {variable}"):
        evaluate(sensor, runtime)


# the schedule and the job it runs
def test_rotate_generation_schedule_and_job(runtime: Runtime) -> None:
    schedule = defs.resolve_schedule_def("rotate_generation_schedule")
    assert schedule.job_name == "rotate_generation_job"
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    tick = schedule.evaluate_tick(dg.build_schedule_context(scheduled_execution_time=None))
    assert len(tick.run_requests) == 1 and tick.skip_message is None

    before = (runtime.generations.current(), runtime.generations.current_gc_iteration())
    job = defs.resolve_job_def("rotate_generation_job")
    result = job.execute_in_process(resources=resources(runtime), instance=dg.DagsterInstance.ephemeral())

    assert result.success
    assert (runtime.generations.current(), runtime.generations.current_gc_iteration()) == (
        before[0] + 1,
        before[1] + 1,
    )
    (output,) = [e for e in result.all_node_events if e.is_successful_output]
    assert output.event_specific_data.metadata["reference_generation"].value == before[0] + 1


def test_the_runtime_resource_never_creates_a_store(tmp_path) -> None:
    """A mistyped MAILQ_URL fails naming the place, and leaves no empty store for the sensors to watch."""
    missing = tmp_path / "mistyped"
    resource = MailqRuntime(url=f"embedded://{missing}")
    for attempt in (lambda: resource.runtime, lambda: resource.session().__enter__()):
        with pytest.raises(NoStore, match=f"no mailq data in {missing}"):
            attempt()
    assert not missing.exists()
