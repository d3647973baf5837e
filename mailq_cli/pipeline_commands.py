"""The maintenance pipeline's `mailq` commands, which `main` imports once one is named:

    mailq gc [--dry-run] [--exact] [--orphans]   one GC iteration: the blob_gc assets (and the orphan sweep);
                                                 --dry-run writes a plan (gc_plan) instead
    mailq gc --apply PLAN_ID                     apply a plan: delete its blobs still collectable
    mailq blobs explain BLOB_ID                  a blob's generation, rows, references, deletions, last GC
    mailq counters recompute [--user U [--mailbox NAME]] [--rate N]
                                                 the mailboxes group: counters and projection repaired
    mailq queue cleanup                          the mail_queue group: slice statistics, then the clean-up
    mailq generation rotate                      the next reference generation and GC iteration

They run the code location's own jobs (`pipeline_run.run_pipeline`) and print the figures of each
materialisation and each check's result (`pipeline_output`), as text or, with --json, as one JSON document.
`mailq demo` is `demo_command`'s.
"""

import argparse
from typing import Any

from assets import definitions, gc_records, jobs
from assets.mailboxes import resolve_scope
from assets.metadata import when
from mailq_runtime.errors import InvalidInput
from mailq_runtime.model import BlobId
from mailq_runtime.pacing import check_rate
from mailq_runtime.runtime import Runtime

from .arguments import PIPELINE_COMMANDS, AddParser, checked_argument
from .output import Report
from .pipeline_output import report
from .pipeline_run import pipeline_settings, run_pipeline


def _gc(args: argparse.Namespace) -> Report:
    settings = pipeline_settings(args.url)
    if args.apply is not None:
        if args.dry_run or args.exact or args.orphans:
            raise InvalidInput("gc --apply takes no other option: the plan says what to delete")
        # Refused here, before Spark starts, as the asset would refuse it.
        plan_id = gc_records.check_plan_id(args.apply)
        outputs = definitions.outputs(settings)
        if not gc_records.exists(outputs, gc_records.PLANS, plan_id):
            raise InvalidInput(
                f"unknown GC plan {plan_id}: none at {gc_records.path(outputs, gc_records.PLANS, plan_id)}"
            )
        ops: dict[str, Any] = {"applied_gc_plan": {"config": {"plan_id": plan_id}}}
        return report(run_pipeline(jobs.gc_apply_job.name, settings, "gc --apply", {"ops": ops}))
    if args.dry_run:
        job = jobs.gc_plan_and_orphan_sweep_job if args.orphans else jobs.gc_plan_job
        ops = {"gc_plan": {"config": {"exact": args.exact}}}
    else:
        job = jobs.blob_gc_and_orphan_sweep_job if args.orphans else jobs.blob_gc_job
        ops = {"collected_blobs": {"config": {"exact": args.exact}}}
    if args.orphans:
        ops["orphan_blobs"] = {"config": {"dry_run": args.dry_run}}
    return report(run_pipeline(job.name, settings, "gc", {"ops": ops}))


def add_gc_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("gc", help=PIPELINE_COMMANDS["gc"])
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="write a plan of what would be deleted (printed with its id), delete nothing",
    )
    parser.add_argument(
        "--apply",
        metavar="PLAN_ID",
        help="delete the blobs of that plan that are still collectable (each re-checked first)",
    )
    parser.add_argument(
        "--exact",
        action="store_true",
        help="an exact anti-join against the references instead of the Bloom filter",
    )
    parser.add_argument(
        "--orphans",
        action="store_true",
        help="also sweep the blobs that neither a reference nor a deletion names",
    )
    parser.set_defaults(handler=_gc)


def _blobs_explain(args: argparse.Namespace) -> Report:
    settings = pipeline_settings(args.url)
    with Runtime(settings) as runtime:
        facts = runtime.blobs.explain(args.blob_id)
    last = gc_records.latest_about(definitions.outputs(settings), str(facts.blob_id))
    data = {
        "blob_id": str(facts.blob_id),
        "generation": facts.blob_id.generation,
        "state": facts.state,
        "current_generation": facts.current_generation,
        "blobs_row": facts.size is not None,
        "size": facts.size,
        "content": facts.content,
        "references": [{"owner": o, "generation": g} for o, g in facts.references],
        "deletions": [
            {"deleted_at": when(at), "gc_iteration": i, "owner": owner} for at, i, owner in facts.deletions
        ],
        "last_gc": _last_gc(last),
    }
    state = {
        "eligible": "eligible: the GC may collect it",
        "protected": "protected: the generation before the current one",
        "current": "current: new saves go to it",
        "not started": "not started: no rotation reached it yet",
    }[facts.state]
    lines = [
        f"blob         {data['blob_id']}",
        f"generation   rg{facts.blob_id.generation}, {state} (current rg{facts.current_generation})",
        "blobs row    " + (f"yes, {facts.size} bytes" if facts.size is not None else "no"),
        f"content      {'yes' if facts.content else 'no'}",
        f"references   {len(facts.references)}" + "".join(f"\n    {o} (rg{g})" for o, g in facts.references),
        f"deletions    {len(facts.deletions)}"
        + "".join(
            f"\n    {d['deleted_at']} (gci{d['gc_iteration']}), released by "
            + (d["owner"] or "an unrecorded owner")
            for d in data["deletions"]
        ),
        f"last GC      {data['last_gc']['summary']}",
    ]
    if not (facts.size is not None or facts.content or facts.references or facts.deletions or last):
        lines.append("nothing of this blob anywhere: never saved here, or collected and its record removed")
    return Report(data, "\n".join(lines).splitlines())


