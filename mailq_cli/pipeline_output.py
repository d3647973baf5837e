"""The pipeline's runs as text: a line or two per materialisation (in lineage order), one per check, then
the run; what `mailq gc`, `counters recompute`, `queue cleanup` and `demo` print."""

from .output import Report
from .pipeline_run import EXIT_RUN_FAILED


def human_bytes(count: int) -> str:
    """A size in bytes in human units (powers of 1000), as a person reads it on the console."""
    size = float(count)
    for unit in ("bytes", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{count} bytes" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


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
    reclaimed = human_bytes(f["bytes_reclaimed"])
    return [
        f"collected    {f['deleted_blobs']} of {f['concerned_blobs']} blob(s) deleted, "
        f"{reclaimed} reclaimed; kept {f['kept_still_referenced']} still referenced, "
        f"{f['kept_by_filter_false_positive']} by a false positive of the filter; {f['retired_deletions']} "
        f"deletion row(s) of live blobs retired; {f['delete_errors']} error(s); {f['mode']}"
    ]


def _plan(f: dict) -> list[str]:
    to_reclaim = human_bytes(f["bytes_to_reclaim"])
    lines = [
        f"plan         {f['plan_id']}: would delete {f['blobs_to_delete']} of {f['concerned_blobs']} "
        f"blob(s), {to_reclaim}; kept {f['kept_still_referenced']} still referenced, "
        f"{f['kept_by_filter_false_positive']} by a false positive of the filter; {f['mode']}",
        *_filter(f),
        *_text_table([{**row, "size": human_bytes(row["bytes"])} for row in f["per_generation"]]),
    ]
    if f["blobs_to_delete"]:
        lines.append(f"plan         review it, then: {f['apply_with']}")
    return lines


def _filter(f: dict) -> list[str]:
    """The Bloom filter a plan was marked with, if the mark built one (a few blobs are looked up instead)."""
    if f["false_positive_probability"] is None:
        return ["plan         no Bloom filter was built"]
    return [f"plan         salt {f['salt']}, false positive probability {f['false_positive_probability']}"]


def _applied(f: dict) -> list[str]:
    kept = "; ".join(f"{row['blobs']} {row['reason']}" for row in f["kept"]) or "none kept"
    lines = [
        f"applied      plan {f['plan_id']}: {f['deleted_blobs']} of {f['planned_blobs']} blob(s) deleted, "
        f"{human_bytes(f['bytes_reclaimed'])} reclaimed; {kept}"
    ]
    if "note" in f:
        lines.append(f"applied      {f['note']}")
    return lines


def _orphans(f: dict) -> list[str]:
    owners = f"{f['orphan_owners']} owner(s) found nowhere, holding {f['orphan_references']} reference(s)"
    if f["dry_run"]:
        return [
            f"orphans      dry run: {f['orphans_found']} orphan blob(s) would be deleted",
            f"orphans      dry run: {owners}, would be released",
        ]
    return [
        f"orphans      {f['orphans_found']} orphan blob(s), {f['deleted_blobs']} deleted, "
        f"{human_bytes(f['bytes_reclaimed'])} reclaimed",
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


def _overview(f: dict) -> list[str]:
    return [
        f"queues       {f['queues']} queue(s): {f['live_mails']} live mail(s) ({f['ready_mails']} ready, "
        f"{f['in_flight_mails']} in flight, {f['delayed_mails']} delayed), {f['dead_letters']} dead letter(s)"
    ]


def _domains(f: dict) -> list[str]:
    return [
        f"domains      {f['domains']} destination domain(s), counted by domain: {f['waiting_by_domain']} "
        f"waiting, {f['deferred_by_domain']} deferred, {f['held_by_domain']} held"
    ]


def _dead_letters(f: dict) -> list[str]:
    return [f"dead letters {f['dead_letters']} in {f['queues_with_dead_letters']} queue(s)"]


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
    "mail_queue_overview": _overview,
    "mail_queue_domains": _domains,
    "mail_queue_dead_letters": _dead_letters,
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


def report(summary: dict, heading: list[str] | None = None) -> Report:
    return Report(
        summary, [*(heading or []), *describe_run(summary)], 0 if summary["success"] else EXIT_RUN_FAILED
    )
