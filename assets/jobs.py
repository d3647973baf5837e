"""The maintenance jobs. They run in one process so that every Spark step shares one session."""

import dagster as dg

from resources import MailqRuntime

from . import blobs, gc_plan, mailboxes, orphan_sweep, queue, queue_overview

blob_gc_job = dg.define_asset_job(
    "blob_gc_job",
    selection=dg.AssetSelection.assets(
        blobs.reference_generations, blobs.deletion_sets, blobs.live_reference_filter, blobs.collected_blobs
    ),
    description="One GC iteration of record 39 over the eligible generations.",
)
orphan_sweep_job = dg.define_asset_job(
    "orphan_sweep_job",
    selection=dg.AssetSelection.assets(orphan_sweep.orphan_blobs),
    description="The full sweep of unreferenced blobs that no deletion names.",
)
blob_gc_and_orphan_sweep_job = dg.define_asset_job(
    "blob_gc_and_orphan_sweep_job",
    selection=blob_gc_job.selection | orphan_sweep_job.selection,
    description="One GC iteration and the orphan sweep in one run (`mailq gc --orphans`).",
)
gc_plan_job = dg.define_asset_job(
    "gc_plan_job",
    selection=dg.AssetSelection.assets(
        blobs.reference_generations, blobs.deletion_sets, blobs.live_reference_filter, gc_plan.gc_plan
    ),
    description="The GC's dry run (`mailq gc --dry-run`): one iteration's mark, written as a plan to review "
    "and apply with gc_apply_job; deletes nothing.",
)
gc_plan_and_orphan_sweep_job = dg.define_asset_job(
    "gc_plan_and_orphan_sweep_job",
    selection=gc_plan_job.selection | orphan_sweep_job.selection,
    config={"ops": {"orphan_blobs": {"config": {"dry_run": True}}}},
    description="A GC plan and the orphan sweep's dry run in one run (`mailq gc --dry-run --orphans`).",
)
gc_apply_job = dg.define_asset_job(
    "gc_apply_job",
    selection=dg.AssetSelection.assets(gc_plan.applied_gc_plan),
    description="Apply a GC plan (`mailq gc --apply PLAN_ID`; its config names the plan): delete its "
    "blobs that are still eligible, still have their row and no reference now; keep the others, with why.",
)
mailbox_counters_job = dg.define_asset_job(
    "mailbox_counters_job",
    selection=dg.AssetSelection.groups(mailboxes.GROUP),
    description="Heal the mailbox projection from the source of truth and reset the counters that differ "
    "(record 23).",
)
queue_cleanup_job = dg.define_asset_job(
    "queue_cleanup_job",
    # Named, not the group's: the group also holds the overviews, which have jobs of their own.
    selection=dg.AssetSelection.assets(queue.mail_queue_slices, queue.mail_queue_cleanup),
    description="Per-slice statistics of every mail queue, then advance browse_start and delete the "
    "content before it (record 32).",
)
queue_overview_job = dg.define_asset_job(
    "queue_overview_job",
    selection=dg.AssetSelection.assets(queue_overview.mail_queue_overview, queue_overview.mail_queue_domains),
    description="What the mail queues hold: each queue's mails by state, and the mails per destination "
    "domain by state and age (qshape's view).",
)
dead_letters_job = dg.define_asset_job(
    "dead_letters_job",
    selection=dg.AssetSelection.assets(queue_overview.mail_queue_dead_letters),
    description="The dead letters by queue, reason and age; warns when they grew since the last run.",
)
maintenance_job = dg.define_asset_job(
    "maintenance_job",
    # The overviews only look: they run in their own jobs, and the demo's run stays the maintenance.
    selection=dg.AssetSelection.all()
    - queue_overview_job.selection
    - dead_letters_job.selection
    - dg.AssetSelection.assets(gc_plan.gc_plan, gc_plan.applied_gc_plan),
    description="Every maintenance asset, in lineage order (the overviews of what the queues hold run "
    "in queue_overview_job and dead_letters_job; GC plans in gc_plan_job and gc_apply_job).",
)


@dg.op
def rotate_reference_generation(context: dg.OpExecutionContext, mailq: MailqRuntime) -> None:
    """Emit the next reference generation and GC iteration (record 39's events)."""
    generation, iteration = mailq.runtime.generations.rotate()
    context.log.info(f"reference generation rg{generation}, GC iteration gci{iteration}")
    context.add_output_metadata({"reference_generation": generation, "gc_iteration": iteration})


@dg.job(description="Rotate the reference generation; the GC sensor picks up what becomes eligible.")
def rotate_generation_job() -> None:
    rotate_reference_generation()
