"""`mailq demo`: mail traffic through the runtime, then the whole maintenance pipeline on what it left.

1. traffic (`mailq_demo.traffic.simulate`): two simulated hours of generated mail through the queue,
   most of it delivered to the local INBOXes by the worker's delivery, the spam run removed;
2. mailboxes (`mailq_demo.mailboxes.deliver_and_maintain`): the worker drains the queue (the delayed mails
   stay), people read, flag, archive and expunge; the reference generation rotates;
3. faults (`mailq_demo.mailboxes.inject_counter_faults`): a few mailbox operations die between their writes,
   leaving counters and projection entries for the recomputation to repair;
4. a second rotation: the traffic's generation rg1 is now two behind the current one, so eligible (n-2);
5. the maintenance pipeline in Dagster runs, with their checks: blob_gc_and_orphan_sweep_job (the GC's
   destructive steps run only in their jobs), then the operator's path, gc_plan_job and gc_apply_job, on
   what the GC left (most often an empty plan, applied as nothing to apply), every asset of
   maintenance_job, in lineage order, then queue_overview_job and dead_letters_job, so that every asset's
   page in the UI has a materialisation.

The report says what was collected (blobs, bytes), repaired (counters, projection entries) and cleaned
(queues). With DAGSTER_HOME set (`make demo` sets it), the run is recorded there for `make ui`.

It runs on a deployment it makes: by default the embedded one in a data dir it wipes (`embedded`), or
any deployment named by a URL that does not exist yet (`new_deployment`), the distributed one included.
The tables' rows it reports are read by the store's table reader, which the assets' Spark data source
wraps (`mailq_runtime.deployments.table_reader`): the runtime's API has no counts of whole tables, nor the
stores a common query language; in this process rather than in a Spark job, whose Python workers would
cost seconds to minutes on a busy machine for tables this small.
"""

import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from assets import jobs
from assets.definitions import outputs
from mailq_demo import traffic
from mailq_demo.mailboxes import deliver_and_maintain, inject_counter_faults
from mailq_runtime.clock import MICROS_PER_SECOND, to_datetime
from mailq_runtime.deployments import data_dir_holds_store, s3_content_sample, table_reader
from mailq_runtime.errors import InvalidInput, NoStore
from mailq_runtime.model import parse_duration
from mailq_runtime.runtime import Runtime
from mailq_runtime.settings import CASSANDRA, EMBEDDED, Settings, redact
from mailq_runtime.tables import TableRead, chosen

from .output import progress_bar
from .pipeline_output import describe_run, human_bytes
from .pipeline_run import run_pipeline

PHASES = 5
# The pipeline's runs, in order: the overviews last, so that they show what the maintenance left.
DEMO_JOBS = (
    jobs.blob_gc_and_orphan_sweep_job,
    jobs.gc_plan_job,
    jobs.gc_apply_job,
    jobs.maintenance_job,
    jobs.queue_overview_job,
    jobs.dead_letters_job,
)
# James's default pace: the runtime advances browse_start on 1 in 1000 dequeues, so what the traffic leaves
# behind is record 32's clean-up for the pipeline's mail_queue_cleanup (the queue demo's 1 in 50 would
# leave it nothing to do).
CONFIGURATION = replace(traffic.CONFIGURATION, update_browse_start_pace=1000)
# Simulated time between the traffic and the worker's drain: the retries of the traffic's last minutes
# fall due, so the drain leaves only the delayed mails in the queue.
SETTLE = 2 * parse_duration(traffic.RETRY_DELAY)
# Each table's rows, counted through a column of its key: a count reads no more than that.
_TABLES = {
    "blobs": "blob_id",
    "blob_references": "blob_id",
    "blob_deletions": "blob_id",
    "enqueued_mails": "queue",
    "deleted_mails": "queue",
    "mailbox_counters": "mailbox_id",
}


def _say(text: str) -> None:
    # Progress goes to stderr: stdout carries the report (or the JSON document).
    print(text, file=sys.stderr, flush=True)


