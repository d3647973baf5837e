"""The Bloom-filter building block of the blob GC (record 39), computed by Spark, never by a Python loop.

`bloom_filter` builds a Bloom filter of the references' keys, and `not_in_filter` keeps the candidate
rows whose key is not in it (the filter is kept between the two, as the GC's assets hand it over). The
filter is built by Spark's `BloomFilterAggregate` (partial filters on the executors, merged in one task),
handed to the probing tasks as the value of a scalar subquery, and tested by `BloomFilterMightContain` on
the executors.
Both expressions ship with Spark but PySpark 4.3 exposes neither: `register_bloom_functions` puts them
into the session's function registry as `bloom_filter_agg` and `might_contain`. (The other route,
`df._jdf.stat().bloomFilter(...)`, builds the same filter into the driver's JVM, from where it can only
be tested key by key through py4j, or sent back to the executors as a literal: slower, and eager.)

Keys are strings. `might_contain` only takes a long, so a key enters the filter as xxhash64(salt, key),
the key hashed with the salt's hash as seed: equal keys give equal hashes, so there are still no false
negatives; a hash collision is one more way to a false positive, negligible next to the filter's own
rate. The salt changes with every run, so a false positive (garbage kept) is not the same from one run to
the next. (Seeding rather than hashing salt + key spares a string copy a row.)
"""

from __future__ import annotations

import math

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, StringType

_EXPRESSIONS = {
    "bloom_filter_agg": "org.apache.spark.sql.catalyst.expressions.aggregate.BloomFilterAggregate",
    "might_contain": "org.apache.spark.sql.catalyst.expressions.BloomFilterMightContain",
}
# BloomFilterAggregate silently caps its size at these settings (4M items, 64 Mbit by default), which would
# raise the false-positive rate far above the one asked for: they are raised to what a filter needs.
_MAX_ITEMS = "spark.sql.optimizer.runtime.bloomFilter.maxNumItems"
_MAX_BITS = "spark.sql.optimizer.runtime.bloomFilter.maxNumBits"
# 256 MiB: every partial filter is that big in memory and travels through a shuffle and every probing task.
MAX_FILTER_BITS = 1 << 31
FILTER_COLUMN = "bloom_filter"
# Spark's filter rounds its size up to 64-bit words and probes it by double hashing modulo that size: in a
# filter of a few words, many keys get only a few distinct probes, and the false-positive rate is far above
# the one asked (measured: 3% for a filter of one item at 1e-9). Sized for at least this many items (a
# filter of 1.2 KB at 1%), it keeps the rate asked.
MIN_FILTER_ITEMS = 1024


def register_bloom_functions(spark: SparkSession) -> None:
    """Registers `bloom_filter_agg(long, expected_items, bits)` and `might_contain(filter, long)` as
    temporary functions of the session (idempotent)."""
    jvm = spark._jvm
    registry = spark._jsparkSession.sessionState().functionRegistry()
    # Scala objects from py4j: the singleton is the class's static MODULE$ field.
    builders = getattr(jvm.org.apache.spark.sql.catalyst.analysis, "FunctionRegistryBase$")
    class_tags = getattr(jvm.scala.reflect, "ClassTag$")
    no_since = getattr(getattr(jvm.scala, "None$"), "MODULE$")
    for name, class_name in _EXPRESSIONS.items():
        tag = getattr(class_tags, "MODULE$").apply(jvm.java.lang.Class.forName(class_name))
        builder = getattr(builders, "MODULE$").build(name, no_since, tag)._2()
        # Spark 4.3 only registers fully qualified (3-part) names; a temporary function takes a plain one.
        registry.createOrReplaceTempFunction(name, builder, "internal")


def filter_bits(expected_count: int, fpp: float) -> int:
    """The optimal size in bits of a Bloom filter of `expected_count` items at false-positive rate `fpp`."""
    if isinstance(expected_count, bool) or not isinstance(expected_count, int) or expected_count < 1:
        raise ValueError(f"the expected count must be a positive integer, not {expected_count!r}")
    if isinstance(fpp, bool) or not isinstance(fpp, int | float) or not 0.0 < fpp < 1.0:
        raise ValueError(f"the false-positive probability must be strictly between 0 and 1, not {fpp!r}")
    bits = math.ceil(-expected_count * math.log(fpp) / math.log(2) ** 2)
    if bits > MAX_FILTER_BITS:
        raise ValueError(
            f"a Bloom filter of {expected_count} items at fpp {fpp} needs {bits} bits, more than the "
            f"{MAX_FILTER_BITS} allowed: raise the fpp or split the keys"
        )
    return bits


