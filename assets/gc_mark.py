"""The mark of a GC iteration, shared by collected_blobs and gc_plan (blobs.py, gc_plan.py): the concerned
blobs that no live reference uses, found by the Bloom filters of the live references (built here for
live_reference_filter), by an exact anti-join, or by one reference lookup a blob; and what the
collecting assets keep of a run: its record (gc_records.py) and its totals.
"""

from dataclasses import dataclass

import dagster as dg
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from mailq_runtime.settings import Settings
from resources.outputs import Outputs

from .gc_records import RUNS
from .gc_records import path as records_path
from .spark.bloom import (
    FILTER_COLUMN,
    MIN_FILTER_ITEMS,
    bloom_filter,
    exact_absent,
    filter_bits,
    filter_capacity,
    not_in_filter,
)
from .spark.collect import lookup_references
from .spark.table_source import read_table, rows_upper_bound

# Up to this many blobs, looking each one's references up by blob id (exact) is cheaper than reading
# every reference.
LOOKUP_LIMIT = 50_000


def generation_filters(
    spark: SparkSession, settings: Settings, generations: list[int], fpp: float, salt: str, expected: int = 0
) -> tuple[DataFrame, list[dict]]:
    """One Bloom filter of the live references per generation (rows of FILTER_SCHEMA, built eagerly),
    and each one's size. A filter is sized for `expected` references, or else for an upper bound of the
    references read from the store's metadata (the embedded store's rowid span, in a millisecond): sizing
    for more items than there are only lowers the false-positive rate. Where the store has no such bound
    (Cassandra), or past what one filter may hold, each generation's references are counted, in the same
    pass over the table that the filters are then built from (the read is kept)."""
    references = read_table(
        spark, settings, "blob_references", columns=["blob_id", "generation"], generations=generations
    )
    sizes = dict.fromkeys(generations, expected)
    if not expected:
        bound = rows_upper_bound(settings, "blob_references")
        if bound is not None and bound <= filter_capacity(fpp):
            sizes = dict.fromkeys(generations, bound)
        else:
            references = references.persist(StorageLevel.MEMORY_AND_DISK)
            counted = references.groupBy("generation").count().collect()
            sizes = dict.fromkeys(generations, 0) | {row["generation"]: row["count"] for row in counted}
    filters, summary = [], []
    for generation in generations:
        size = max(sizes[generation], MIN_FILTER_ITEMS)
        bits = filter_bits(size, fpp)
        live = references.where(F.col("generation") == generation)
        filters.append(
            bloom_filter(live, "blob_id", size, fpp, salt).select(
                F.lit(generation).cast("long").alias("generation"),
                F.lit(salt).alias("salt"),
                F.lit(fpp).cast("double").alias("false_positive_probability"),
                F.lit(size).cast("long").alias("expected_references"),
                F.lit(bits).cast("long").alias("bits"),
                FILTER_COLUMN,
            )
        )
        summary.append({"generation": f"rg{generation}", "expected_references": size, "bits": bits})
    result = filters[0] if filters else spark.createDataFrame([], FILTER_SCHEMA)
    for more in filters[1:]:
        result = result.unionByName(more)
    result = result.localCheckpoint()
    references.unpersist()
    return result, summary


FILTER_SCHEMA = (
    "generation long, salt string, false_positive_probability double, expected_references long, "
    "bits long, bloom_filter binary"
)
# How a blob was found unreferenced (a plan's `found_by`).
BY_FILTER, BY_ANTI_JOIN, BY_LOOKUP = (
    "absent from the Bloom filter",
    "exact anti-join",
    "exact reference lookup",
)


def _absent_from_filters(filters: DataFrame, concerned: DataFrame) -> DataFrame:
    """The concerned blobs that their generation's filter does not contain, each with that filter's salt
    and false-positive probability."""
    absent = _found_by(concerned.limit(0), BY_FILTER)
    for row in filters.select("generation", "salt", "false_positive_probability").collect():
        bloom = filters.where(F.col("generation") == row["generation"]).select(FILTER_COLUMN)
        in_generation = concerned.where(F.col("generation") == row["generation"])
        missing = not_in_filter(bloom, in_generation, "blob_id", row["salt"])
        absent = absent.unionByName(
            _found_by(missing, BY_FILTER, row["salt"], row["false_positive_probability"])
        )
    return absent