def embedded(data_dir: Path, mails: int) -> Settings:
    """The demo's own embedded data dir, wiped once the demo's size is checked (a directory that does not
    look like a mailq data dir is refused, not wiped)."""
    traffic.check_size(mails)
    traffic.fresh_data_dir(data_dir)
    return Settings(backend=EMBEDDED, data_dir=data_dir)


def new_deployment(url: str, mails: int) -> Settings:
    """The deployment of `url`, which the demo makes: refused, before anything is written, when it holds
    a store already (a keyspace, a data dir, an embedded broker's directory) or its bucket holds content
    under its prefix, whose owner's blobs the orphan sweep would delete, or when MAILQ_PIPELINE_DIR names
    an object store the deployment has not."""
    traffic.check_size(mails)
    settings = Settings.from_url(url).absolute()
    outputs(settings)
    try:
        Runtime(settings).close()
    except NoStore:
        pass
    else:
        raise InvalidInput(
            f"{settings.shown()} holds a mailq store already: the demo makes its own deployment, so "
            "name one that does not exist yet"
        )
    if settings.backend == CASSANDRA:
        if settings.data_dir is not None and data_dir_holds_store(settings.data_dir):
            raise InvalidInput(
                f"the embedded broker's directory {settings.data_dir} holds a broker already: the demo "
                "makes its own deployment, so name a directory that does not"
            )
        _check_no_content(settings)
    return settings


def _check_no_content(settings: Settings) -> None:
    # The bucket alone, before the keyspace is made: the runtime opens a deployment keyspace first.
    held = s3_content_sample(settings)
    if held is not None:
        assert settings.s3 is not None
        raise InvalidInput(
            f"bucket {settings.s3.bucket!r} of {settings.shown()} holds content already (such as {held}): "
            "the demo's orphan sweep would delete what no table of its own names, so give the demo a "
            "bucket or an s3_prefix of its own"
        )


def _queues(runtime: Runtime, rows: dict[str, int]) -> dict[str, dict[str, int]]:
    """browse_start, content_start and the stored rows of each queue: what the clean-up moves and deletes."""
    return {
        name: {
            "browse_start": runtime.queue(name).maintenance.browse_start(),
            "content_start": runtime.queue(name).maintenance.content_start(),
            "rows": rows.get(name, 0),
        }
        for name in runtime.queues()
    }


def _counts(settings: Settings) -> tuple[dict[str, int], dict[str, int]]:
    """The rows of each of _TABLES, and of enqueued_mails by queue, read through the store's table reader
    in this process: the tables are the demo's, small enough for one reader."""
    reader = table_reader(settings)
    tables: dict[str, int] = {}
    by_queue: Counter[str] = Counter()
    for table, column in _TABLES.items():
        read = TableRead(table, chosen(table, reader.columns(table), [column]))
        batches = [batch for part in reader.plan(read, 1) for batch in reader.read(read, part)]
        tables[table] = sum(batch.num_rows for batch in batches)
        if table == "enqueued_mails":
            by_queue.update(name for batch in batches for name in batch.column(0).to_pylist())
    return tables, dict(by_queue)


def _snapshot(settings: Settings) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """The queues' starts and rows, and the tables' rows, on the real clock as `mailq` commands read."""
    tables, by_queue = _counts(settings)
    with Runtime(settings) as live:
        return _queues(live, by_queue), tables


