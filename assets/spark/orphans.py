"""The orphan sweep's Spark work: what a write that died half-way leaves in the eligible generations.

No write path of the runtime assumes a transaction, so a crash between two of its writes leaves garbage
that no deletion names (see the crash-safe orders in mailq_runtime/blobs/dedup.py and mailbox_writes.py):

- references whose owner exists nowhere: the content of a mail or message was saved, then the
  enqueue or append died before the mail or message that owns it existed, or an expunge died before
  releasing it. They are released (deletions appended), and the normal GC collects their blobs;
- blobs with neither a reference nor a deletion: a save died between the blob rows and the references;
- content with no blob row (nor reference): a save died between the content and the blob rows. The
  content is listed in parallel from the content store itself (the S3 bucket, or the embedded store's
  content table), one Spark task a `g<generation>_<hex digit>` prefix of the eligible generations.

An owner is found nowhere by an anti-join of the references against the tables in OWNER_TABLES, rather
than by a look-up per owner: Cassandra's `enqueued_mails` cannot be read by enqueue id, and one pass
over each table is what Spark does best. Safety does not rest on the scan being current: only owners
whose references all belong to eligible generations are candidates (no write in flight can still be
using them: the n-2 rule), and only owners older than a grace period (an id's first 16 hex digits are
its creation time in microseconds); the runtime checks the references and placements again before it
releases (`Mailboxes.release_orphan`).
"""

from __future__ import annotations

from collections.abc import Iterator

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from mailq_runtime.deployments import table_reader
from mailq_runtime.settings import Settings

from .table_source import read_table

# Where an owner of blob references exists: an enqueue id while the queue holds its mail (a view row, a
# delayed mail or a dead letter), a message id while a mailbox holds it (the source of truth; a `messages`
# row alone is what a half-done append or expunge leaves). A table the store lacks is skipped.
OWNER_TABLES = (
    ("enqueued_mails", "enqueue_id"),
    ("delayed_mails", "enqueue_id"),
    ("dead_letters", "enqueue_id"),
    ("imap_uid_table", "message_id"),
)
_OWNER_ID = r"^[0-9a-f]{32}$"
_CREATED_AT_DIGITS = 16
CONTENT_SCHEMA = StructType(
    [StructField("blob_id", StringType(), False), StructField("generation", LongType(), False)]
)
RESULT_SCHEMA = StructType(
    [
        StructField("owner", StringType(), False),
        StructField("released", LongType(), True),
        StructField("error", StringType(), True),
    ]
)


def orphan_owners(spark, settings: Settings, newest_eligible: int, created_before: int) -> DataFrame:
    """Owners (with their reference count) whose references all belong to generations up to
    `newest_eligible`, created before `created_before` (microseconds), and held by no table of
    OWNER_TABLES. Owners that are not ids (tests save under any name) have no age and are never swept."""
    created_at = F.conv(F.substring("owner", 1, _CREATED_AT_DIGITS), 16, 10).cast("decimal(20,0)")
    candidates = (
        read_table(spark, settings, "blob_references", columns=["owner", "generation"])
        .groupBy("owner")
        .agg(F.count("*").alias("references"), F.max("generation").alias("newest_generation"))
        .where(F.col("newest_generation") <= newest_eligible)
        .where(F.col("owner").rlike(_OWNER_ID))
        .where(created_at < F.lit(created_before))
        .select("owner", "references")
    )
    tables = table_reader(settings).tables
    for table, column in OWNER_TABLES:
        if table in tables:
            held = read_table(spark, settings, table, columns=[column]).select(F.col(column).alias("owner"))
            candidates = candidates.join(held, "owner", "left_anti")
    return candidates


def orphan_content(spark, settings: Settings, eligible: list[int]) -> DataFrame:
    """(blob_id, generation) of the content of eligible generations that has neither a row in `blobs` nor
    a reference (a referenced blob that lost its row is damage for the GC's check to report, not garbage)."""
    rows = read_table(spark, settings, "blobs", columns=["blob_id"])
    references = read_table(spark, settings, "blob_references", columns=["blob_id"])
    return (
        stored_content(spark, settings, eligible)
        .join(rows, "blob_id", "left_anti")
        .join(references, "blob_id", "left_anti")
    )


def stored_content(spark, settings: Settings, generations: list[int]) -> DataFrame:
    """(blob_id, generation) of the content the blob store holds in `generations`, listed by 16 tasks a
    generation, one a `g<generation>_<hex digit>` prefix."""
    prefixes = [f"g{generation}_{digit:x}" for generation in generations for digit in range(16)]
    listed = spark.sparkContext.parallelize(prefixes, max(len(prefixes), 1)).mapPartitions(
        lambda part: _list_partition(settings, part)
    )
    return spark.createDataFrame(listed, CONTENT_SCHEMA)


def _list_partition(settings: Settings, prefixes: Iterator[str]) -> Iterator[tuple[str, int]]:
    from mailq_runtime import Runtime  # imported on the executor

    with Runtime(settings) as runtime:
        for prefix in prefixes:
            for blob_id in runtime.blobs.content.list_ids(prefix):
                yield str(blob_id), blob_id.generation


def _release_partition(settings: Settings, owners: Iterator) -> Iterator[tuple]:
    from mailq_runtime import Runtime  # imported on the executor

    with Runtime(settings) as runtime:
        for row in owners:
            try:
                yield row["owner"], runtime.mailboxes.release_orphan(row["owner"]), None
            except Exception as error:  # reported per owner and counted as an error; the next sweep retries
                yield row["owner"], None, f"{type(error).__name__}: {error}"


def release_owners(owners: DataFrame, settings: Settings) -> DataFrame:
    """Release the references of `owners`; returns owner, released (references), error per owner.

    Checkpointed eagerly: the releases run exactly once, whatever reads the result afterwards.
    """
    released = owners.select("owner").rdd.mapPartitions(lambda rows: _release_partition(settings, rows))
    return owners.sparkSession.createDataFrame(released, RESULT_SCHEMA).localCheckpoint()
