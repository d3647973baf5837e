"""The GC's Bloom filter: never a referenced key among the absent ones, few unreferenced keys kept back,
and different ones from one salt to the next."""

from __future__ import annotations

import math

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from assets.spark.bloom import (
    FILTER_COLUMN,
    MIN_FILTER_ITEMS,
    bloom_filter,
    exact_absent,
    filter_bits,
    not_in_filter,
)

REFERENCED = 200_000
FPP = 0.01


def absent_from_filter(
    references: DataFrame, candidates: DataFrame, key: str, expected_count: int, fpp: float, salt: str
) -> DataFrame:
    """The candidates whose key is not in a Bloom filter of the references' keys, chained as the GC's
    assets chain them (the filter built, then probed)."""
    return not_in_filter(bloom_filter(references, key, expected_count, fpp, salt), candidates, key, salt)


def blob_ids(spark: SparkSession, first: int, stop: int) -> DataFrame:
    """Blob ids shaped like the store's, "g7_<64 hex>", one per integer of [first, stop)."""
    ids = spark.range(first, stop)
    return ids.select(F.concat(F.lit("g7_"), F.sha2(ids.id.cast("string"), 256)).alias("blob_id"), "id")


@pytest.fixture(scope="module")
def references(spark: SparkSession) -> DataFrame:
    return blob_ids(spark, 0, REFERENCED).select("blob_id").cache()


@pytest.fixture(scope="module")
def candidates(spark: SparkSession) -> DataFrame:
    """100k candidates: half of them referenced, the other half garbage."""
    return blob_ids(spark, REFERENCED - 50_000, REFERENCED + 50_000).cache()


def ids(df: DataFrame) -> set[int]:
    return {row.id for row in df.select("id").collect()}


def test_exact_absent_is_the_unreferenced_candidates(references: DataFrame, candidates: DataFrame) -> None:
    exact = exact_absent(references, candidates, "blob_id")
    assert exact.columns == candidates.columns
    assert ids(exact) == set(range(REFERENCED, REFERENCED + 50_000))


def test_no_referenced_key_is_ever_absent_and_few_garbage_keys_are_kept(
    references: DataFrame, candidates: DataFrame
) -> None:
    absent = absent_from_filter(references, candidates, "blob_id", REFERENCED, FPP, salt="run-1:")
    absent_ids = ids(absent)
    garbage = set(range(REFERENCED, REFERENCED + 50_000))

    assert absent.columns == candidates.columns
    assert not absent_ids - garbage  # no false negative: every referenced key was kept
    assert absent.join(references, "blob_id", "left_semi").count() == 0
    kept_back = len(garbage - absent_ids)
    # About FPP of the 50k garbage keys (500): six standard deviations either side.
    assert 500 - 6 * math.sqrt(500) < kept_back < 500 + 6 * math.sqrt(500)


def test_another_salt_keeps_back_other_garbage(references: DataFrame, candidates: DataFrame) -> None:
    garbage = set(range(REFERENCED, REFERENCED + 50_000))

    def kept_back(salt: str) -> set[int]:
        return garbage - ids(absent_from_filter(references, candidates, "blob_id", REFERENCED, FPP, salt))

    first, again, other = kept_back("run-1:"), kept_back("run-1:"), kept_back("run-2:")
    assert first == again and first
    assert other and len(first & other) < len(first) / 10  # independent: about FPP of them in common


def test_a_kept_filter_probes_like_a_fresh_one(references: DataFrame, candidates: DataFrame) -> None:
    kept = bloom_filter(references, "blob_id", REFERENCED, FPP, "run-1:").localCheckpoint()
    fresh = absent_from_filter(references, candidates, "blob_id", REFERENCED, FPP, "run-1:")
    assert ids(not_in_filter(kept, candidates, "blob_id", "run-1:")) == ids(fresh)


