"""The maintenance jobs. They run in one process so that every Spark step shares one session."""

import dagster as dg

from resources import MailqRuntime

from . import blobs, gc_plan, mailboxes, orphan_sweep, queue, queue_overview
from .mark_steps import build_live_reference_filter, read_deletion_sets, read_reference_generations

# The GC's jobs are op-based: their destructive steps are ops that report materialisations of asset specs
# (reported.py), which the UI's "Materialize all" never selects; these jobs are the only way to run them.


@dg.job(description="One GC iteration of record 39 over the eligible generations.")
def blob_gc_job() -> None:
    generations = read_reference_generations()
    deletions = read_deletion_sets(generations)
    blobs.collected_blobs(generations, deletions, build_live_reference_filter(deletions))


@dg.job(description="The full sweep of unreferenced blobs that no deletion names.")
def orphan_sweep_job() -> None:
    orphan_sweep.orphan_blobs(read_reference_generations())


@dg.job(description="One GC iteration and the orphan sweep in one run (`mailq gc --orphans`).")
def blob_gc_and_orphan_sweep_job() -> None:
    generations = read_reference_generations()
    deletions = read_deletion_sets(generations)
    blobs.collected_blobs(generations, deletions, build_live_reference_filter(deletions))
    orphan_sweep.orphan_blobs(generations)


@dg.job(
    description="The GC's dry run (`mailq gc --dry-run`): one iteration's mark, written as a plan to review "
    "and apply with gc_apply_job; deletes nothing."
)
def gc_plan_job() -> None:
    deletions = read_deletion_sets(read_reference_generations())
    gc_plan.gc_plan(deletions, build_live_reference_filter(deletions))


@dg.job(
    config={"ops": {"orphan_blobs": {"config": {"dry_run": True}}}},
    description="A GC plan and the orphan sweep's dry run in one run (`mailq gc --dry-run --orphans`).",
)
def gc_plan_and_orphan_sweep_job() -> None:
    generations = read_reference_generations()
    deletions = read_deletion_sets(generations)
    gc_plan.gc_plan(deletions, build_live_reference_filter(deletions))
    orphan_sweep.orphan_blobs(generations)


@dg.job(
    description="Apply a GC plan (`mailq gc --apply PLAN_ID`): by default the newest plan not applied yet, "
    "or the one its config names. It deletes the plan's blobs that are still eligible, still have their row "
    "and no reference now, and keeps the others, with why."
)
def gc_apply_job() -> None:
    gc_plan.applied_gc_plan()


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
    # The overviews only look: they run in their own jobs. The GC's steps are no assets (above).
    selection=mailbox_counters_job.selection | queue_cleanup_job.selection,
    description="The maintenance assets, in lineage order: the mailbox repair and the queue clean-up (the "
    "blob GC and the orphan sweep run in blob_gc_and_orphan_sweep_job, the overviews in queue_overview_job "
    "and dead_letters_job).",
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
