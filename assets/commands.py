"""The maintenance pipeline's `mailq` commands, which `mailq_runtime.cli` imports once one is named:

    mailq gc [--dry-run] [--exact] [--orphans]   one GC iteration: the blob_gc assets (and the orphan sweep);
                                                 --dry-run writes a plan (gc_plan) instead
    mailq gc --apply PLAN_ID                     apply a plan: delete its blobs still collectable
    mailq blobs explain BLOB_ID                  a blob's generation, rows, references, deletions, last GC
    mailq counters recompute [--user U [--mailbox NAME]] [--rate N]
                                                 the mailboxes group: counters and projection repaired
    mailq queue cleanup                          the mail_queue group: slice statistics, then the clean-up
    mailq generation rotate                      the next reference generation and GC iteration
    mailq demo                                   traffic through the runtime, then every asset (assets.demo)

They run the code location's own jobs, through `runner.run_job`, and print the figures of each
materialisation and each check's result, as text or, with --json, as one JSON document.
Dagster's console log is kept at WARNING; the run's events all go to the instance (the one of
DAGSTER_HOME when it is set, so the UI shows the runs). Their names and help are `cli.PIPELINE_COMMANDS`.
"""

import argparse
import os
import time
from pathlib import Path
from typing import Any

from mailq_runtime import cli
from mailq_runtime.cli import PIPELINE_COMMANDS, Report
from mailq_runtime.errors import InvalidInput, shown
from mailq_runtime.model import BlobId
from mailq_runtime.pacing import check_rate
from mailq_runtime.runtime import Runtime, build
from mailq_runtime.settings import URL_VARIABLE, Settings

from . import definitions, gc_records, jobs, runner
from .mailboxes import resolve_scope
from .metadata import when

EXIT_RUN_FAILED = 1


# Shared helpers ---------------------------------------------------------------------------------------------


def pipeline_url(url: str | None) -> str:
    """The runtime URL the Spark jobs read: the settings' own, with the data dir made absolute. The store
    must exist: maintenance of a place that holds none is a mistake (NoStore), not an empty run."""
    settings = Settings.from_url(url).absolute()  # a bad URL is bad input before anything runs
    # Opened once here, writing nothing, so a missing or unusable store is one line before Dagster and
    # Spark start.
    build(settings).close()
    return settings.url


def check_dagster_home() -> None:
    """Runs are recorded in DAGSTER_HOME's instance when it is set: it must then be an existing directory."""
    home = os.environ.get("DAGSTER_HOME")
    if home and not (os.path.isabs(os.path.expanduser(home)) and os.path.isdir(os.path.expanduser(home))):
        raise InvalidInput(
            f"DAGSTER_HOME {shown(home)} is not an existing directory given by its absolute path"
        )


def run_pipeline(job: str, url: str, command: str, run_config: dict | None = None) -> dict:
    """Run the code location's job named `job` on `url` and return `runner.summarise`'s figures, with
    the job's name, the run's duration and where it was recorded."""
    check_dagster_home()
    started = time.monotonic()
    result = runner.run_job(
        job, url, {**runner.QUIET_CONSOLE, **(run_config or {})}, tags={"mailq/command": command}
    )
    summary = {"job": job, **runner.summarise(result)}
    summary["seconds"] = round(time.monotonic() - started, 1)
    summary["instance"] = os.environ.get("DAGSTER_HOME") or None
    return summary


