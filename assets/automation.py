"""What starts the maintenance work: sensors on its conditions, and the schedule that rotates generations.

Sensors read the live runtime cheaply (indexed queries, a small sample) and request the Spark jobs; they
never do the work themselves. Thresholds come from the environment so an operator tunes them without code.
"""

import inspect
import json
import os
from collections.abc import Callable

import dagster as dg

from mailq_runtime.clock import MICROS_PER_SECOND
from mailq_runtime.model import parse_count, parse_duration
from resources import MailqRuntime

from .jobs import (
    blob_gc_job,
    dead_letters_job,
    mailbox_counters_job,
    queue_cleanup_job,
    rotate_generation_job,
)
from .metadata import micros_of
from .notify import notify


def _setting(name: str, default: str) -> str:
    return os.environ.get(name, default)


def _sensor(job_name: str, interval: int) -> Callable:
    """A sensor of the job `job_name` ticking every `interval` seconds, described in the UI by its docstring
    (Dagster's sensor decorator does not read it)."""

    def define(evaluate: Callable) -> dg.SensorDefinition:
        return dg.sensor(
            job_name=job_name,
            minimum_interval_seconds=interval,
            description=inspect.cleandoc(evaluate.__doc__),
        )(evaluate)

    return define


def _last_gc(instance: dg.DagsterInstance) -> dict:
    """What the latest real GC run examined: its current generation and the newest deletion it read
    (zeros when there was none). A dry run is a gc_plan materialisation, not one of collected_blobs; an
    instance may still hold collected_blobs' dry runs of before, which retired nothing."""
    event = instance.get_latest_materialization_event(dg.AssetKey("collected_blobs"))
    metadata = event.asset_materialization.metadata if event and event.asset_materialization else {}
    if "examined_through" not in metadata or ("dry_run" in metadata and metadata["dry_run"].value):
        return {"generation": 0, "deleted_at": 0}
    return {
        "generation": metadata["examined_generation"].value,
        "deleted_at": micros_of(metadata["examined_through"]),
    }


@_sensor(blob_gc_job.name, 60)
def deletions_waiting_sensor(context: dg.SensorEvaluationContext, mailq: MailqRuntime) -> dg.SensorResult:
    """Deletions that no GC run has examined yet, in an eligible generation, beyond a count
    (MAILQ_GC_MIN_DELETIONS, default 1000) or an age (MAILQ_GC_MAX_WAIT, default 1d), start a GC
    iteration. The rows a run left (a false positive's, or rows inside the settle time) are older than
    what it examined, so they never start another run by themselves: the next run, which new work
    starts, examines them again."""
    threshold = parse_count(_setting("MAILQ_GC_MIN_DELETIONS", "1000"), "MAILQ_GC_MIN_DELETIONS")
    max_wait = parse_duration(_setting("MAILQ_GC_MAX_WAIT", "1d"), "MAILQ_GC_MAX_WAIT")
    requested = json.loads(context.cursor) if context.cursor else {"generation": 0, "deleted_at": 0}
    # A run started elsewhere (the command line, the UI) counts as much as the ones this sensor requested.
    # Each pair names rows already dealt with (those of generations <= generation - 2 up to deleted_at);
    # mixing the two pairs' fields would name rows neither covers, so the later generation's pair wins.
    examined = _last_gc(context.instance)
    cursor = max(requested, examined, key=lambda pair: (pair["generation"], pair["deleted_at"]))
    with mailq.session() as runtime:
        backlog = runtime.blobs.deletion_backlog(
            since_generation=cursor["generation"], since=cursor["deleted_at"]
        )
        now = runtime.clock()
    if backlog.count == 0:
        return dg.SensorResult(skip_reason="no deletion waiting in an eligible generation")
    waited = now - backlog.oldest
    if backlog.count < threshold and waited < max_wait:
        return dg.SensorResult(
            skip_reason=f"{backlog.count} deletion(s) waiting for {waited // MICROS_PER_SECOND}s: "
            "below the thresholds"
        )
    # A newly eligible generation's deletions may be older than the cursor: moving it back to them would
    # count the deletions already requested for again at the next tick.
    newest = max(backlog.newest, cursor["deleted_at"])
    return dg.SensorResult(
        run_requests=[dg.RunRequest(run_key=f"gc-{backlog.current_generation}-{newest}")],
        cursor=json.dumps({"generation": backlog.current_generation, "deleted_at": newest}),
    )