def _last_gc(last: tuple[str, dict] | None) -> dict:
    """What the newest plan or GC run record naming the blob says, as a summary and its fields."""
    if last is None:
        return {"summary": "never examined by a GC run or plan kept here"}
    kind, row = last
    if kind == gc_records.PLANS:
        how = row["found_by"]
        if row["salt"]:
            how += f" of salt {row['salt']}, false positive probability {row['false_positive_probability']}"
        summary = f"in plan {row['plan_id']} of {when(row['planned_at'])}, not applied since: {how}"
        return {"summary": summary, "plan_id": row["plan_id"], "found_by": row["found_by"]}
    run = f"run {row['run_id']}" + (f" applying plan {row['plan_id']}" if row["plan_id"] else "")
    verb = "deleted by" if row["outcome"] == gc_records.DELETED else f"{row['outcome']}, in"
    summary = f"{verb} {run} at {when(row['at'])} ({row['detail']})"
    return {"summary": summary, "run_id": row["run_id"], "plan_id": row["plan_id"], "outcome": row["outcome"]}


def add_blobs_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("blobs", help=PIPELINE_COMMANDS["blobs"])
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    explain = actions.add_parser(
        "explain",
        help="a blob's generation, row, content, references, deletions, and what the last GC did with it",
    )
    explain.add_argument(
        "blob_id", metavar="BLOB_ID", type=checked_argument(lambda text: str(BlobId.parse(text)))
    )
    explain.set_defaults(handler=_blobs_explain)


def _counters_recompute(args: argparse.Namespace) -> Report:
    settings = pipeline_settings(args.url)
    # Resolved here as the asset will, so that an unknown user or mailbox is one line before Spark starts.
    with Runtime(settings) as runtime:
        resolve_scope(runtime.mailboxes, args.user, args.mailbox)
    config = {"user": args.user, "mailbox": args.mailbox, "max_repairs_per_second": args.rate}
    ops = {"mailbox_counters": {"config": config}}
    return report(run_pipeline(jobs.mailbox_counters_job.name, settings, "counters recompute", {"ops": ops}))


def add_counters_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("counters", help=PIPELINE_COMMANDS["counters"])
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    recompute = actions.add_parser(
        "recompute", help="heal the projection from the source of truth and reset the counters that differ"
    )
    recompute.add_argument("--user", metavar="U", help="only the mailboxes of this user (default: all)")
    recompute.add_argument(
        "--mailbox", metavar="NAME", help="only this mailbox of the --user, by its name (e.g. INBOX)"
    )
    recompute.add_argument(
        "--rate",
        type=checked_argument(check_rate),
        metavar="N",
        help="at most N repairs (projection entries healed, counters reset) a second (default: unlimited)",
    )
    recompute.set_defaults(handler=_counters_recompute)


def _queue_cleanup(args: argparse.Namespace) -> Report:
    return report(run_pipeline(jobs.queue_cleanup_job.name, pipeline_settings(args.url), "queue cleanup"))


def add_queue_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("queue", help=PIPELINE_COMMANDS["queue"])
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    cleanup = actions.add_parser(
        "cleanup", help="per-slice statistics, then advance browse_start and clean the content before it"
    )
    cleanup.set_defaults(handler=_queue_cleanup)


def _generation_rotate(args: argparse.Namespace) -> Report:
    settings = pipeline_settings(args.url)
    with Runtime(settings) as runtime:
        generation, iteration = runtime.generations.rotate()
        eligible = runtime.generations.eligible()
    data = {"reference_generation": generation, "gc_iteration": iteration, "eligible_generations": eligible}
    names = ", ".join(f"rg{g}" for g in eligible) or "none"
    return Report(
        data,
        [
            f"rotated to reference generation rg{generation}, GC iteration gci{iteration}; "
            f"eligible for collection: {names}"
        ],
    )


def add_generation_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("generation", help=PIPELINE_COMMANDS["generation"])
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    rotate = actions.add_parser("rotate", help="start the next reference generation and GC iteration")
    rotate.set_defaults(handler=_generation_rotate)


PIPELINE_SUBCOMMANDS: list[AddParser] = [
    add_gc_parser,
    add_blobs_parser,
    add_counters_parser,
    add_queue_parser,
    add_generation_parser,
]