def _text_table(records: list[dict], indent: str = "    ") -> list[str]:
    """A table of the run's metadata (its records) as aligned text."""
    if not records:
        return []
    rows = [list(records[0]), *([str(value) for value in record.values()] for record in records)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def _generations(f: dict) -> list[str]:
    eligible = ", ".join(f"rg{g}" for g in f["eligible_generations"])
    return [
        f"generations  current rg{f['current_generation']}, GC iteration gci{f['gc_iteration']}; eligible: "
        + (eligible or "none (generation g is collected once the current one is g+2)")
    ]


def _deletions(f: dict) -> list[str]:
    return [
        f"deletions    {f['deletions']} deletion(s) in eligible generations, {f['concerned_blobs']} blob(s)"
    ]


def _filter(f: dict) -> list[str]:
    if not f["references_read"]:
        return [f"filter       no Bloom filter: {f['live_check']} ({f['why']})"]
    return [
        f"filter       {len(f['generations'])} Bloom filter(s) of the live references, false positive "
        f"probability {f['false_positive_probability']}, built in {f['build_seconds']} s"
    ]


def _collected(f: dict) -> list[str]:
    return [
        f"collected    {f['deleted_blobs']} of {f['concerned_blobs']} blob(s) deleted, "
        f"{f['size_reclaimed']} reclaimed; kept {f['kept_still_referenced']} still referenced, "
        f"{f['kept_by_filter_false_positive']} by a false positive of the filter; {f['retired_deletions']} "
        f"deletion row(s) of live blobs retired; {f['delete_errors']} error(s); {f['mode']}"
    ]


def _plan(f: dict) -> list[str]:
    lines = [
        f"plan         {f['plan_id']}: would delete {f['blobs_to_delete']} of {f['concerned_blobs']} "
        f"blob(s), {f['size_to_reclaim']}; kept {f['kept_still_referenced']} still referenced, "
        f"{f['kept_by_filter_false_positive']} by a false positive of the filter; {f['mode']}",
        f"plan         salt {f['salt']}, false positive probability {f['false_positive_probability']}",
        *_text_table(f["per_generation"]),
    ]
    if f["blobs_to_delete"]:
        lines.append(f"plan         review it, then: {f['apply_with']}")
    return lines


def _applied(f: dict) -> list[str]:
    kept = "; ".join(f"{row['blobs']} {row['reason']}" for row in f["kept"]) or "none kept"
    lines = [
        f"applied      plan {f['plan_id']}: {f['deleted_blobs']} of {f['planned_blobs']} blob(s) deleted, "
        f"{f['size_reclaimed']} reclaimed; {kept}"
    ]
    if "note" in f:
        lines.append(f"applied      {f['note']}")
    return lines


def _orphans(f: dict) -> list[str]:
    owners = f"{f['orphan_owners']} owner(s) found nowhere, holding {f['orphan_references']} reference(s)"
    if f["dry_run"]:
        return [
            f"orphans      dry run: {f['orphans']} orphan blob(s) would be deleted",
            f"orphans      dry run: {owners}, would be released",
        ]
    return [
        f"orphans      {f['orphans']} orphan blob(s), {f['deleted']} deleted, "
        f"{f['size_reclaimed']} reclaimed",
        f"orphans      {owners}: {f['references_released']} released for the next GC iteration",
    ]


# Corrections a command lists; the materialisation's table holds more (mailboxes.CORRECTIONS_SHOWN).
CORRECTIONS_LISTED = 20


def _pace(rate: float | str) -> str:
    return rate if isinstance(rate, str) else f"at most {rate:g} a second"


def _counters(f: dict) -> list[str]:
    healed = f["projection_inconsistencies"]
    lines = [
        f"scope        {f['scope']}; repairs {_pace(f['max_repairs_per_second'])}",
        f"counters     {f['processed_mailboxes']} mailbox(es) processed, "
        f"{f['corrected_counters']} counter(s) corrected, {len(f['failed_mailboxes'])} failed",
        f"projection   {healed} entr{'y' if healed == 1 else 'ies'} healed from the source of truth "
        f"({f['orphan_projection_entry']} orphan, {f['missing_projection_entry']} missing, "
        f"{f['outdated_projection_entry']} outdated)",
    ]
    if f["corrected_counters"]:
        shown_rows = f["corrections"][:CORRECTIONS_LISTED]
        lines += _text_table(shown_rows)
        if f["corrected_counters"] > len(shown_rows):
            lines.append(f"    ... and {f['corrected_counters'] - len(shown_rows)} more")
    return lines


def _slices(f: dict) -> list[str]:
    return [f"slices       {f['queues']} queue(s), {f['slices']} slice(s), {f['live_mails']} live mail(s)"]


def _cleanup(f: dict) -> list[str]:
    return [
        f"cleanup      {f['queues_cleaned']} of {f['queues']} queue(s) advanced",
        *_text_table(f["cleanup"]),
    ]


# In lineage order. An asset without a renderer is shown as its scalar figures.
RENDERERS = {
    "reference_generations": _generations,
    "deletion_sets": _deletions,
    "live_reference_filter": _filter,
    "collected_blobs": _collected,
    "gc_plan": _plan,
    "applied_gc_plan": _applied,
    "orphan_blobs": _orphans,
    "mailbox_counters": _counters,
    "mail_queue_slices": _slices,
    "mail_queue_cleanup": _cleanup,
}


def describe_run(summary: dict) -> list[str]:
    """The run's figures as text: a line or two per materialisation, one per check, then the run."""
    lines = []
    order = [*RENDERERS, *sorted(set(summary["assets"]) - set(RENDERERS))]
    for name in order:
        figures = summary["assets"].get(name)
        if figures is None:
            continue
        render = RENDERERS.get(name)
        if render is not None:
            lines += render(figures)
        else:
            scalars = ", ".join(f"{k} {v}" for k, v in figures.items() if isinstance(v, int | float | str))
            lines.append(f"{name:<12} {scalars}")
    for name, check in sorted(summary["checks"].items()):
        verdict = "passed" if check["passed"] else "WARNING" if check["severity"] == "WARN" else "FAILED"
        lines.append(f"check        {name}: {verdict}")
        if not check["passed"]:
            lines += [f"    {key}: {value}" for key, value in check["metadata"].items()]
    for failure in summary["failures"]:
        first = failure["error"].splitlines()[0] if failure["error"] else "failed"
        lines.append(f"FAILED       step {failure['step']}: {first}")
    recorded = (
        f"recorded in {summary['instance']}"
        if summary["instance"]
        else "ephemeral: set DAGSTER_HOME to keep it"
    )
    lines.append(
        f"run          {summary['run_id']} of {summary['job']} in {summary['seconds']} s ({recorded})"
    )
    return lines


def _report(summary: dict, heading: list[str] | None = None) -> Report:
    return Report(
        summary, [*(heading or []), *describe_run(summary)], 0 if summary["success"] else EXIT_RUN_FAILED
    )


# Subcommands ------------------------------------------------------------------------------------------------


def _gc(args: argparse.Namespace) -> Report:
    url = pipeline_url(args.url)
    if args.apply is not None:
        if args.dry_run or args.exact or args.orphans:
            raise InvalidInput("gc --apply takes no other option: the plan says what to delete")
        # Refused here, before Spark starts, as the asset would refuse it.
        plan_id = gc_records.check_plan_id(args.apply)
        base = definitions.pipeline_dir(url)
        if not gc_records.exists(base, gc_records.PLANS, plan_id):
            raise InvalidInput(
                f"unknown GC plan {plan_id}: none at {gc_records.path(base, gc_records.PLANS, plan_id)}"
            )
        ops: dict[str, Any] = {"applied_gc_plan": {"config": {"plan_id": plan_id}}}
        return _report(run_pipeline(jobs.gc_apply_job.name, url, "gc --apply", {"ops": ops}))
    if args.dry_run:
        job = jobs.gc_plan_and_orphan_sweep_job if args.orphans else jobs.gc_plan_job
        ops = {"gc_plan": {"config": {"exact": args.exact}}}
    else:
        job = jobs.blob_gc_and_orphan_sweep_job if args.orphans else jobs.blob_gc_job
        ops = {"collected_blobs": {"config": {"exact": args.exact}}}
    if args.orphans:
        ops["orphan_blobs"] = {"config": {"dry_run": args.dry_run}}
    return _report(run_pipeline(job.name, url, "gc", {"ops": ops}))


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
    url = pipeline_url(args.url)
    with Runtime.open(url) as runtime:
        facts = runtime.blobs.explain(args.blob_id)
    last = gc_records.latest_about(definitions.pipeline_dir(url), str(facts.blob_id))
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
        "blob_id", metavar="BLOB_ID", type=cli.checked_argument(lambda text: str(BlobId.parse(text)))
    )
    explain.set_defaults(handler=_blobs_explain)


