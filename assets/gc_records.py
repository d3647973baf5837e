"""What the GC keeps beyond an asset's output, which each materialisation overwrites: its plans and
what each run did with each blob, as Parquet beside the spark_parquet IO manager's outputs (so on a
cluster, on the storage its executors share):

    <base path>/gc_plans/<plan id>     the blobs a dry run found collectable (`gc_plan`), with why
    <base path>/gc_runs/<record id>    per blob examined, what a run did (`collected_blobs`,
                                       `applied_gc_plan`): deleted, or kept and why

An id is the run's start, UTC, then the first 8 hex digits of its Dagster run id: `20261123T064735Z-1a2b3c4d`.
Ids sort by time, which is how `mailq blobs explain` finds the latest record naming a blob. Spark writes
the records; this module reads them through `Outputs` (pyarrow), without a Spark session.
"""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.dataset as ds

from mailq_runtime.clock import to_datetime
from mailq_runtime.errors import InvalidInput, shown
from resources.outputs import Outputs

PLANS = "gc_plans"
RUNS = "gc_runs"
_ID = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{8}")

# What a run did with a blob (the `outcome` column of a run record).
DELETED = "deleted"
KEPT_REFERENCED = "kept: still referenced"
KEPT_FALSE_POSITIVE = "kept: Bloom false positive"
KEPT_DELETE_FAILED = "kept: its deletion failed"
KEPT_GONE = "kept: gone already (no blobs row)"
KEPT_REFERENCED_AGAIN = "kept: referenced again since the plan"
KEPT_NOT_ELIGIBLE = "kept: generation not eligible"

PLAN_SCHEMA = (
    "plan_id string, blob_id string, generation long, bytes long, deletions long, "
    "deletion_times array<long>, owners array<string>, found_by string, salt string, "
    "false_positive_probability double, planned_at long"
)

# A run record's columns (gc_mark.record_run), given when it is read: Spark may write no part file, and so
# no schema, for an empty one.
RUN_SCHEMA = (
    "record_id string, run_id string, plan_id string, blob_id string, generation long, outcome string, "
    "detail string, bytes long, at long"
)


def new_id(run_id: str, started: int) -> str:
    """The id of a plan or record of the run `run_id` that started at `started` (runtime micros)."""
    return f"{to_datetime(started):%Y%m%dT%H%M%SZ}-{run_id.replace('-', '')[:8]}"


def check_plan_id(text: str) -> str:
    # The id ends up in a path: only the shape new_id makes is accepted.
    if not isinstance(text, str) or not _ID.fullmatch(text):
        raise InvalidInput(
            f"invalid GC plan id {shown(text)}: expected YYYYMMDDTHHMMSSZ-<8 hex digits>, as "
            "`mailq gc --dry-run` prints it"
        )
    return text


def path(outputs: Outputs, kind: str, record_id: str) -> str:
    return outputs.path(kind, record_id)


def exists(outputs: Outputs, kind: str, record_id: str) -> bool:
    """Whether the record was written whole: Spark's _SUCCESS marks a committed write."""
    return outputs.is_file(path(outputs, kind, record_id) + "/_SUCCESS")


def _ids(outputs: Outputs, kind: str) -> list[str]:
    return [name for name in outputs.directories(outputs.path(kind)) if _ID.fullmatch(name)]


def _rows(
    outputs: Outputs,
    kind: str,
    record_id: str,
    columns: list[str] | None = None,
    where: ds.Expression | None = None,
) -> pa.Table | None:
    """A whole record's rows (of `columns`, matching `where`); None for one not written whole, or with no
    part file (Spark may write none for an empty one)."""
    if not exists(outputs, kind, record_id):
        return None
    return outputs.parquet(path(outputs, kind, record_id), columns=columns, where=where)


def newest_plan(outputs: Outputs) -> tuple[str, int] | None:
    """The newest plan written whole and how many blobs it holds; None when there is none."""
    for plan_id in sorted(_ids(outputs, PLANS), reverse=True):
        if exists(outputs, PLANS, plan_id):
            rows = _rows(outputs, PLANS, plan_id, columns=["blob_id"])
            return plan_id, 0 if rows is None else rows.num_rows
    return None


def newest_unapplied_plan(outputs: Outputs) -> str | None:
    """The newest plan with blobs that no application has recorded: what gc_apply_job applies when its
    config names none. Every blob of an applied plan has a row in the application's record, so a record
    of a plan with blobs is never empty."""
    applied = set()
    for record_id in _ids(outputs, RUNS):
        rows = _rows(outputs, RUNS, record_id, columns=["plan_id"])
        if rows is not None:
            applied.update(rows.column("plan_id").unique().to_pylist())
    for plan_id in sorted(_ids(outputs, PLANS), reverse=True):
        if plan_id in applied:
            continue
        rows = _rows(outputs, PLANS, plan_id, columns=["blob_id"])
        if rows is not None and rows.num_rows:
            return plan_id
    return None


def latest_about(outputs: Outputs, blob_id: str) -> tuple[str, dict] | None:
    """The newest plan or run record that names the blob: (PLANS or RUNS, its row), or None. Records are
    read newest first, each by its blob_id column, until one names it. A record that found the blob gone
    already (a plan applied twice) says less than the one that deleted it: the search goes on past it,
    and returns it only when no older record names the blob."""
    found = sorted(
        ((record_id, kind) for kind in (PLANS, RUNS) for record_id in _ids(outputs, kind)), reverse=True
    )
    gone = None
    for record_id, kind in found:
        rows = _rows(outputs, kind, record_id, where=ds.field("blob_id") == blob_id)
        if rows is None or not rows.num_rows:
            continue
        row = rows.slice(0, 1).to_pylist()[0]
        if row.get("outcome") != KEPT_GONE:
            return kind, row
        gone = gone or (kind, row)
    return gone