def seed(settings: Settings, mails: int, say: Callable[[str], None] = _say) -> dict[str, Any]:
    """The demo's first four phases on the deployment of `settings`: the traffic, the mailboxes, the
    faults and the generations, all that the pipeline then maintains; returns their figures."""
    url = settings.url
    runtime, clock = traffic.open_demo(settings, CONFIGURATION, later=SETTLE)
    place = f"in {settings.data_dir}" if settings.backend == EMBEDDED else f"on {redact(url)}"
    details: list[str] = []
    with runtime:
        say(
            f"[1/{PHASES}] traffic: {mails} mails over {traffic.SPAN // (3600 * MICROS_PER_SECOND)} "
            f"simulated hours through queue {traffic.QUEUE!r} {place}"
        )
        steps = traffic.simulate(runtime, clock, mails, progress_bar)
        clock.now += SETTLE
        say(
            f"[2/{PHASES}] mailboxes: the worker drains the queue into {len(traffic.LOCAL_USERS)} INBOXes; "
            "people read, flag, archive, expunge"
        )
        mailboxes = deliver_and_maintain(runtime, traffic.QUEUE, traffic.LOCAL_USERS, details.append)
        say(f"[3/{PHASES}] faults: mailbox operations die between their writes")
        faults = inject_counter_faults(runtime, traffic.LOCAL_USERS, details.append)
        generation, iteration = runtime.generations.rotate()
        generations = {
            "current": generation,
            "gc_iteration": iteration,
            "eligible": runtime.generations.eligible(),
        }
        say(
            f"[4/{PHASES}] generations: rotated twice, now rg{generation}; eligible for collection: "
            + ", ".join(f"rg{g}" for g in generations["eligible"])
        )
        left = runtime.queue(traffic.QUEUE).size()
    return {
        **steps,
        "mailboxes": {**mailboxes, "queue_size_after": left, "details": details},
        "faults": faults,
        "generations": generations,
    }


def run(settings: Settings, mails: int = 3000, say: Callable[[str], None] = _say) -> dict[str, Any]:
    """The whole demo on the deployment of `settings`, made by it (`embedded` or `new_deployment`);
    returns its figures (see `describe`)."""
    started = time.monotonic()
    settings = settings.absolute()
    seeded = seed(settings, mails, say)
    say(
        f"[5/{PHASES}] pipeline: the GC and the orphan sweep, the GC's plan and its application, every "
        "maintenance asset in lineage order, then the queue's overviews, with their checks (Spark starts "
        "first)"
    )
    queues_before, tables_before = _snapshot(settings)
    runs = [run_pipeline(job.name, settings, "demo") for job in DEMO_JOBS]
    queues_after, tables_after = _snapshot(settings)
    pipeline = {
        "success": all(run["success"] for run in runs),
        "assets": {name: figures for run in runs for name, figures in run["assets"].items()},
        "checks": {name: check for run in runs for name, check in run["checks"].items()},
        "runs": runs,
    }
    assets = pipeline["assets"]
    # The plan, made after the GC, may hold garbage the GC's filter kept back: what it applies is collected.
    collected, orphans = assets.get("collected_blobs", {}), assets.get("orphan_blobs", {})
    applied, counters = assets.get("applied_gc_plan", {}), assets.get("mailbox_counters", {})
    return {
        "data_dir": str(settings.data_dir) if settings.backend == EMBEDDED else None,
        "url": redact(settings.url),
        "queue": traffic.QUEUE,
        "configuration": traffic.describe_configuration(CONFIGURATION),
        **seeded,
        "pipeline": pipeline,
        "collected": {
            "blobs": sum(each.get("deleted_blobs", 0) for each in (collected, orphans, applied)),
            "bytes": sum(each.get("bytes_reclaimed", 0) for each in (collected, orphans, applied)),
            "kept_still_referenced": collected.get("kept_still_referenced", 0),
            "kept_by_filter_false_positive": collected.get("kept_by_filter_false_positive", 0),
            "orphans": orphans.get("deleted_blobs", 0),
        },
        "repaired": {
            "mailboxes": counters.get("processed_mailboxes", 0),
            "counters": counters.get("corrected_counters", 0),
            "projection_entries": counters.get("projection_inconsistencies", 0),
        },
        "cleaned": {
            name: {
                "browse_start": [_iso(before["browse_start"]), _iso(queues_after[name]["browse_start"])],
                "content_start": [_iso(before["content_start"]), _iso(queues_after[name]["content_start"])],
                "rows_deleted": before["rows"] - queues_after[name]["rows"],
            }
            for name, before in queues_before.items()
        },
        "tables": {"before": tables_before, "after": tables_after},
        "seconds": round(time.monotonic() - started, 1),
    }


