"""Mark, review, sweep (lakeFS's model): the GC's dry run writes a plan an operator can read, and applying
the plan deletes exactly its blobs, each re-checked first.

gc_plan runs the same mark as collected_blobs (`gc_mark.mark`, on the same inputs) and writes the blobs a
real run would delete, each with why, to `gc_plans/<plan id>` (gc_records.py), kept until removed by
hand. applied_gc_plan reads one plan (its config names it) and, per blob, re-checks that its generation
is still eligible, its `blobs` row still there and no reference to it now (looked up by blob id); a blob
failing a check is kept and reported with the reason, the others go through `collect_blobs`, the
collector's own crash-safe deletion. Between a plan and its application a reference to an eligible
blob can only appear by the rare case record 39 leaves open (an operation that read a generation
before two rotations), which the lookup catches.
"""

from collections.abc import Iterator

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pydantic import Field
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from resources import MailqRuntime
from resources.outputs import Outputs
from resources.parquet_io import SparkParquetIOManager

from . import blobs, gc_records, reported
from .blobs import GROUP, NO_LIVE_BLOB_COLLECTED
from .gc_mark import mark, no_live_blob_among, record_run
from .metadata import DATETIME, short_blob_id, table, when
from .spark.collect import collect_blobs, lookup_references, lookup_rows

# The plan's blobs shown in the UI; the plan itself holds them all.
BLOBS_SHOWN = 50
# The columns a person reads first come first; a blob id (68 characters) would push them off a laptop's
# screen, so it comes last, after its short form.
KEPT_COLUMNS = [("reason", "string", "why blobs of the plan were kept"), ("blobs", "int", "how many")]
DELETED_COLUMNS = [
    ("owners", "string", "the owners whose releases made it garbage"),
    ("generation", "string", "its reference generation"),
    ("bytes", "int", "its size"),
    ("blob", "string", "the blob, shortened (its generation and the first hex digits of its hash)"),
    ("blob_id", "string", f"the blob's full id (the first {BLOBS_SHOWN}: deleted_blobs counts them all)"),
]


class PlanConfig(dg.Config):
    exact: bool = False  # an anti-join against the references instead of the Bloom filter


GC_PLAN = reported.spec(
    "gc_plan",
    [blobs.deletion_sets, blobs.live_reference_filter],
    GROUP,
    "gc_plan_job",
    "The GC's dry run: the blobs a real run would delete now, written as a plan (`plan_id`) that `mailq gc "
    "--apply PLAN_ID` or gc_apply_job applies. Per blob: its generation, its deletion rows' dates and the "
    "owners that released it, how it was found unreferenced (`found_by`; with the Bloom filter, its `salt` "
    "and `false_positive_probability`) and its size. Nothing is deleted, no deletion row retired.",
)


