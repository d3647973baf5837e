"""Record 39's blob garbage collector as Spark-materialised assets, with the n-2 rule made explicit:

reference_generations -> deletion_sets -> live_reference_filter -> collected_blobs. The mark they share
with gc_plan and the Bloom filters it reads are in gc_mark.py; orphan_blobs, the sweep of what writes that
died half-way leave, in orphan_sweep.py.

Deletions of generation g are collected only once the current generation is at least g+2: by then no
save can add a reference to a blob of g, so a blob absent from a filter of g's references is garbage.
A Bloom filter has no false negatives, so a live blob is never collected; a false positive only keeps
garbage until a later iteration, whose new salt gives different false positives.

A run costs what changed since the last one. A blob the exact check (a join with the references, not the
filter) finds still referenced has its deletion rows retired: exactly the rows this run read, by their
full key, and only those older than the run's start minus `settle` (CollectConfig, default 15m). A
release writes its deletion row and then removes its reference, so a run may read the row and still see
the reference in between; retiring that row would leave garbage that no deletion names. The settle time
keeps the rows of releases still in progress, and the orphan sweep heals a release stalled for longer (a
blob with neither reference nor deletion). A false positive's rows stay, for a later salt to retry them.
A new release of a retired blob appends a new row, so the blob is examined again exactly when a new
deletion of it arrives. Retiring never deletes content nor a `blobs` row: it cannot lose a live blob.
With nothing to examine, a run reads no reference at all; with few concerned blobs (at most the filter's
`lookup_limit`), it builds no filter and looks each one's references up by blob id instead, exactly.
"""

import inspect
import time
import uuid
from collections.abc import Iterator

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from mailq_runtime.model import parse_duration
from resources import MailqRuntime
from resources.parquet_io import SparkParquetIOManager

from . import reported
from .gc_mark import (
    FILTER_SCHEMA,
    LOOKUP_LIMIT,
    Marked,
    collect_totals,
    generation_filters,
    mark,
    no_live_blob_among,
    record_run,
)
from .gc_records import DELETED, KEPT_DELETE_FAILED, KEPT_FALSE_POSITIVE, KEPT_REFERENCED, new_id
from .metadata import DATETIME, table, timestamp, when
from .spark.collect import collect_blobs, retire_deletions
from .spark.table_source import read_table

GROUP = "blob_gc"
# What starts the GC, on the pages of the assets its runs report (Dagster links a sensor to the assets of
# the asset jobs it requests, not to an op-based job's).
GC_AUTOMATION = (
    "deletions_waiting_sensor, which requests blob_gc_job when deletions wait (off until turned on under "
    "Automation)"
)


@dg.asset(
    group_name=GROUP, kinds={"python"}, io_manager_key="spark_parquet", metadata={"automation": GC_AUTOMATION}
)
def reference_generations(mailq: MailqRuntime) -> dg.Output[dict]:
    """The reference generations and GC iterations, and which generations this iteration may collect."""
    return generations_output(mailq)


def generations_output(mailq: MailqRuntime) -> dg.Output[dict]:
    """reference_generations' output, also what the GC jobs' first op reports (mark_steps.py)."""
    generations = mailq.runtime.generations
    current = generations.current()
    eligible = generations.eligible()
    rows = [
        {
            "generation": f"rg{g.number}",
            "started": when(g.started_at),
            "state": "eligible"
            if g.number in eligible
            else "current"
            if g.number == current
            else "protected",
        }
        for g in generations.reference_generations()
    ]
    value = {"current": current, "gc_iteration": generations.current_gc_iteration(), "eligible": eligible}
    return dg.Output(
        value,
        metadata={
            "current_generation": current,
            "gc_iteration": value["gc_iteration"],
            "eligible_generations": dg.MetadataValue.json(eligible),
            **table(
                "generations",
                [
                    ("generation", "string", "reference generation"),
                    ("started", DATETIME, "when it became the current generation"),
                    (
                        "state",
                        "string",
                        "eligible: collected by this iteration (current is at least 2 ahead); current: new "
                        "references go to it; protected: a save may still reference its blobs",
                    ),
                ],
                rows,
                "no reference generation yet: the store has not started one",
            ),
        },
    )


@dg.asset(
    group_name=GROUP, kinds={"spark"}, io_manager_key="spark_parquet", metadata={"automation": GC_AUTOMATION}
)
def deletion_sets(
    reference_generations: dict, mailq: MailqRuntime, pyspark: LazyPySparkResource
) -> dg.Output[DataFrame]:
    """The concerned blobs: distinct blob ids of the deletions in eligible generations, each with the
    times of the deletion rows read (`deletion_times`), which name the rows a live blob's retirement drops,
    and the owners whose releases wrote them (`owners`)."""
    return deletion_sets_output(reference_generations, mailq, pyspark)