def _iso(micros: int) -> str:
    return to_datetime(micros).isoformat(timespec="seconds")


def _place(summary: dict[str, Any]) -> str:
    return f"in {summary['data_dir']}" if summary["data_dir"] is not None else f"on {summary['url']}"


def _ui(summary: dict[str, Any]) -> str:
    if summary["data_dir"] is not None:
        return "make ui"
    return (
        "make ui-distributed (or dagster dev -w workspace.yaml with this run's MAILQ_URL, and its "
        "MAILQ_PIPELINE_DIR if it had one)"
    )


def _hm(iso: str) -> str:
    return iso[11:16]


def describe(summary: dict[str, Any]) -> list[str]:
    """The summary as text for a person: the runtime's part, the run's figures, then the outcome."""
    t, d, r, m = (summary[k] for k in ("traffic", "delivery", "removal", "mailboxes"))
    worker, pipeline, g = m["worker"], summary["pipeline"], summary["generations"]
    checks, repaired = pipeline["checks"], summary["repaired"]
    passed = sum(c["passed"] for c in checks.values())
    cleaned = [
        f"{name}: browse_start {_hm(c['browse_start'][0])} -> {_hm(c['browse_start'][1])}, content_start "
        f"{_hm(c['content_start'][0])} -> {_hm(c['content_start'][1])}, {c['rows_deleted']} row(s) deleted"
        for name, c in summary["cleaned"].items()
    ]
    before, after = summary["tables"]["before"], summary["tables"]["after"]
    return [
        f"mailq demo {_place(summary)}: {t['enqueued']} mails through queue {summary['queue']!r}, "
        f"then the maintenance pipeline ({summary['seconds']} s)",
        "",
        f"traffic      {t['enqueued']} mails enqueued ({human_bytes(t['bytes'])}, {t['delayed']} delayed) "
        f"over {t['simulated_span_hours']} simulated hours; {r['removed']} spam mails removed by sender",
        f"delivery     {d['delivered'] + worker['delivered']} mails delivered as "
        f"{d['appended'] + worker['appended']} INBOX messages, {d['retried'] + worker['retried']} retried, "
        f"{d['rejected'] + worker['dead_lettered']} dead-lettered; {m['queue_size_after']} mails "
        "still queued (delayed)",
        f"mailboxes    {m['seen']} marked read, {m['flagged']} flagged, {m['archived']} archived, "
        f"{m['expunged']} expunged",
        f"faults       {len(summary['faults'])} operations died between their writes: "
        + ", ".join(f"{f['operation']} ({f['point'].replace('_', ' ')})" for f in summary["faults"]),
        f"generations  rotated twice: current rg{g['current']}; eligible: "
        + (", ".join(f"rg{n}" for n in g["eligible"]) or "none"),
        "",
        f"pipeline ({', '.join(job.name for job in DEMO_JOBS)}):",
        *(f"  {line}" for run in pipeline["runs"] for line in describe_run(run)),
        "",
        f"collected    {summary['collected']['blobs']} blobs, {human_bytes(summary['collected']['bytes'])} "
        f"(blobs {before['blobs']} -> {after['blobs']}, blob_deletions {before['blob_deletions']} -> "
        f"{after['blob_deletions']})",
        f"repaired     {repaired['counters']} counters, {repaired['projection_entries']} projection entries, "
        f"in {repaired['mailboxes']} mailboxes",
        f"cleaned      {'; '.join(cleaned) or 'no queue'}",
        f"checks       {passed} of {len(checks)} passed" + ("" if pipeline["success"] else "; a run FAILED"),
        "",
        f"next: {_ui(summary)}, then open http://127.0.0.1:3000 (Lineage, then the Catalog: each "
        "materialisation's metadata, checks, sensors)",
    ]
