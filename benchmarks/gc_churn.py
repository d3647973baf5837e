"""What a GC run costs after the first one: the pipeline's GC assets, through Dagster, on the
embedded store at local[2], three runs on the same store:

  1. full: every deletion of the eligible generation examined (more concerned blobs than `lookup_limit`:
     the Bloom filter); the garbage is collected and the settled deletion rows of the live blobs retired;
  2. again right after: only what run 1 left is read (the filter's false positives, looked up one by one);
  3. after 1% new deletions (releases of blobs that are still live, settled): only those are examined,
     by reference lookups.

    .venv/bin/python benchmarks/gc_churn.py [--references 2_000_000] [--deletions 1_000_000] [--new 0.01]

The data is gc.py's (gc_data.py's `generate`: half the deletions name live blobs, 40% garbage), in a fresh
data dir inside the repository, removed at the end. Each run is timed whole (`blob_gc_job`, in process, with
its check, the Spark session already started: the fixed cost of a Dagster run is in every
figure). Targets: run 2 <= 5% of run 1, run 3 <= 10% of run 1. Prints human lines, then one JSON object as
the last line.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import time
from contextlib import closing
from pathlib import Path

from dagster_pyspark import LazyPySparkResource
from deployments import fresh_deployment
from gc_data import GENERATION, generate
from harness import ratio, rounded, spark_session
from quick import parse_args

from assets import jobs
from mailq_runtime.stores.embedded import DATABASE_FILE
from resources import MailqRuntime
from resources.parquet_io import SparkParquetIOManager

FIGURES = {
    "deletion_sets": ("deletions", "concerned_blobs"),
    "live_reference_filter": ("live_check", "references_read"),
    "collected_blobs": ("mode", "deleted_blobs", "kept_still_referenced", "retired_deletions"),
}


def gc_run(url: str, outputs: Path) -> tuple[float, dict]:
    pyspark = LazyPySparkResource(spark_config={"spark.master": "local[2]"})
    resources = {
        "mailq": MailqRuntime(url=url),
        "pyspark": pyspark,
        "spark_parquet": SparkParquetIOManager(base_path=str(outputs), url=url, pyspark=pyspark),
    }
    started = time.perf_counter()
    result = jobs.blob_gc_job.execute_in_process(resources=resources)
    seconds = time.perf_counter() - started
    if not result.success:
        raise SystemExit("benchmark: a GC run failed")
    figures = {}
    for event in result.get_asset_materialization_events():
        names = FIGURES.get(event.asset_key.to_user_string(), ())
        figures |= {name: event.materialization.metadata[name].value for name in names}
    return seconds, figures


def release_live(database: Path, count: int) -> int:
    """`count` new deletions of live blobs (a second owner let go; another still holds each), settled:
    dated an hour ago. One transaction, executemany."""
    now = int(time.time() * 1_000_000)
    with closing(sqlite3.connect(database, isolation_level=None)) as db:
        chosen = db.execute(
            "SELECT DISTINCT blob_id FROM blob_references WHERE generation = ? LIMIT ?", (GENERATION, count)
        ).fetchall()
        db.execute("BEGIN")
        db.executemany(
            "INSERT INTO blob_deletions (blob_id, generation, deleted_at, gc_iteration) VALUES (?, ?, ?, 3)",
            [(blob_id, GENERATION, now - 3_600_000_000) for (blob_id,) in chosen],
        )
        db.execute("COMMIT")
    return len(chosen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--references", type=int, default=2_000_000)
    parser.add_argument("--deletions", type=int, default=1_000_000)
    parser.add_argument("--new", type=float, default=0.01, help="new deletions before run 3, a share")
    parser.add_argument("--driver-memory", default="4g")
    args = parse_args(parser, {"references": 20_000, "deletions": 10_000, "driver_memory": "1g"})

    with fresh_deployment("gc-churn", None) as deployment:
        generate(deployment, args.references, args.deletions)
        spark_session("local[2]", args.driver_memory)  # started once: the runs share it
        outputs = deployment.data_dir / "pipeline"
        runs = {}
        runs["full"] = gc_run(deployment.url, outputs / "1")
        print(f"run 1, full:           {runs['full'][0]:8.1f} s  {runs['full'][1]}")
        runs["again"] = gc_run(deployment.url, outputs / "2")
        print(f"run 2, right after:    {runs['again'][0]:8.1f} s  {runs['again'][1]}")
        released = release_live(deployment.data_dir / DATABASE_FILE, int(args.deletions * args.new))
        runs["new"] = gc_run(deployment.url, outputs / "3")
        print(f"run 3, {released:,} new:  {runs['new'][0]:8.1f} s  {runs['new'][1]}")

    full = runs["full"][0]
    result = {
        "references": args.references,
        "deletions": args.deletions,
        "new_deletions": released,
        "seconds": {name: seconds for name, (seconds, _) in runs.items()},
        "figures": {name: figures for name, (_, figures) in runs.items()},
        "ratios": {
            "again_vs_full": runs["again"][0] / full,
            "new_vs_full": runs["new"][0] / full,
            "full_vs_again": ratio(full, runs["again"][0]),
        },
        "targets": {
            "again_vs_full <= 0.05": runs["again"][0] / full <= 0.05,
            "new_vs_full <= 0.10": runs["new"][0] / full <= 0.10,
        },
    }
    print(
        f"run 2 / run 1 = {result['ratios']['again_vs_full']:.1%} (target <= 5%), "
        f"run 3 / run 1 = {result['ratios']['new_vs_full']:.1%} (target <= 10%)"
    )
    print(json.dumps(rounded(result)))


if __name__ == "__main__":
    main()
