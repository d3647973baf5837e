"""The sweep of the garbage collector: Spark partitions delete their share of blobs in batches, each
executor through its own runtime connection, and report per blob what was reclaimed or what failed;
the same way, they look a few concerned blobs' references (the exact check that spares reading every
reference) and `blobs` rows up by blob id, and retire the deletion rows of blobs found still referenced."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import islice

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from mailq_runtime.settings import Settings

from .table_source import read_table

BATCH = 1000
RESULT_SCHEMA = StructType(
    [
        StructField("blob_id", StringType(), False),
        StructField("generation", LongType(), False),
        StructField("bytes", LongType(), True),
        StructField("error", StringType(), True),
    ]
)


def _in_batches(
    settings: Settings, rows: Iterator, columns: tuple[str, str], work: Callable
) -> Iterator[tuple]:
    """A partition's rows, as pairs of `columns`, handed to `work(runtime, batch)` BATCH at a time, through
    one runtime the executor opens from `settings`; yields what `work` yields."""
    from mailq_runtime import Runtime  # imported on the executor

    first, second = columns
    pairs = ((row[first], row[second]) for row in rows)
    with Runtime(settings) as runtime:
        while batch := list(islice(pairs, BATCH)):
            yield from work(runtime, batch)


def _collect_batch(runtime, batch: list[tuple[str, int]]) -> Iterator[tuple]:
    try:
        sizes = {str(blob_id): size for blob_id, size in runtime.blobs.collect(b for b, _ in batch).items()}
    except Exception as error:  # reported per blob and counted as errors; the next iteration retries
        for blob_id, generation in batch:
            yield blob_id, generation, None, f"{type(error).__name__}: {error}"
        return
    for blob_id, generation in batch:
        yield blob_id, generation, sizes.get(blob_id, 0), None


def _lookup_batch(runtime, batch: list[tuple[str, int]]) -> Iterator[tuple]:
    # A failed lookup fails the task (Spark retries it, then the run fails): a blob whose references are
    # unknown must be neither collected nor retired.
    referenced = {str(blob_id) for blob_id in runtime.blobs.referenced(b for b, _ in batch)}
    for blob_id, generation in batch:
        yield blob_id, generation, blob_id in referenced


def lookup_references(concerned: DataFrame, settings: Settings) -> DataFrame:
    """Whether each concerned blob (blob_id, generation) has a reference, looked up by blob id on the
    executors: blob_id, generation, referenced. Exact, and checkpointed eagerly: one look a blob."""
    spark = concerned.sparkSession
    looked = concerned.select("blob_id", "generation").rdd.mapPartitions(
        lambda rows: _in_batches(settings, rows, ("blob_id", "generation"), _lookup_batch)
    )
    return spark.createDataFrame(
        looked, "blob_id string, generation long, referenced boolean"
    ).localCheckpoint()


def _rows_batch(runtime, batch: list[tuple[str, int]]) -> Iterator[tuple]:
    # As for the lookups, a failure fails the task: a blob not known to have its row is never deleted.
    sizes = {str(blob_id): size for blob_id, size in runtime.blobs.sizes(b for b, _ in batch).items()}
    for blob_id, generation in batch:
        yield blob_id, generation, sizes.get(blob_id)


def lookup_rows(blobs: DataFrame, settings: Settings) -> DataFrame:
    """Each blob's (blob_id, generation) `blobs` row, looked up by blob id on the executors: blob_id,
    generation, bytes (NULL: no row any more). Checkpointed eagerly: one look a blob."""
    spark = blobs.sparkSession
    looked = blobs.select("blob_id", "generation").rdd.mapPartitions(
        lambda rows: _in_batches(settings, rows, ("blob_id", "generation"), _rows_batch)
    )
    return spark.createDataFrame(looked, "blob_id string, generation long, bytes long").localCheckpoint()


def _retire_batch(runtime, batch: list[tuple[str, int]]) -> Iterator[tuple]:
    try:
        yield runtime.blobs.retire_deletions(batch), None
    except Exception as error:  # the rows stay: the next iteration examines their blobs again
        yield 0, f"{type(error).__name__}: {error}"


def retire_deletions(rows: DataFrame, settings: Settings) -> tuple[int, int, str | None]:
    """Drop the deletion rows `rows` (blob_id, deleted_at) from the store, in batches on the executors;
    returns the rows retired, the batches that failed, and one failure's message."""
    spark = rows.sparkSession
    retired = rows.select("blob_id", "deleted_at").rdd.mapPartitions(
        lambda rows: _in_batches(settings, rows, ("blob_id", "deleted_at"), _retire_batch)
    )
    totals = (
        spark.createDataFrame(retired, "retired long, error string")
        .agg(
            F.coalesce(F.sum("retired"), F.lit(0)).alias("retired"),
            F.count(F.col("error")).alias("errors"),
            F.first("error", ignorenulls=True).alias("error"),
        )
        .first()
    )
    return totals["retired"], totals["errors"], totals["error"]


def collect_blobs(candidates: DataFrame, settings: Settings, *, dry_run: bool) -> DataFrame:
    """Delete `candidates` (blob_id, generation); returns blob_id, generation, bytes, error per blob.

    The result is checkpointed eagerly: the deletions run exactly once, whatever reads it afterwards.
    """
    spark = candidates.sparkSession
    if dry_run:
        sizes = read_table(spark, settings, "blobs").select("blob_id", F.col("size").alias("bytes"))
        return (
            candidates.join(sizes, "blob_id", "left")
            .select("blob_id", "generation", "bytes", F.lit(None).cast("string").alias("error"))
            .localCheckpoint()
        )
    deleted = candidates.select("blob_id", "generation").rdd.mapPartitions(
        lambda rows: _in_batches(settings, rows, ("blob_id", "generation"), _collect_batch)
    )
    return spark.createDataFrame(deleted, RESULT_SCHEMA).localCheckpoint()