def deletion_sets_output(
    reference_generations: dict, mailq: MailqRuntime, pyspark: LazyPySparkResource
) -> dg.Output[DataFrame]:
    spark = pyspark.spark_session
    eligible = reference_generations["eligible"]
    deletions = read_table(spark, mailq.settings, "blob_deletions", generations=eligible)
    concerned = (
        deletions.groupBy("generation", "blob_id")
        .agg(
            F.count("*").alias("deletions"),
            F.min("deleted_at").alias("first_deleted_at"),
            F.max("deleted_at").alias("last_deleted_at"),
            F.collect_list("deleted_at").alias("deletion_times"),
            F.array_sort(F.collect_set("owner")).alias("owners"),  # rows older than the column have none
        )
        .cache()
    )
    per_generation = (
        concerned.groupBy("generation")
        .agg(F.count("*").alias("blobs"), F.sum("deletions").alias("deletions"))
        .orderBy("generation")
        .collect()
    )
    return dg.Output(
        concerned,
        metadata={
            "concerned_blobs": sum(r["blobs"] for r in per_generation),
            "deletions": sum(r["deletions"] for r in per_generation),
            **table(
                "per_generation",
                [
                    ("generation", "string", "eligible reference generation"),
                    ("concerned_blobs", "int", "distinct blobs its deletions name"),
                    ("deletions", "int", "deletion rows (one per owner that released a blob)"),
                ],
                [
                    {
                        "generation": f"rg{r['generation']}",
                        "concerned_blobs": r["blobs"],
                        "deletions": r["deletions"],
                    }
                    for r in per_generation
                ],
                "no deletion in an eligible generation: nothing for this GC iteration to examine",
            ),
        },
    )


class BloomFilterConfig(dg.Config):
    false_positive_probability: float = 0.01
    expected_references: int = 0  # 0: size each generation's filter as generation_filters() says
    # Up to this many concerned blobs, no filter is built: collected_blobs looks their references up by
    # blob id. 0: always the Bloom filter.
    lookup_limit: int = LOOKUP_LIMIT


@dg.asset(
    group_name=GROUP, kinds={"spark"}, io_manager_key="spark_parquet", metadata={"automation": GC_AUTOMATION}
)
def live_reference_filter(
    config: BloomFilterConfig,
    deletion_sets: DataFrame,
    mailq: MailqRuntime,
    pyspark: LazyPySparkResource,
) -> dg.Output[DataFrame]:
    """Per eligible generation with deletions, a Bloom filter of its live references, salted for this run;
    none when there are no more concerned blobs than `lookup_limit`: collected_blobs then looks their
    references up one by one, and no filter means that to it."""
    return filter_output(config, deletion_sets, mailq, pyspark)


def filter_output(
    config: BloomFilterConfig, deletion_sets: DataFrame, mailq: MailqRuntime, pyspark: LazyPySparkResource
) -> dg.Output[DataFrame]:
    if config.lookup_limit < 0:
        raise ValueError(
            f"lookup_limit must be 0 (always the Bloom filter) or a count of blobs, not {config.lookup_limit}"
        )
    spark = pyspark.spark_session
    generations = sorted(r["generation"] for r in deletion_sets.select("generation").distinct().collect())
    salt = uuid.uuid4().hex
    started = time.monotonic()
    concerned = deletion_sets.count()
    if not concerned or concerned <= config.lookup_limit:  # the references are not read
        return dg.Output(
            spark.createDataFrame([], FILTER_SCHEMA),
            metadata={
                "live_check": "reference lookups" if concerned else "none",
                "why": f"{concerned} concerned blob(s), at most lookup_limit {config.lookup_limit}"
                if concerned
                else "nothing to examine",
                "salt": salt,
                "false_positive_probability": config.false_positive_probability,
                "generations": dg.MetadataValue.json([]),
                "build_seconds": 0.0,
                "references_read": False,
            },
        )
    result, summary = generation_filters(
        spark,
        mailq.settings,
        generations,
        config.false_positive_probability,
        salt,
        config.expected_references,
    )
    return dg.Output(
        result,
        metadata={
            "salt": salt,
            "false_positive_probability": config.false_positive_probability,
            "generations": dg.MetadataValue.json(generations),
            "build_seconds": round(time.monotonic() - started, 3),
            "references_read": True,
            "live_check": "bloom filter",
            "why": f"{concerned} concerned blob(s), more than lookup_limit {config.lookup_limit}"
            if config.lookup_limit
            else "lookup_limit 0: always the Bloom filter",
            **table(
                "per_generation",
                [
                    ("generation", "string", "eligible reference generation with deletions"),
                    ("expected_references", "int", "references the filter is sized for"),
                    ("bits", "int", "the filter's size in bits"),
                ],
                summary,
                "no filter built: no eligible generation has deletions",
            ),
        },
    )


