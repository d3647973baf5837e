"""The mail queue's maintenance (records 31 and 32): per-slice statistics and the content clean-up."""

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from mailq_runtime.settings import Settings
from resources import MailqRuntime

from .metadata import DATETIME, table, when
from .spark.table_source import read_table

GROUP = "mail_queue"


def slice_recount(spark: SparkSession, settings: Settings) -> DataFrame:
    """Per queue and slice: enqueued, deleted and live mails counted from the rows themselves."""
    enqueued = read_table(spark, settings, "enqueued_mails").select("queue", "slice_start", "enqueue_id")
    deleted = read_table(spark, settings, "deleted_mails").withColumn("is_deleted", F.lit(1))
    return (
        enqueued.join(deleted, ["queue", "enqueue_id"], "left")
        .groupBy("queue", "slice_start")
        .agg(F.count("*").alias("enqueued"), F.count("is_deleted").alias("deleted"))
        .withColumn("live", F.col("enqueued") - F.col("deleted"))
    )


@dg.asset(group_name=GROUP, kinds={"spark"}, io_manager_key="spark_parquet")
def mail_queue_slices(mailq: MailqRuntime, pyspark: LazyPySparkResource) -> dg.Output[DataFrame]:
    """Per queue and slice: enqueued, deleted and live counts beside the counters, browse_start and
    content_start."""
    spark = pyspark.spark_session
    # Summed over the slice's rows: Cassandra keeps one a (slice, bucket), the embedded store one a slice.
    counted = ("queue", "slice_start", "enqueued", "deleted")
    counters = (
        read_table(spark, mailq.settings, "slice_counters", columns=counted)
        .groupBy("queue", "slice_start")
        .agg(F.sum("enqueued").alias("counted_enqueued"), F.sum("deleted").alias("counted_deleted"))
    )
    starts = read_table(spark, mailq.settings, "browse_start").join(
        read_table(spark, mailq.settings, "content_start"), "queue"
    )
    slices = (
        slice_recount(spark, mailq.settings)
        .join(counters, ["queue", "slice_start"], "full_outer")
        .fillna(0, ["enqueued", "deleted", "live", "counted_enqueued", "counted_deleted"])
        .join(starts, "queue", "left")
        .orderBy("queue", "slice_start")
        .cache()
    )
    queues = (
        slices.groupBy("queue", "browse_start", "content_start")
        .agg(F.count("*").alias("slices"), F.sum("enqueued").alias("enqueued"), F.sum("live").alias("live"))
        .orderBy("queue")
        .collect()
    )
    rows = [
        {
            "queue": q["queue"],
            "slices": q["slices"],
            "enqueued": q["enqueued"],
            "live": q["live"],
            "browse_start": when(q["browse_start"]),
            "content_start": when(q["content_start"]),
        }
        for q in queues
        if q["browse_start"] is not None
    ]
    return dg.Output(
        slices,
        metadata={
            "queues": len(queues),
            "slices": sum(q["slices"] for q in queues),
            "live_mails": sum(q["live"] for q in queues),
            **table(
                "per_queue",
                [
                    ("queue", "string", "mail queue"),
                    ("slices", "int", "time slices holding enqueued_mails rows"),
                    ("enqueued", "int", "mails enqueued in those slices"),
                    ("live", "int", "enqueued mails not yet deleted"),
                    ("browse_start", DATETIME, "where browsing starts: older slices hold no live mail"),
                    ("content_start", DATETIME, "where the stored rows and content start"),
                ],
                rows,
                "no mail queue yet",
            ),
        },
    )


@dg.asset_check(asset=mail_queue_slices, blocking=True)
def slice_counters_match_recount(mail_queue_slices: DataFrame) -> dg.AssetCheckResult:
    """Every slice's enqueued and deleted counters equal a recount of its enqueued_mails and deleted_mails
    rows (the counters `mailq size` reads)."""
    wrong = mail_queue_slices.where(
        (F.col("counted_enqueued") != F.col("enqueued")) | (F.col("counted_deleted") != F.col("deleted"))
    )
    sample = [
        r.asDict()
        for r in wrong.select(
            "queue", "slice_start", "enqueued", "counted_enqueued", "deleted", "counted_deleted"
        )
        .limit(10)
        .collect()
    ]
    return dg.AssetCheckResult(passed=not sample, metadata={"sample": dg.MetadataValue.json(sample)})


@dg.asset_check(asset=mail_queue_slices, blocking=True)
def browse_start_not_ahead_of_live_mail(mail_queue_slices: DataFrame) -> dg.AssetCheckResult:
    """No slice before a queue's browse_start holds a live mail, which browsing and delivery would skip."""
    ahead = mail_queue_slices.where((F.col("live") > 0) & (F.col("slice_start") < F.col("browse_start")))
    sample = [
        r.asDict() for r in ahead.select("queue", "slice_start", "live", "browse_start").limit(10).collect()
    ]
    return dg.AssetCheckResult(
        passed=not sample, metadata={"hidden_live_slices": dg.MetadataValue.json(sample)}
    )


@dg.asset(group_name=GROUP, kinds={"python"}, deps=[mail_queue_slices])
def mail_queue_cleanup(mailq: MailqRuntime) -> dg.MaterializeResult:
    """Record 32 for every queue: advance browse_start, then delete and release content_start ..
    browse_start."""
    runtime = mailq.runtime
    report = []
    for name in runtime.queues():
        queue = runtime.queue(name)
        before = (queue.maintenance.browse_start(), queue.maintenance.content_start())
        queue.maintenance.update_browse_start()
        after = (queue.maintenance.browse_start(), queue.maintenance.content_start())
        report.append((name, before, after))
    moved = [r for r in report if r[1] != r[2]]
    return dg.MaterializeResult(
        metadata={
            "queues": len(report),
            "queues_cleaned": len(moved),
            **table(
                "cleanup",
                [
                    ("queue", "string", "mail queue"),
                    ("browse_start_before", DATETIME, "browse_start before the clean-up"),
                    ("browse_start_after", DATETIME, "browse_start after it"),
                    ("content_start_before", DATETIME, "content_start before the clean-up"),
                    (
                        "content_start_after",
                        DATETIME,
                        "content_start after it: rows and content before it are gone",
                    ),
                ],
                [
                    {
                        "queue": name,
                        "browse_start_before": when(b[0]),
                        "browse_start_after": when(a[0]),
                        "content_start_before": when(b[1]),
                        "content_start_after": when(a[1]),
                    }
                    for name, b, a in report
                ],
                "no mail queue yet: nothing to clean",
            ),
        }
    )
