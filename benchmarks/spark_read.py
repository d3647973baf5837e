"""How fast Spark reads the embedded store through the "mailq" data source (Arrow batches), against the
same reader yielding Python tuples, at local[2]. Target: at least 1M rows/s.

    .venv/bin/python benchmarks/spark_read.py [ROWS] [--partitions N] [--repeat N]

Prints one line per measure, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from importlib.resources import files
from pathlib import Path

from harness import spark_session
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType
from quick import parse_args

from assets.spark.table_source import MailqDataSource, MailqReader, read_table
from mailq_runtime.deployments import table_reader
from mailq_runtime.settings import Settings
from mailq_runtime.stores.embedded import DATABASE_FILE
from mailq_runtime.stores.embedded.table_reader import RowidRange

TARGET_ROWS_PER_S = 1_000_000


def generate(data_dir: Path, rows: int) -> None:
    """`rows` blob references, generated inside SQLite: a Python loop would take longer than the reads."""
    with closing(sqlite3.connect(data_dir / DATABASE_FILE)) as connection:
        connection.execute("PRAGMA journal_mode=WAL")
        connection.executescript(files("mailq_runtime.stores.embedded").joinpath("schema.sql").read_text())
        with connection:
            connection.execute(
                """
                WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?)
                INSERT INTO blob_references (owner, blob_id, generation)
                SELECT printf('msg-%012d', i / 3), printf('g%d_', i % 9) || lower(hex(randomblob(32))), i % 9
                FROM n
                """,
                (rows,),
            )


class TupleReader(MailqReader):
    """The peer: the same partitions, read with fetchmany and handed to Spark as one Python tuple a row."""

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        rowids = partition.value
        assert isinstance(rowids, RowidRange)
        database = table_reader(self.settings).database
        names = ", ".join(column.name for column in self.table_read.columns)
        with closing(sqlite3.connect(f"{database.as_uri()}?mode=ro", uri=True)) as connection:
            cursor = connection.execute(
                f"SELECT {names} FROM {self.table_read.table} WHERE rowid >= ? AND rowid < ?",
                (rowids.first, rowids.stop),
            )
            while rows := cursor.fetchmany(65_536):
                yield from rows


class TupleDataSource(MailqDataSource):
    @classmethod
    def name(cls) -> str:
        return "mailq_tuples"

    def reader(self, schema: StructType) -> DataSourceReader:
        arrow = super().reader(schema)
        assert isinstance(arrow, MailqReader)
        return TupleReader(arrow.settings, arrow.table_read, arrow.partition_count)


def aggregate(df: DataFrame) -> None:
    """Per generation: references, bytes of blob ids, longest owner: every column. Numbers only, since a
    string aggregate buffer (max of a string) turns Spark's hash aggregation into a sort of all rows."""
    df.groupBy("generation").agg(F.count("*"), F.sum(F.length("blob_id")), F.max(F.length("owner"))).collect()


def best_rate(rows: int, action: Callable[[], object], repeat: int) -> float:
    action()  # warms the JVM and the Python workers up
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - start)
    return rows / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", type=int, nargs="?", default=5_000_000)
    parser.add_argument("--partitions", type=int, default=None, help="default: Spark's default parallelism")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per measure, the best is kept")
    args = parse_args(parser, {"rows": 20_000, "repeat": 1})

    spark = spark_session("local[2]", "2g")
    spark.dataSource.register(TupleDataSource)
    with tempfile.TemporaryDirectory(prefix="mailq-bench-") as tmp:
        data_dir = Path(tmp)
        start = time.perf_counter()
        generate(data_dir, args.rows)
        print(f"generated {args.rows:,} blob_references rows in {time.perf_counter() - start:.1f} s")
        url = f"embedded://{data_dir}"
        arrow = read_table(spark, Settings.from_url(url), "blob_references", partitions=args.partitions)
        partitions = arrow.rdd.getNumPartitions()
        tuples = (
            spark.read.format("mailq_tuples")
            .options(url=url, table="blob_references", partitions=str(partitions))
            .load()
        )
        assert arrow.count() == tuples.count() == args.rows
        figures = {
            "rows": args.rows,
            "partitions": partitions,
            "master": spark.sparkContext.master,
            "arrow_count_rows_per_s": best_rate(args.rows, arrow.count, args.repeat),
            "arrow_aggregate_rows_per_s": best_rate(args.rows, lambda: aggregate(arrow), args.repeat),
            "tuples_count_rows_per_s": best_rate(args.rows, tuples.count, args.repeat),
            "tuples_aggregate_rows_per_s": best_rate(args.rows, lambda: aggregate(tuples), args.repeat),
        }
    spark.stop()
    figures["ratio_count"] = figures["arrow_count_rows_per_s"] / figures["tuples_count_rows_per_s"]
    figures["ratio_aggregate"] = (
        figures["arrow_aggregate_rows_per_s"] / figures["tuples_aggregate_rows_per_s"]
    )
    figures["target_rows_per_s"] = TARGET_ROWS_PER_S
    figures["target_met"] = figures["arrow_count_rows_per_s"] >= TARGET_ROWS_PER_S
    for source in ("arrow", "tuples"):
        for measure in ("count", "aggregate"):
            print(f"{source:6} {measure:9}: {figures[f'{source}_{measure}_rows_per_s']:>12,.0f} rows/s")
    print(f"arrow / tuples: count x{figures['ratio_count']:.2f}, aggregate x{figures['ratio_aggregate']:.2f}")
    print(
        json.dumps(
            {key: round(value, 2) if isinstance(value, float) else value for key, value in figures.items()}
        )
    )


if __name__ == "__main__":
    main()