def _found_by(blobs: DataFrame, how: str, salt: str | None = None, fpp: float | None = None) -> DataFrame:
    return blobs.select(
        "blob_id",
        "generation",
        F.lit(how).alias("found_by"),
        F.lit(salt).cast("string").alias("salt"),
        F.lit(fpp).cast("double").alias("false_positive_probability"),
    )


@dataclass
class Marked:
    """What the mark found among the concerned blobs: the collectable ones (blob_id, generation,
    found_by, salt, false_positive_probability) and the live ones (deletion_sets' rows, cached)."""

    mode: str
    candidates: DataFrame
    live: DataFrame


def mark(
    exact: bool, deletion_sets: DataFrame, live_reference_filter: DataFrame, settings: Settings
) -> Marked:
    """The mark of an iteration, shared by collected_blobs and gc_plan: the concerned blobs that no live
    reference uses, by the exact anti-join, the Bloom filters, or (with no filter built) one lookup a blob;
    and those found still referenced."""
    spark = deletion_sets.sparkSession
    if exact or live_reference_filter.limit(1).count():
        references = read_table(spark, settings, "blob_references")
        if exact:
            mode = "exact anti-join"
            candidates = _found_by(exact_absent(references, deletion_sets, "blob_id"), BY_ANTI_JOIN)
        else:
            mode = "bloom filter"
            candidates = _absent_from_filters(live_reference_filter, deletion_sets)
        candidates = candidates.cache()
        kept = deletion_sets.join(candidates, ["blob_id", "generation"], "left_anti")
        # An exact look at what the filter kept: live blobs, and false positives left for a later run.
        live = kept.join(references.select("blob_id").distinct(), "blob_id", "left_semi").cache()
    else:
        # No filter for blobs to examine: few enough to look each one's references up, exactly.
        mode = "reference lookups"
        looked = lookup_references(deletion_sets, settings)
        candidates = _found_by(looked.where(~F.col("referenced")), BY_LOOKUP)
        found = looked.where(F.col("referenced")).select("blob_id")
        live = deletion_sets.join(found, "blob_id", "left_semi").cache()
    return Marked(mode, candidates, live)


def record_run(
    outputs: Outputs, record_id: str, run_id: str, plan_id: str | None, now: int, outcomes: DataFrame
) -> None:
    """Write what a run did with each blob (outcomes: blob_id, generation, outcome, detail, bytes)."""
    outcomes.select(
        F.lit(record_id).alias("record_id"),
        F.lit(run_id).alias("run_id"),
        F.lit(plan_id).cast("string").alias("plan_id"),
        "blob_id",
        "generation",
        "outcome",
        "detail",
        "bytes",
        F.lit(now).cast("long").alias("at"),
    ).write.mode("errorifexists").parquet(records_path(outputs, RUNS, record_id))


def collect_totals(collected: DataFrame):
    """Blobs deleted (or, in a dry run, that would be), bytes, and errors of a `collect_blobs` result."""
    return collected.agg(
        F.count(F.when(F.col("error").isNull(), 1)).alias("deleted"),
        F.coalesce(F.sum("bytes"), F.lit(0)).alias("bytes"),
        F.count(F.col("error")).alias("errors"),
    ).first()


def no_live_blob_among(deleted: DataFrame, settings: Settings) -> dg.AssetCheckResult:
    """The check that none of the blobs a run deleted (`deleted`: blob_id, generation) has a reference.
    Its cost follows the run's: up to LOOKUP_LIMIT blobs, their references are looked up by blob id;
    past it, one read of the references is joined with them."""
    taken = deleted.select("blob_id", "generation").cache()
    checked = taken.count()
    if not checked:
        referenced = taken
    elif checked <= LOOKUP_LIMIT:
        referenced = lookup_references(taken, settings).where(F.col("referenced"))
    else:
        references = read_table(taken.sparkSession, settings, "blob_references", columns=["blob_id"])
        referenced = taken.join(references, "blob_id", "left_semi")
    count = referenced.count()
    sample = [r["blob_id"] for r in referenced.select("blob_id").limit(10).collect()]
    taken.unpersist()
    return dg.AssetCheckResult(
        passed=count == 0,
        metadata={
            "collected_blobs_checked": checked,
            "collected_yet_referenced": count,
            "sample": dg.MetadataValue.json(sample),
        },
    )