def _counters_recompute(args: argparse.Namespace) -> Report:
    url = pipeline_url(args.url)
    # Resolved here as the asset will, so that an unknown user or mailbox is one line before Spark starts.
    with Runtime.open(url) as runtime:
        resolve_scope(runtime.mailboxes, args.user, args.mailbox)
    config = {"user": args.user, "mailbox": args.mailbox, "max_repairs_per_second": args.rate}
    ops = {"mailbox_counters": {"config": config}}
    return _report(run_pipeline(jobs.mailbox_counters_job.name, url, "counters recompute", {"ops": ops}))


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
        type=cli.checked_argument(check_rate),
        metavar="N",
        help="at most N repairs (projection entries healed, counters reset) a second (default: unlimited)",
    )
    recompute.set_defaults(handler=_counters_recompute)


def _queue_cleanup(args: argparse.Namespace) -> Report:
    return _report(run_pipeline(jobs.queue_cleanup_job.name, pipeline_url(args.url), "queue cleanup"))


def add_queue_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("queue", help=PIPELINE_COMMANDS["queue"])
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    cleanup = actions.add_parser(
        "cleanup", help="per-slice statistics, then advance browse_start and clean the content before it"
    )
    cleanup.set_defaults(handler=_queue_cleanup)


def _generation_rotate(args: argparse.Namespace) -> Report:
    url = pipeline_url(args.url)
    with Runtime.open(url) as runtime:
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


DEMO_DIR = Path(".mailq-demo")


def _demo(args: argparse.Namespace) -> Report:
    # Imported here: only this subcommand generates traffic.
    from . import demo

    if args.url is not None and args.data_dir is not None:
        raise InvalidInput("give the demo --url or --data-dir, not both")
    check_dagster_home()  # before the data dir is wiped
    # The data dir given is the demo's own; else the URL given or MAILQ_URL names the deployment it makes;
    # else its own default data dir.
    url = None if args.data_dir is not None else args.url or os.environ.get(URL_VARIABLE)
    if url is None:
        settings = demo.embedded(args.data_dir or DEMO_DIR, args.mails)
    else:
        settings = demo.new_deployment(url, args.mails)
    summary = demo.run(settings, mails=args.mails)
    return Report(summary, demo.describe(summary), 0 if summary["pipeline"]["success"] else EXIT_RUN_FAILED)


def add_demo_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help=PIPELINE_COMMANDS["demo"],
        description="Without --data-dir, the deployment of --url (default $MAILQ_URL), which must not exist "
        f"yet, else the data dir {DEMO_DIR}.",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        help=f"the demo's own embedded data dir, wiped at start (default: {DEMO_DIR}, unless a URL is given)",
    )
    parser.add_argument(
        "--mails",
        type=cli.count_argument("mails"),
        default=3000,
        metavar="N",
        help="how many mails to generate",
    )
    parser.set_defaults(handler=_demo)


PIPELINE_SUBCOMMANDS = [
    add_gc_parser,
    add_blobs_parser,
    add_counters_parser,
    add_queue_parser,
    add_generation_parser,
    add_demo_parser,
]