@pytest.mark.parametrize("rows", [0, 2])
def test_a_filter_that_is_not_one_row_fails_the_query(
    references: DataFrame, candidates: DataFrame, rows: int
) -> None:
    one = bloom_filter(references, "blob_id", REFERENCED, FPP, "s")
    bloom = one.limit(0) if rows == 0 else one.unionByName(one)
    with pytest.raises(Exception, match="a Bloom filter must be one row"):
        not_in_filter(bloom, candidates, "blob_id", "s").count()


def test_without_references_every_candidate_is_absent(spark: SparkSession, candidates: DataFrame) -> None:
    nothing = blob_ids(spark, 0, 0).select("blob_id")
    assert bloom_filter(nothing, "blob_id", 10, FPP, "s").first()[0] is None
    assert absent_from_filter(nothing, candidates, "blob_id", 10, FPP, "s").count() == candidates.count()


def test_null_keys_are_neither_references_nor_candidates(spark: SparkSession) -> None:
    references = spark.createDataFrame([("a",), (None,)], "blob_id string")
    candidates = spark.createDataFrame([(1, "a"), (2, None), (3, "b")], "id long, blob_id string")
    assert ids(absent_from_filter(references, candidates, "blob_id", 10, FPP, "s")) == {3}
    assert ids(exact_absent(references, candidates, "blob_id")) == {3}


def test_a_filter_is_sized_for_its_count_past_spark_caps(spark: SparkSession, references: DataFrame) -> None:
    # 5M items at 0.1%: beyond Spark's default caps of 4M items and 64 Mbit, which would shrink it.
    bits = filter_bits(5_000_000, 0.001)
    assert bits > 64 * 2**20
    serialized = bloom_filter(references.limit(1000), "blob_id", 5_000_000, 0.001, "s").first()[0]
    words = int.from_bytes(serialized[12:16], "big")  # version, hash count, seed, then the word count
    assert words == math.ceil(bits / 64)


@pytest.mark.parametrize(
    ("expected_count", "fpp", "message"),
    [
        (0, FPP, "expected count must be a positive integer"),
        (-5, FPP, "expected count must be a positive integer"),
        (1.5, FPP, "expected count must be a positive integer"),
        (10, 0.0, "strictly between 0 and 1"),
        (10, 1.0, "strictly between 0 and 1"),
        (10, -0.1, "strictly between 0 and 1"),
        (10, float("nan"), "strictly between 0 and 1"),
        (10**12, 1e-6, "more than the"),
    ],
)
def test_invalid_sizes_are_clear_errors(
    references: DataFrame, candidates: DataFrame, expected_count: int, fpp: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        absent_from_filter(references, candidates, "blob_id", expected_count, fpp, "s")


def test_invalid_keys_and_salts_are_clear_errors(references: DataFrame, candidates: DataFrame) -> None:
    with pytest.raises(ValueError, match="the candidates have no column 'blob'"):
        not_in_filter(bloom_filter(references, "blob_id", 10, FPP, "s"), candidates, "blob", "s")
    with pytest.raises(ValueError, match="must be a string, not bigint"):
        exact_absent(candidates, candidates, "id")
    with pytest.raises(ValueError, match="salt must be a non-empty string"):
        absent_from_filter(references, candidates, "blob_id", 10, FPP, "")
    with pytest.raises(ValueError, match=f"the filter needs a binary column '{FILTER_COLUMN}'"):
        not_in_filter(references, candidates, "blob_id", "s")


def test_a_filter_of_few_items_keeps_the_rate_asked_only_when_sized_for_the_minimum(spark: SparkSession):
    one = blob_ids(spark, 0, 1).select("blob_id")
    garbage = blob_ids(spark, 1, 20_001)

    def kept_back(expected: int) -> int:
        bloom = bloom_filter(one, "blob_id", expected, 1e-6, "salt-1").localCheckpoint()
        return 20_000 - not_in_filter(bloom, garbage, "blob_id", "salt-1").count()

    # Sized for its one item, a filter of one 64-bit word keeps hundreds back at a rate of one in a million.
    assert kept_back(1) > 100
    assert kept_back(MIN_FILTER_ITEMS) == 0