def filter_capacity(fpp: float) -> int:
    """The most items a filter of at most MAX_FILTER_BITS can be sized for at false-positive rate `fpp`."""
    filter_bits(1, fpp)  # validates the fpp
    return math.floor(MAX_FILTER_BITS * math.log(2) ** 2 / -math.log(fpp))


def bloom_filter(references: DataFrame, key: str, expected_count: int, fpp: float, salt: str) -> DataFrame:
    """One row, one binary column `bloom_filter`: Spark's serialized filter of the salted, hashed keys
    (NULL when there is no reference)."""
    bits = filter_bits(expected_count, fpp)
    _check_key(references, key, "references")
    _check_salt(salt)
    spark = references.sparkSession
    register_bloom_functions(spark)
    for setting, needed in ((_MAX_ITEMS, expected_count), (_MAX_BITS, bits)):
        if int(spark.conf.get(setting)) < needed:
            spark.conf.set(setting, str(needed))
    return references.where(F.col(key).isNotNull()).select(
        F.call_function(
            "bloom_filter_agg",
            _salted_hash(key, salt),
            F.lit(expected_count).cast("long"),
            F.lit(bits).cast("long"),
        ).alias(FILTER_COLUMN)
    )


def not_in_filter(bloom: DataFrame, candidates: DataFrame, key: str, salt: str) -> DataFrame:
    """The candidate rows whose key is not in `bloom`, a `bloom_filter` result (one row, with the column
    `bloom_filter`) built with the same salt. Candidates with a NULL key are left out."""
    _check_key(candidates, key, "candidates")
    _check_salt(salt)
    column = next((field for field in bloom.schema.fields if field.name == FILTER_COLUMN), None)
    if column is None or not isinstance(column.dataType, BinaryType):
        raise ValueError(f"the filter needs a binary column {FILTER_COLUMN!r}: {bloom.schema.simpleString()}")
    register_bloom_functions(candidates.sparkSession)
    # Exactly one row, or the query fails: no row at all would read as NULL, the filter of no reference,
    # and every candidate would be collected.
    single = bloom.agg(
        F.when(F.count(F.lit(1)) == 1, F.first(FILTER_COLUMN)).otherwise(
            F.raise_error(F.lit(f"a Bloom filter must be one row, the {FILTER_COLUMN!r} of bloom_filter()"))
        )
    )
    might_contain = F.call_function("might_contain", single.scalar(), _salted_hash(key, salt))
    # The filter of no reference is NULL, and so is might_contain: such a key is absent.
    return candidates.where(F.col(key).isNotNull() & ~F.coalesce(might_contain, F.lit(False)))


def exact_absent(references: DataFrame, candidates: DataFrame, key: str) -> DataFrame:
    """The candidate rows whose key no reference has (a left anti-join): the exact mode, and the yardstick
    of the Bloom filter's false positives. Candidates with a NULL key are left out."""
    _check_key(references, key, "references")
    _check_key(candidates, key, "candidates")
    kept = candidates.where(F.col(key).isNotNull()).join(references.select(key), on=key, how="left_anti")
    return kept.select(*candidates.columns)  # a join on a column name moves it first


def _salted_hash(key: str, salt: str) -> Column:
    return F.xxhash64(F.lit(salt), F.col(key))


def _check_key(df: DataFrame, key: str, role: str) -> None:
    fields = {field.name: field for field in df.schema.fields}
    if key not in fields:
        raise ValueError(f"the {role} have no column {key!r}: {list(fields)}")
    if not isinstance(fields[key].dataType, StringType):
        raise ValueError(
            f"the key {key!r} of the {role} must be a string, not {fields[key].dataType.simpleString()}"
        )


def _check_salt(salt: str) -> None:
    if not isinstance(salt, str) or not salt:
        raise ValueError(f"the salt must be a non-empty string, not {salt!r}")