class CollectConfig(dg.Config):
    exact: bool = False  # an anti-join against the references instead of the Bloom filter
    # Deletion rows younger than this at the run's start are never retired (`model.parse_duration`): the
    # release that wrote one may not have removed its reference yet.
    settle: str = "15m"


COLLECTED_SCHEMA = "blob_id string, generation long, bytes long, error string"


COLLECTED_BLOBS = reported.spec(
    "collected_blobs",
    [reference_generations, deletion_sets, live_reference_filter],
    GROUP,
    "blob_gc_job",
    inspect.cleandoc(
        """The concerned blobs absent from the filter, deleted from the blob store, `blobs` and
        `blob_deletions` (a dry run is `gc_plan`). Its figures: `concerned_blobs` examined; `deleted_blobs`;
        `kept_still_referenced`, blobs a live reference still uses, whose settled deletion rows are retired
        (`retired_deletions`); `kept_by_filter_false_positive`, garbage the Bloom filter kept back, left for
        a later iteration; `delete_errors`, blobs whose deletion failed and that stay for the next run. What
        it did with each blob examined goes to `gc_runs/<record_id>` (gc_records.py), for `mailq blobs
        explain`."""
    ),
    started_by=GC_AUTOMATION,
)


@dg.op(out=reported.stored("collected_blobs"))
def collected_blobs(
    context: dg.OpExecutionContext,
    config: CollectConfig,
    reference_generations: dict,
    deletion_sets: DataFrame,
    live_reference_filter: DataFrame,
    mailq: MailqRuntime,
    pyspark: LazyPySparkResource,
    spark_parquet: dg.ResourceParam[SparkParquetIOManager],
) -> Iterator:
    """One GC iteration (COLLECTED_BLOBS), then its check that no blob it collected has a reference."""
    output = _collect(
        context,
        config,
        reference_generations,
        deletion_sets,
        live_reference_filter,
        mailq,
        pyspark,
        spark_parquet,
    )
    yield reported.materialization(COLLECTED_BLOBS, output)
    collected = output.value.where(F.col("error").isNull())
    yield reported.evaluation(
        COLLECTED_BLOBS, NO_LIVE_BLOB_COLLECTED, no_live_blob_among(collected, mailq.settings)
    )
    yield dg.Output(output.value)


def _collect(
    context: dg.OpExecutionContext,
    config: CollectConfig,
    reference_generations: dict,
    deletion_sets: DataFrame,
    live_reference_filter: DataFrame,
    mailq: MailqRuntime,
    pyspark: LazyPySparkResource,
    spark_parquet: SparkParquetIOManager,
) -> dg.Output[DataFrame]:
    spark = pyspark.spark_session
    started = time.monotonic()
    now = mailq.runtime.clock()
    # Taken before the references are read: a row settled by then was written by a release that
    # removed its reference before the check below reads them.
    settled_before = now - parse_duration(config.settle, "settle")
    read = deletion_sets.agg(F.count("*").alias("blobs"), F.max("last_deleted_at").alias("newest")).first()
    concerned = read["blobs"]
    # What this run examined, for the deletions sensor: rows up to `examined_through` in the generations
    # eligible when `examined_generation` was the current one.
    examined = {
        "examined_generation": reference_generations["current"],
        "examined_through": timestamp(read["newest"] or 0),
    }
    if not concerned:  # nothing to examine: the references are not read
        return dg.Output(
            spark.createDataFrame([], COLLECTED_SCHEMA),
            metadata=examined
            | {"settle": config.settle}
            | _collect_figures("nothing to examine", 0, {}, started),
        )
    marked = mark(config.exact, deletion_sets, live_reference_filter, mailq.settings)
    kept_live = marked.live.count()
    settled = marked.live.select("blob_id", F.explode("deletion_times").alias("deleted_at")).where(
        F.col("deleted_at") <= settled_before
    )
    retired = retire_deletions(settled, mailq.settings)
    if retired[1]:
        context.log.warning(f"{retired[1]} batch(es) of deletions not retired, e.g.: {retired[2]}")
    collected = collect_blobs(
        marked.candidates.select("blob_id", "generation"), mailq.settings, dry_run=False
    )
    collected = collected.cache()
    totals = collect_totals(collected)
    for row in collected.where(F.col("error").isNotNull()).limit(20).collect():
        context.log.warning(f"could not collect {row['blob_id']}: {row['error']}")
    record_id = new_id(context.run.run_id, now)
    record_run(
        spark_parquet.outputs,
        record_id,
        context.run.run_id,
        None,
        now,
        _collect_outcomes(collected, marked, deletion_sets, live_reference_filter),
    )
    marked.live.unpersist()
    figures = {
        "concerned": concerned,
        "kept_live": kept_live,
        "retired": retired[0],
        "retire_errors": retired[1],
        **totals.asDict(),
    }
    return dg.Output(
        collected,
        metadata=examined
        | {"settle": config.settle, "record_id": record_id}
        | _collect_figures(marked.mode, concerned, figures, started),
    )


