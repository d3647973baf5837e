"""The orphan sweep of record 39's blob garbage collector: what writes that died half-way leave in the
eligible generations, which no deletion set would ever name (see spark/orphans.py), and its check that
every reference still finds its blob.
"""

from collections.abc import Iterator

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from mailq_runtime.model import parse_duration
from resources import MailqRuntime

from . import blobs, reported
from .blobs import GROUP
from .gc_mark import collect_totals
from .spark.collect import collect_blobs
from .spark.orphans import orphan_content, orphan_owners, release_owners
from .spark.table_source import read_table


class OrphanSweepConfig(dg.Config):
    dry_run: bool = False
    # Owners created more recently are never swept, whatever the tables say (`model.parse_duration`).
    grace: str = "1d"


ORPHAN_BLOBS = reported.spec(
    "orphan_blobs",
    [blobs.reference_generations],
    GROUP,
    "orphan_sweep_job",
    "The full sweep of what writes that died half-way leave in eligible generations, which no deletion set "
    "would ever name (see spark/orphans.py): references whose owner exists nowhere are released, for the "
    "next GC iteration to collect their blobs; blobs with neither a reference nor a deletion, and content "
    "with no blob row, are deleted.",
)
EVERY_REFERENCE_FINDS_ITS_BLOB = "every_reference_finds_its_blob"


@dg.op(out=reported.stored("orphan_blobs"))
def orphan_blobs(
    config: OrphanSweepConfig, reference_generations: dict, mailq: MailqRuntime, pyspark: LazyPySparkResource
) -> Iterator:
    """The sweep (ORPHAN_BLOBS), then its check that every reference still finds its blob."""
    output = _sweep(config, reference_generations, mailq, pyspark)
    yield reported.materialization(ORPHAN_BLOBS, output)
    yield reported.evaluation(
        ORPHAN_BLOBS, EVERY_REFERENCE_FINDS_ITS_BLOB, _references_find_blobs(mailq, pyspark)
    )
    yield dg.Output(output.value)


def _sweep(
    config: OrphanSweepConfig, reference_generations: dict, mailq: MailqRuntime, pyspark: LazyPySparkResource
) -> dg.Output[DataFrame]:
    spark = pyspark.spark_session
    eligible = reference_generations["eligible"]
    settings = mailq.settings
    created_before = mailq.runtime.clock() - parse_duration(config.grace, "grace")
    owners = orphan_owners(spark, settings, reference_generations["current"] - 2, created_before).cache()
    found = owners.agg(F.count("*").alias("owners"), F.sum("references").alias("references")).first()
    released = {"references": 0, "errors": 0}
    if not config.dry_run:
        released = (
            release_owners(owners, settings)
            .agg(
                F.coalesce(F.sum("released"), F.lit(0)).alias("references"),
                F.count(F.col("error")).alias("errors"),
            )
            .first()
        )
    blobs = read_table(spark, settings, "blobs").where(F.col("generation").isin(eligible))
    references = read_table(spark, settings, "blob_references").select("blob_id")
    deletions = read_table(spark, settings, "blob_deletions").select("blob_id")
    orphans = blobs.join(references, "blob_id", "left_anti").join(deletions, "blob_id", "left_anti")
    content = orphan_content(spark, settings, eligible).cache()
    content_count = content.count()  # before the collection deletes it
    candidates = orphans.select("blob_id", "generation").unionByName(content)
    collected = collect_blobs(candidates, settings, dry_run=config.dry_run).cache()
    totals = collect_totals(collected)
    return dg.Output(
        collected,
        metadata={
            "dry_run": config.dry_run,
            "grace": config.grace,
            "orphan_owners": found["owners"],
            "orphan_references": found["references"] or 0,
            "references_released": released["references"],
            "release_errors": released["errors"],
            "orphans_found": totals["deleted"] + totals["errors"],
            "orphan_content": content_count,
            "deleted_blobs": 0 if config.dry_run else totals["deleted"],
            "bytes_reclaimed": 0 if config.dry_run else totals["bytes"],
            "delete_errors": totals["errors"],
        },
    )


@dg.asset_check(asset=ORPHAN_BLOBS.key, blocking=True)
def every_reference_finds_its_blob(mailq: MailqRuntime, pyspark: LazyPySparkResource) -> dg.AssetCheckResult:
    """Every reference to a blob of a collectable generation still finds its blob: nothing, the
    collector or a hand, took a live one. A full read of both tables, as the sweep's own. Only eligible
    generations are compared: no reference to them can appear any more, so the two scans agree without a
    snapshot while traffic goes on in the current generations."""
    return _references_find_blobs(mailq, pyspark)


def _references_find_blobs(mailq: MailqRuntime, pyspark: LazyPySparkResource) -> dg.AssetCheckResult:
    spark = pyspark.spark_session
    eligible = mailq.runtime.generations.eligible()
    references = read_table(spark, mailq.settings, "blob_references", columns=["blob_id", "generation"])
    blobs = read_table(spark, mailq.settings, "blobs", columns=["blob_id", "generation"])
    dangling = references.where(F.col("generation").isin(eligible)).join(
        blobs.where(F.col("generation").isin(eligible)), "blob_id", "left_anti"
    )
    count = dangling.count()
    sample = [r["blob_id"] for r in dangling.select("blob_id").limit(10).collect()]
    return dg.AssetCheckResult(
        passed=count == 0,
        metadata={
            "dangling_references": count,
            "eligible_generations": dg.MetadataValue.json(eligible),
            "sample": dg.MetadataValue.json(sample),
        },
    )