@dg.op(out={})
def gc_plan(
    context: dg.OpExecutionContext,
    config: PlanConfig,
    deletion_sets: DataFrame,
    live_reference_filter: DataFrame,
    mailq: MailqRuntime,
    pyspark: LazyPySparkResource,
    spark_parquet: dg.ResourceParam[SparkParquetIOManager],
) -> Iterator[dg.AssetMaterialization]:
    """Write a plan (GC_PLAN) from the mark of this run's deletion sets and filter."""
    now = mailq.runtime.clock()
    plan_id = gc_records.new_id(context.run.run_id, now)
    concerned = deletion_sets.count()
    mode, kept_live = "nothing to examine", 0
    spark = pyspark.spark_session
    planned = spark.createDataFrame([], gc_records.PLAN_SCHEMA)
    if concerned:
        marked = mark(config.exact, deletion_sets, live_reference_filter, mailq.settings)
        mode, kept_live = marked.mode, marked.live.count()
        sized = lookup_rows(marked.candidates, mailq.settings)
        planned = (
            marked.candidates.join(sized.select("blob_id", "bytes"), "blob_id", "left")
            .join(
                deletion_sets.select("blob_id", "generation", "deletions", "deletion_times", "owners"),
                ["blob_id", "generation"],
            )
            .select(
                F.lit(plan_id).alias("plan_id"),
                "blob_id",
                "generation",
                F.coalesce("bytes", F.lit(0)).alias("bytes"),
                "deletions",
                "deletion_times",
                "owners",
                "found_by",
                "salt",
                "false_positive_probability",
                F.lit(now).cast("long").alias("planned_at"),
            )
        )
        marked.live.unpersist()
    where = gc_records.path(spark_parquet.outputs, gc_records.PLANS, plan_id)
    planned.write.mode("errorifexists").parquet(where)
    planned = spark.read.parquet(where)  # what the plan holds, not a second mark
    per_generation = (
        planned.groupBy("generation")
        .agg(F.count("*").alias("blobs"), F.sum("bytes").alias("bytes"))
        .orderBy("generation")
        .collect()
    )
    blobs = sum(r["blobs"] for r in per_generation)
    size = sum(r["bytes"] for r in per_generation)
    salts = sorted({r["salt"] for r in planned.select("salt").distinct().collect() if r["salt"]})
    fpps = planned.select("false_positive_probability").where(F.col("false_positive_probability").isNotNull())
    fpp = fpps.first()
    shown = planned.orderBy("generation", "blob_id").limit(BLOBS_SHOWN).collect()
    yield dg.AssetMaterialization(
        asset_key=GC_PLAN.key,
        metadata={
            "plan_id": plan_id,
            "apply_with": f"mailq gc --apply {plan_id}",
            "path": dg.MetadataValue.path(where),
            "mode": mode,
            "salt": ", ".join(salts) or "none: no Bloom filter",
            "false_positive_probability": fpp[0] if fpp else None,
            "concerned_blobs": concerned,
            "blobs_to_delete": blobs,
            "bytes_to_reclaim": size,
            "kept_still_referenced": kept_live,
            "kept_by_filter_false_positive": concerned - blobs - kept_live,
            **table(
                "per_generation",
                [
                    ("generation", "string", "eligible reference generation"),
                    ("blobs", "int", "blobs the plan would delete"),
                    ("bytes", "int", "their size"),
                ],
                [
                    {
                        "generation": f"rg{r['generation']}",
                        "blobs": r["blobs"],
                        "bytes": r["bytes"],
                    }
                    for r in per_generation
                ],
                "the plan is empty: no concerned blob is unreferenced",
            ),
            **table(
                "blobs",
                [
                    ("owners", "string", "the owners whose releases wrote its deletion rows"),
                    ("bytes", "int", "its size"),
                    ("deletions", "int", "its deletion rows"),
                    ("last_deleted", DATETIME, "the newest of them"),
                    ("found_by", "string", "how it was found unreferenced"),
                    (
                        "blob",
                        "string",
                        "the blob, shortened (its generation and the first hex digits of its hash)",
                    ),
                    ("blob_id", "string", "the blob's full id"),
                ],
                [
                    {
                        "blob": short_blob_id(r["blob_id"]),
                        "blob_id": r["blob_id"],
                        "bytes": r["bytes"],
                        "deletions": r["deletions"],
                        "last_deleted": when(max(r["deletion_times"])),
                        "owners": ", ".join(r["owners"]) or "not recorded",
                        "found_by": r["found_by"],
                    }
                    for r in shown
                ],
                "the plan is empty: no concerned blob is unreferenced",
            ),
        },
    )


class ApplyConfig(dg.Config):
    plan_id: str | None = Field(
        default=None,
        description="the plan to apply, as gc_plan's materialisation and `mailq gc --dry-run` show it "
        "(default: the newest plan with blobs that is not applied yet)",
    )


APPLIED_GC_PLAN = reported.spec(
    "applied_gc_plan",
    [GC_PLAN],
    GROUP,
    "gc_apply_job",
    "Applies the plan `plan_id` (by default the newest plan with blobs not applied yet; when the newest "
    "plan holds none, nothing, and its `note` says so): deletes exactly "
    "its blobs that are still collectable, and keeps the others with the reason (`kept`); the first blobs "
    "deleted are listed with their owners (`deleted`). Applying a plan again deletes nothing: its blobs "
    "are gone already.",
)