def _collect_outcomes(
    collected: DataFrame, marked: Marked, deletion_sets: DataFrame, filters: DataFrame
) -> DataFrame:
    """Per blob examined: outcome, detail, bytes (the blob columns of a GC run's record)."""
    done = collected.join(marked.candidates, ["blob_id", "generation"], "left").select(
        "blob_id",
        "generation",
        F.when(F.col("error").isNull(), F.lit(DELETED)).otherwise(F.lit(KEPT_DELETE_FAILED)).alias("outcome"),
        F.coalesce(F.col("error"), F.col("found_by")).alias("detail"),
        "bytes",
    )
    live = marked.live.select(
        "blob_id",
        "generation",
        F.lit(KEPT_REFERENCED).alias("outcome"),
        F.lit(f"a reference found ({marked.mode})").alias("detail"),
        F.lit(None).cast("long").alias("bytes"),
    )
    # The rest of the concerned blobs: kept back by the filter (none in the exact modes).
    salts = filters.select("generation", "salt")
    false_positives = (
        deletion_sets.select("blob_id", "generation")
        .join(marked.candidates, ["blob_id", "generation"], "left_anti")
        .join(marked.live, ["blob_id", "generation"], "left_anti")
        .join(salts, "generation", "left")
        .select(
            "blob_id",
            "generation",
            F.lit(KEPT_FALSE_POSITIVE).alias("outcome"),
            F.concat(F.lit("in the Bloom filter of salt "), F.col("salt")).alias("detail"),
            F.lit(None).cast("long").alias("bytes"),
        )
    )
    return done.unionByName(live).unionByName(false_positives)


def _collect_figures(mode: str, concerned: int, figures: dict, started: float) -> dict:
    deleted, errors, kept_live = (
        figures.get("deleted", 0),
        figures.get("errors", 0),
        figures.get("kept_live", 0),
    )
    reclaimed = figures.get("bytes", 0)
    return {
        "mode": mode,
        # Read by blob id in the lookups' mode, the whole table (its blob ids) in the others'.
        "references_read": mode != "nothing to examine",
        "references_table_read": mode in ("exact anti-join", "bloom filter"),
        "concerned_blobs": concerned,
        "deleted_blobs": deleted,
        "kept_still_referenced": kept_live,
        "kept_by_filter_false_positive": concerned - deleted - errors - kept_live,
        "retired_deletions": figures.get("retired", 0),
        "retire_errors": figures.get("retire_errors", 0),
        "bytes_reclaimed": reclaimed,
        "delete_errors": errors,
        "seconds": round(time.monotonic() - started, 3),
    }


NO_LIVE_BLOB_COLLECTED = "no_live_blob_collected"


@dg.asset_check(asset=COLLECTED_BLOBS.key, name=NO_LIVE_BLOB_COLLECTED, blocking=True)
def no_live_blob_collected(
    context: dg.AssetCheckExecutionContext,
    mailq: MailqRuntime,
    pyspark: LazyPySparkResource,
    spark_parquet: dg.ResourceParam[SparkParquetIOManager],
) -> dg.AssetCheckResult:
    """No blob the GC collected has a reference. Its cost follows the run's: up to LOOKUP_LIMIT blobs,
    their references are looked up by blob id; past it, one read of the references is joined with them.
    The comparison of every reference with the blobs is the orphan sweep's check,
    `every_reference_finds_its_blob`."""
    return reported.no_live_blob_in_latest_record(context, COLLECTED_BLOBS, mailq, pyspark, spark_parquet)