@_sensor(queue_cleanup_job.name, 60)
def queue_cleanup_sensor(context: dg.SensorEvaluationContext, mailq: MailqRuntime) -> dg.SensorResult:
    """A queue whose clean-up is unfinished (browse_start ahead of content_start), or whose browse_start
    can advance by two slices or more (no live mail in them), gets cleaned. A browse_start that a live
    mail holds back starts no run: the clean-up could not move it."""
    with mailq.session() as runtime:
        names = runtime.queues()
        due = [name for name in names if runtime.queue(name).maintenance.due()]
        states = [
            (
                name,
                runtime.queue(name).maintenance.browse_start(),
                runtime.queue(name).maintenance.content_start(),
            )
            for name in due
        ]
    if not due:
        return dg.SensorResult(
            skip_reason=f"nothing to clean in {len(names)} queue(s): no clean-up left unfinished, no "
            "browse_start that can advance by two slices"
        )
    return dg.SensorResult(
        run_requests=[dg.RunRequest(run_key=f"cleanup-{json.dumps(states)}", tags={"queues": ",".join(due)})]
    )


@_sensor(mailbox_counters_job.name, 300)
def counter_drift_sensor(context: dg.SensorEvaluationContext, mailq: MailqRuntime) -> dg.SensorResult:
    """Recounts a random sample of mailboxes (MAILQ_COUNTER_SAMPLE, default 50) from the source of truth;
    drift starts the full recomputation. The same drift asks again only after MAILQ_COUNTER_RETRY (default
    1h), so a mailbox that keeps failing does not start a run at every tick."""
    sample = parse_count(_setting("MAILQ_COUNTER_SAMPLE", "50"), "MAILQ_COUNTER_SAMPLE")
    retry = parse_duration(_setting("MAILQ_COUNTER_RETRY", "1h"), "MAILQ_COUNTER_RETRY")
    last = json.loads(context.cursor) if context.cursor else {"drifting": [], "at": 0}
    with mailq.session() as runtime:
        drifting = sorted(runtime.mailboxes.sample_drift(sample))
        now = runtime.clock()
    if not drifting:
        return dg.SensorResult(skip_reason=f"no drift in a sample of {sample} mailboxes")
    if drifting == last["drifting"] and now - last["at"] < retry:
        return dg.SensorResult(skip_reason=f"drift in {len(drifting)} mailbox(es) already being repaired")
    return dg.SensorResult(
        run_requests=[dg.RunRequest(run_key=f"counters-{now}", tags={"drifting": ",".join(drifting)[:200]})],
        cursor=json.dumps({"drifting": drifting, "at": now}),
    )


@_sensor(dead_letters_job.name, 60)
def dead_letters_sensor(context: dg.SensorEvaluationContext, mailq: MailqRuntime) -> dg.SensorResult:
    """Counts every queue's dead letters (as `mailq queues` does); when there are more than at the
    previous tick, it logs them, notifies the hook of MAILQ_DEAD_LETTER_NOTIFY (a command or a webhook
    URL; none by default) and runs the dead-letter asset. Its first tick only takes the count."""
    with mailq.session() as runtime:
        counts = {
            name: runtime.queue(name, create=False).overviews.overview().dead_letters
            for name in runtime.queues()
        }
        now = runtime.clock()
    total = sum(counts.values())
    cursor = json.dumps({"dead_letters": total, "per_queue": counts})
    if context.cursor is None:
        return dg.SensorResult(skip_reason=f"{total} dead letter(s) now: counting from here", cursor=cursor)
    last = json.loads(context.cursor)
    if total <= last["dead_letters"]:
        return dg.SensorResult(
            skip_reason=f"{total} dead letter(s), {last['dead_letters']} at the previous tick: no growth",
            cursor=cursor,
        )
    grown = {name: count - last["per_queue"].get(name, 0) for name, count in counts.items()}
    grown = {name: more for name, more in grown.items() if more > 0}
    context.log.warning(f"dead letters grew from {last['dead_letters']} to {total}: {grown}")
    outcome = notify(
        {"event": "dead_letters_grew", "before": last["dead_letters"], "now": total, "grew": grown}
    )
    context.log.info(outcome)
    return dg.SensorResult(
        run_requests=[dg.RunRequest(run_key=f"dead-letters-{now}", tags={"dead_letters": str(total)})],
        cursor=cursor,
    )


rotate_generation_schedule = dg.ScheduleDefinition(
    name="rotate_generation_schedule",
    job=rotate_generation_job,
    cron_schedule=_setting("MAILQ_GENERATION_CRON", "0 3 1 * *"),  # James's default: a 30-day generation
    default_status=dg.DefaultScheduleStatus.RUNNING,
)