@dg.op(out={})
def applied_gc_plan(
    context: dg.OpExecutionContext,
    config: ApplyConfig,
    mailq: MailqRuntime,
    pyspark: LazyPySparkResource,
    spark_parquet: dg.ResourceParam[SparkParquetIOManager],
) -> Iterator[dg.AssetMaterialization | dg.AssetCheckEvaluation]:
    """Apply a plan (APPLIED_GC_PLAN), then check that no blob it deleted has a reference."""
    outputs = spark_parquet.outputs
    plan_id, nothing = _chosen_plan(config.plan_id, outputs)
    if nothing:
        # Nothing to apply is news, not a failure: the run succeeds and says so, with zeros.
        yield dg.AssetMaterialization(
            asset_key=APPLIED_GC_PLAN.key, metadata=_nothing_to_apply(plan_id, nothing)
        )
        yield reported.evaluation(
            APPLIED_GC_PLAN,
            NO_LIVE_BLOB_COLLECTED,
            dg.AssetCheckResult(passed=True, metadata={"collected_blobs_checked": 0, "note": nothing}),
        )
        return
    spark = pyspark.spark_session
    now = mailq.runtime.clock()
    plan = spark.read.parquet(gc_records.path(outputs, gc_records.PLANS, plan_id))
    planned = plan.select("blob_id", "generation", "found_by").cache()
    current = mailq.runtime.generations.current()
    rows = lookup_rows(planned, mailq.settings)
    present = rows.where(F.col("bytes").isNotNull())
    eligible = present.where(F.col("generation") <= current - 2)
    looked = lookup_references(eligible, mailq.settings)
    approved = looked.where(~F.col("referenced")).select("blob_id", "generation")
    collected = collect_blobs(approved, mailq.settings, dry_run=False)
    outcomes = _apply_outcomes(planned, rows, present, eligible, looked, collected)
    record_id = gc_records.new_id(context.run.run_id, now)
    record_run(outputs, record_id, context.run.run_id, plan_id, now, outcomes)
    written = spark.read.schema(gc_records.RUN_SCHEMA).parquet(
        gc_records.path(outputs, gc_records.RUNS, record_id)
    )
    counts = {r["outcome"]: (r["blobs"], r["bytes"] or 0) for r in _by_outcome(written)}
    deleted, reclaimed = counts.pop(gc_records.DELETED, (0, 0))
    total = planned.count()
    kept = [{"reason": reason, "blobs": n} for reason, (n, _) in sorted(counts.items())]
    for row in written.where(F.col("outcome") == gc_records.KEPT_DELETE_FAILED).limit(20).collect():
        context.log.warning(f"could not collect {row['blob_id']}: {row['detail']}")
    metadata = {
        "plan_id": plan_id,
        "record_id": record_id,
        "planned_blobs": total,
        "deleted_blobs": deleted,
        "bytes_reclaimed": reclaimed,
        "kept_blobs": total - deleted,
        **table("kept", KEPT_COLUMNS, kept, "none kept: every blob of the plan was deleted"),
        **_deleted_table(written, plan),
    }
    gone = counts.get(gc_records.KEPT_GONE, (0, 0))[0]
    if not deleted:
        metadata["note"] = (
            f"nothing deleted: the plan's {total} blob(s) are all gone already (applied before, or "
            "collected since)"
            if total and gone == total
            else "nothing deleted"
        )
    planned.unpersist()
    yield dg.AssetMaterialization(asset_key=APPLIED_GC_PLAN.key, metadata=metadata)
    deleted_now = written.where(F.col("outcome") == gc_records.DELETED)
    yield reported.evaluation(
        APPLIED_GC_PLAN, NO_LIVE_BLOB_COLLECTED, no_live_blob_among(deleted_now, mailq.settings)
    )


def _chosen_plan(configured: str | None, outputs: Outputs) -> tuple[str, str]:
    """The plan a run applies and "", or the newest plan and why there is nothing to apply: the plan its
    config names, which must exist; else the newest plan with blobs that is not applied yet, unless the
    newest plan holds none. With no plan at all to choose from, the run fails, naming the job that
    makes one."""
    if configured is not None:
        plan_id = gc_records.check_plan_id(configured)
        if not gc_records.exists(outputs, gc_records.PLANS, plan_id):
            raise dg.Failure(
                f"unknown GC plan {plan_id}: none at {gc_records.path(outputs, gc_records.PLANS, plan_id)}"
            )
        return plan_id, ""
    newest = gc_records.newest_plan(outputs)
    if newest is None:
        raise dg.Failure(
            f"no GC plan to apply: none under {outputs.path(gc_records.PLANS)} yet (gc_plan_job, or "
            "`mailq gc --dry-run`, makes one)"
        )
    if not newest[1]:
        return newest[0], f"the newest plan, {newest[0]}, holds no blob: nothing to apply"
    unapplied = gc_records.newest_unapplied_plan(outputs)
    if unapplied is None:
        return newest[0], f"every plan with blobs is applied, the newest, {newest[0]}, too: nothing to apply"
    return unapplied, ""


