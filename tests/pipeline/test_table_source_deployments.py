"""The mailq data source on every deployment: the embedded store's rowid ranges and Cassandra's token ranges
and named partitions read every row once, and a read of some generations reads exactly those."""

from __future__ import annotations

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from assets.spark.table_source import read_table
from mailq_runtime import Runtime
from mailq_runtime.settings import Settings
from mailq_runtime.stores.cassandra.table_reader import MAX_TOKEN, MIN_TOKEN, token_ranges
from tests.runtime.backends import Backend

GENERATIONS = 4
OWNERS_PER_GENERATION = 60


def fill(runtime: Runtime) -> None:
    """Owners saving two blobs in each of GENERATIONS generations; every third one released (deletions)."""
    for generation in range(GENERATIONS):
        for n in range(OWNERS_PER_GENERATION):
            owner = f"g{generation}-owner{n}"
            runtime.blobs.save_all(owner, [b"shared %d" % (n % 7), b"own %d %d" % (generation, n)])
            if n % 3 == 0:
                runtime.blobs.release(owner)
        runtime.generations.rotate()


@pytest.fixture
def filled(backend: Backend) -> Backend:
    fill(backend.open())
    return backend


@pytest.mark.parametrize("partitions", [1, 7])
def test_every_row_is_read_once_whatever_the_partitions(
    spark: SparkSession, filled: Backend, partitions: int
) -> None:
    references = read_table(spark, Settings.from_url(filled.url()), "blob_references", partitions=partitions)

    assert references.rdd.getNumPartitions() >= partitions
    rows = [tuple(r) for r in references.select("owner", "blob_id", "generation").collect()]
    assert len(rows) == len(set(rows))
    assert sorted(rows) == sorted(filled.blob_state().references)
    blobs = read_table(spark, Settings.from_url(filled.url()), "blobs", columns=["blob_id", "generation"])
    assert sorted(tuple(r) for r in blobs.collect()) == sorted(filled.blob_state().blobs.items())


def test_a_read_of_some_generations_reads_exactly_their_rows(spark: SparkSession, filled: Backend) -> None:
    wanted = [1, 3]
    deletions = read_table(
        spark, Settings.from_url(filled.url()), "blob_deletions", generations=wanted, partitions=3
    )
    assert sorted(tuple(r) for r in deletions.select("blob_id", "generation", "gc_iteration").collect()) == [
        row for row in filled.blob_state().deletions if row[1] in wanted
    ]
    # Without the filter's column among those read.
    owners = read_table(
        spark, Settings.from_url(filled.url()), "blob_references", columns=["owner"], generations=[2]
    )
    assert sorted(r.owner for r in owners.collect()) == sorted(
        o for o, _, g in sorted(filled.blob_state().references) if g == 2
    )
    assert read_table(spark, Settings.from_url(filled.url()), "blob_deletions", generations=[]).count() == 0


def test_one_dataframe_filtered_two_ways_in_one_query_reads_both(
    spark: SparkSession, filled: Backend
) -> None:
    # The GC builds one Bloom filter a generation over one read of the references: each branch must see
    # its own generation's rows, not the rows planned for the other.
    references = read_table(spark, Settings.from_url(filled.url()), "blob_references", partitions=2)
    branches = [
        references.where(F.col("generation") == generation).agg(
            F.lit(generation).alias("asked"), F.min("generation"), F.max("generation"), F.count("*")
        )
        for generation in (1, 3)
    ]

    rows = branches[0].unionByName(branches[1]).collect()

    per_generation = {
        g: sum(1 for _, _, gen in sorted(filled.blob_state().references) if gen == g) for g in (1, 3)
    }
    assert sorted(tuple(row) for row in rows) == [(g, g, g, per_generation[g]) for g in (1, 3)]


def test_counters_and_small_integers_read_as_longs(spark: SparkSession, backend: Backend) -> None:
    runtime = backend.open()
    inbox = runtime.mailboxes.create("alice@example.com", "INBOX")
    for n in range(3):
        runtime.mailboxes.append(inbox, b"Subject: %d\r\n\r\nbody\r\n" % n)

    counters = read_table(spark, Settings.from_url(backend.url()), "mailbox_counters").collect()

    assert [(r.mailbox_id, r["count"], r.unseen) for r in counters] == [(str(inbox), 3, 3)]
    assert (
        read_table(spark, Settings.from_url(backend.url()), "mailbox_counters")
        .schema["count"]
        .dataType.typeName()
        == "long"
    )


def test_generations_on_a_table_without_them_is_a_clear_error(spark: SparkSession, backend: Backend) -> None:
    backend.open()
    with pytest.raises(AnalysisException, match="'generations' needs a generation column"):
        read_table(spark, Settings.from_url(backend.url()), "mailboxes", generations=[1]).collect()


@pytest.mark.parametrize("count", [1, 2, 5, 64])
def test_token_ranges_cover_the_ring_once(count: int) -> None:
    ranges = token_ranges(count)
    assert len(ranges) == count
    assert ranges[0].low == MIN_TOKEN and ranges[-1].high == MAX_TOKEN
    assert all(a.high == b.low and a.low < a.high for a, b in zip(ranges, ranges[1:], strict=False))
