"""The "mailq" data source reads the embedded store's tables whole, once, with the right types."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from assets.spark.table_source import read_table
from mailq_runtime.deployments import table_reader
from mailq_runtime.settings import Settings

if TYPE_CHECKING:
    from conftest import Store


def fill_references(store: Store, rows: int) -> None:
    store.connection.execute(
        """
        WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?)
        INSERT INTO blob_references (owner, blob_id, generation)
        SELECT printf('msg-%07d', i / 3), printf('g%d_', i % 9) || lower(hex(randomblob(32))), i % 9 FROM n
        """,
        (rows,),
    )


def test_the_allow_list_is_every_table_of_the_schema(store: Store) -> None:
    created = {
        name for (name,) in store.connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    }
    assert table_reader(Settings.from_url(store.url)).tables == created


def test_every_row_is_read_exactly_once_across_partitions(spark: SparkSession, store: Store) -> None:
    fill_references(store, 100_000)
    # Gaps in the rowids, as deletions leave them, must not lose or repeat rows at range boundaries.
    store.connection.execute(
        "DELETE FROM blob_references WHERE rowid % 7 = 0 OR rowid BETWEEN 40000 AND 45000"
    )
    expected = store.connection.execute(
        "SELECT count(*), count(DISTINCT owner || ' ' || blob_id), sum(generation), sum(length(blob_id)),"
        " min(blob_id), max(owner) FROM blob_references"
    ).fetchone()

    df = read_table(spark, Settings.from_url(store.url), "blob_references", partitions=4)

    assert df.rdd.getNumPartitions() == 4
    actual = df.agg(
        F.count("*"),
        F.count_distinct("owner", "blob_id"),
        F.sum("generation"),
        F.sum(F.length("blob_id")),
        F.min("blob_id"),
        F.max("owner"),
    ).first()
    assert tuple(actual) == expected
    per_partition = df.groupBy(F.spark_partition_id()).count().collect()
    assert len(per_partition) == 4 and sum(row[1] for row in per_partition) == expected[0]


def test_types_and_values_survive_exactly(spark: SparkSession, store: Store) -> None:
    mails = [
        ("q", 0, 1, "e1", 10, 20, 0, "mail-1", "a@b.org", '["x@y.org"]', "g1_h", "g1_b", "{}"),
        # NULL sender (a bounce), an empty name, non-ASCII text, a negative number.
        ("q", 0, 2, "e2", -5, 20, 9, "", None, '["é@ü.org", "📧@x.org"]', "g1_h2", "g1_b2", '{"state": "ö"}'),
    ]
    store.connection.executemany(f"INSERT INTO enqueued_mails VALUES ({', '.join('?' * 13)})", mails)

    df = read_table(spark, Settings.from_url(store.url), "enqueued_mails")

    long, text = LongType(), StringType()
    assert [(f.name, f.dataType, f.nullable) for f in df.schema] == [
        ("queue", text, False),
        ("slice_start", long, False),
        ("bucket", long, False),
        ("enqueue_id", text, False),
        ("enqueued_time", long, False),
        ("next_delivery", long, False),
        ("priority", long, False),
        ("name", text, False),
        ("sender", text, True),
        ("recipients", text, False),
        ("header_blob_id", text, False),
        ("body_blob_id", text, False),
        ("metadata", text, False),
    ]
    assert sorted(tuple(row) for row in df.collect()) == sorted(mails)


def test_nullable_integers_and_blobs(spark: SparkSession, tmp_path: Path) -> None:
    # No table of the schema has a BLOB or a nullable INTEGER column yet: a store whose `queues` table
    # was made differently shows how they are read.
    with sqlite3.connect(tmp_path / "mailq.db") as connection:
        connection.execute("CREATE TABLE queues (queue TEXT, created_at INTEGER, payload BLOB)")
        rows = [
            ("a", 1, b"\x00\xff\xfe,binary"),
            ("b", None, None),
            (None, -3, b""),
            ("d", 2**62, b"x" * 5000),
        ]
        connection.executemany("INSERT INTO queues VALUES (?, ?, ?)", rows)
    connection.close()

    df = read_table(spark, Settings.from_url(f"embedded://{tmp_path}"), "queues", partitions=3)

    assert df.schema == StructType(
        [
            StructField("queue", StringType(), True),
            StructField("created_at", LongType(), True),
            StructField("payload", BinaryType(), True),
        ]
    )
    read = sorted((tuple(row) for row in df.collect()), key=str)
    assert read == sorted(((q, c, None if p is None else bytearray(p)) for q, c, p in rows), key=str)


def test_a_value_that_does_not_fit_its_type_fails_clearly(spark: SparkSession, store: Store) -> None:
    store.connection.execute("INSERT INTO queues VALUES ('q', 'not a number')")
    with pytest.raises(Exception, match="does not fit its column's declared type"):
        read_table(spark, Settings.from_url(store.url), "queues").collect()


def test_columns_option_selects_and_orders(spark: SparkSession, store: Store) -> None:
    fill_references(store, 1_000)
    df = read_table(spark, Settings.from_url(store.url), "blob_references", columns=["generation", "owner"])
    assert df.columns == ["generation", "owner"]
    assert (
        df.agg(F.sum("generation")).first()[0]
        == store.connection.execute("SELECT sum(generation) FROM blob_references").fetchone()[0]
    )


def test_an_empty_table_is_an_empty_dataframe(spark: SparkSession, store: Store) -> None:
    df = read_table(spark, Settings.from_url(store.url), "dead_letters", partitions=4)
    assert df.columns == ["id", "queue", "enqueue_id", "reason", "died_at", "payload"]
    assert df.collect() == []


def test_a_table_without_rowid_is_read_in_one_partition(spark: SparkSession, store: Store) -> None:
    generations = [("reference_generation", n, 1000 + n) for n in range(5)] + [("gc_iteration", 1, 7)]
    store.connection.executemany("INSERT INTO generations VALUES (?, ?, ?)", generations)

    df = read_table(spark, Settings.from_url(store.url), "generations", partitions=8)

    assert df.rdd.getNumPartitions() == 1
    assert sorted(tuple(row) for row in df.collect()) == sorted(generations)


def test_one_dataframe_filtered_two_ways_in_one_query_reads_both(spark: SparkSession, store: Store) -> None:
    # The GC's Bloom filters are built so, one branch per generation over one read of the references. A
    # Python data source taking pushed filters breaks this in PySpark 4.3: the branches share the read
    # planned for one of them, and a generation's filter would miss its references.
    fill_references(store, 9_000)
    references = read_table(spark, Settings.from_url(store.url), "blob_references", partitions=2)
    per_generation = [
        references.where(F.col("generation") == generation).agg(
            F.lit(generation).alias("asked"), F.min("generation"), F.max("generation"), F.count("*")
        )
        for generation in (2, 7)
    ]

    rows = per_generation[0].unionByName(per_generation[1]).collect()

    assert sorted(tuple(row) for row in rows) == [(2, 2, 2, 1000), (7, 7, 7, 1000)]


def test_an_unknown_table_is_a_clear_error(spark: SparkSession, store: Store) -> None:
    with pytest.raises(
        ValueError, match=r"unknown table 'blob_refs': the store's tables are .*blob_references"
    ):
        read_table(spark, Settings.from_url(store.url), "blob_refs")
    # Through the plain reader too (read_table registered it), where the message comes from a worker.
    with pytest.raises(AnalysisException, match="unknown table 'sqlite_master'"):
        spark.read.format("mailq").options(url=store.url, table="sqlite_master").load()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"generations": "1,x"}, "'generations' must be comma-separated generation numbers"),
        ({"url": "cassandra://user:secret@host/ks"}, "user:\\*\\*\\*@host.* carries a password"),
        ({"url": "embedded://relative/dir"}, "needs an absolute path"),
        ({"url": "embedded://user:secret@host/data"}, "user:\\*\\*\\*@host.* carries a password"),
        ({"url": "embedded:///nowhere/at/all"}, "no embedded store at /nowhere/at/all/mailq.db"),
        ({"partitions": "0"}, "'partitions' must be a positive integer"),
        ({"columns": "owner,nope"}, "invalid columns"),
    ],
)
def test_bad_options_are_clear_errors(spark: SparkSession, store: Store, options: dict, message: str) -> None:
    read_table(spark, Settings.from_url(store.url), "blob_references")  # registers the source
    all_options = {"url": store.url, "table": "blob_references", **options}
    with pytest.raises(AnalysisException, match=message) as error:
        spark.read.format("mailq").options(**all_options).load().collect()
    assert "secret" not in str(error.value)