def _nothing_to_apply(plan_id: str, note: str) -> dict[str, dg.MetadataValue | str | int]:
    """An application's figures when there is nothing to apply: zeros, and why."""
    return {
        "plan_id": plan_id,
        "note": note,
        "planned_blobs": 0,
        "deleted_blobs": 0,
        "bytes_reclaimed": 0,
        "kept_blobs": 0,
        **table("kept", KEPT_COLUMNS, [], "nothing to apply"),
        **table("deleted", DELETED_COLUMNS, [], "nothing to apply"),
    }


def _deleted_table(written: DataFrame, plan: DataFrame) -> dict[str, dg.MetadataValue]:
    """The first blobs an application deleted, with the owners whose releases made them garbage."""
    shown = (
        written.where(F.col("outcome") == gc_records.DELETED)
        .join(plan.select("blob_id", "generation", "owners"), ["blob_id", "generation"], "left")
        .orderBy("generation", "blob_id")
        .limit(BLOBS_SHOWN)
        .collect()
    )
    return table(
        "deleted",
        DELETED_COLUMNS,
        [
            {
                "owners": ", ".join(r["owners"] or []) or "not recorded",
                "generation": f"rg{r['generation']}",
                "bytes": r["bytes"],
                "blob": short_blob_id(r["blob_id"]),
                "blob_id": r["blob_id"],
            }
            for r in shown
        ],
        "nothing deleted",
    )


@dg.asset_check(asset=APPLIED_GC_PLAN.key, name=NO_LIVE_BLOB_COLLECTED, blocking=True)
def no_live_blob_deleted_by_the_plan(
    context: dg.AssetCheckExecutionContext,
    mailq: MailqRuntime,
    pyspark: LazyPySparkResource,
    spark_parquet: dg.ResourceParam[SparkParquetIOManager],
) -> dg.AssetCheckResult:
    """No blob the application deleted has a reference: the blobs its record lists as deleted, looked up
    by blob id (past LOOKUP_LIMIT of them, joined with one read of the references)."""
    return reported.no_live_blob_in_latest_record(context, APPLIED_GC_PLAN, mailq, pyspark, spark_parquet)


def _apply_outcomes(
    planned: DataFrame,
    rows: DataFrame,
    present: DataFrame,
    eligible: DataFrame,
    looked: DataFrame,
    collected: DataFrame,
) -> DataFrame:
    def kept(blobs: DataFrame, outcome: str, detail: str) -> DataFrame:
        return blobs.select(
            "blob_id",
            "generation",
            F.lit(outcome).alias("outcome"),
            F.lit(detail).alias("detail"),
            F.lit(None).cast("long").alias("bytes"),
        )

    done = collected.join(planned, ["blob_id", "generation"], "left").select(
        "blob_id",
        "generation",
        F.when(F.col("error").isNull(), F.lit(gc_records.DELETED))
        .otherwise(F.lit(gc_records.KEPT_DELETE_FAILED))
        .alias("outcome"),
        F.coalesce(F.col("error"), F.concat(F.lit("re-checked, "), F.col("found_by"))).alias("detail"),
        "bytes",
    )
    return (
        done.unionByName(kept(rows.where(F.col("bytes").isNull()), gc_records.KEPT_GONE, "no blobs row"))
        .unionByName(
            kept(
                present.join(eligible, ["blob_id", "generation"], "left_anti"),
                gc_records.KEPT_NOT_ELIGIBLE,
                "its generation is less than two behind the current one",
            )
        )
        .unionByName(
            kept(
                looked.where(F.col("referenced")),
                gc_records.KEPT_REFERENCED_AGAIN,
                "a reference found by blob id",
            )
        )
    )


def _by_outcome(records: DataFrame) -> list:
    return (
        records.groupBy("outcome").agg(F.count("*").alias("blobs"), F.sum("bytes").alias("bytes")).collect()
    )
