"""The mark phase of record 39's blob GC on Cassandra (which concerned blobs of an eligible generation to
delete), three ways on the same data in one run, as benchmarks/gc.py measures it on SQLite:

  a. bloom: the pipeline's Bloom GC (assets/blobs.py: deletion_sets, live_reference_filter,
     collected_blobs) through the same functions, Dagster left out: the eligible generation's deletions
     read through the "mailq" data source by their partitions (`generations`) and grouped into the
     concerned blobs; the references read once by token range (`generation_filters`) and folded into a
     Bloom filter at fpp 0.01 sized for R references (`expected_references: R`, as James's GC is given
     its `expectedBlobCount` and as the single process below is sized), checkpointed as the asset does;
     the concerned blobs tested against it, the result counted;
  a'. bloom_counted: the same with the pipeline's default `expected_references: 0`, which on Cassandra
     (no cheap bound) keeps the references' read and counts it to size the filter: one timed run per
     master, reported beside;
  b. antijoin: the exact mode (exact_absent) on the same inputs, a sort-merge left anti-join;
  c. single_process: James's BloomFilterGCAlgorithm in one Python process with the cassandra-driver: one
     paged scan of blob_references (the next page fetched while this one is hashed) into a Bloom filter
     sized for the references, then the generation's deletion partitions read and each concerned blob
     tested (vectorised numpy, harness.NumpyBloom).

    eval "$(.venv/bin/python -m tests.servers env)"
    .venv/bin/python benchmarks/distributed_gc.py [--references 1_000_000] [--deletions 100_000] [--runs 3]
        [--masters local[1],local[2],cluster[1],cluster[2]] [--fpp 0.01] [--quiet-wait 60]
    .venv/bin/python benchmarks/distributed_gc.py --references 100000 --deletions 10000 --runs 1 \
        --masters local[2]    # a quick run

A run makes a fresh keyspace and bucket on the harness's Cassandra and S3 and drops them at the end. It
loads R references of generation 1 over 0.75 R live blobs (two a owner, a third of the blobs shared by two
owners) and D deletions of generation 1 (half naming a blob another owner still references, half garbage,
a tenth of the garbage deleted twice), with concurrent prepared inserts; the blobs table and the content
are not written, as no method reads them to find the garbage (deleting it is left out of every measure).
The results are checked: exact = the garbage, every Bloom result within it.

`cluster[N]` is the harness's standalone cluster ($MAILQ_SPARK_MASTER) with spark.cores.max=N, one core
an executor. Each master gets a new session, warmed up by one run of each method, then `--runs` timed
runs of each, interleaved; medians are reported, each timed run after a wait (up to `--quiet-wait` s) for
the rest of the machine to go quiet. CPU seconds count this process tree (driver, local executors and
their Python workers): on the cluster the executors are the workers' children, so they are left out there.

Scaling (JSON `scaling`): rows read per second per core by each method at each master (each method reads
the references and the deletions once), and from the per-core rate on the cluster the projection of one GC
iteration over 1 billion references and 10 million deletions on N cores, assuming linear scaling.

Ratios (JSON `ratios`, on local[2]): bloom_vs_antijoin = antijoin time / bloom time (target > 1);
bloom_vs_single_process = bloom time / single-process time (target <= 1.5). Prints human lines, then one
JSON object as the last line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
import uuid
from dataclasses import dataclass

import numpy as np
from cassandra.cluster import EXEC_PROFILE_DEFAULT
from cassandra.query import tuple_factory
from harness import (
    Deployment,
    NumpyBloom,
    Runs,
    describe,
    fresh_deployment,
    load,
    master_cores,
    median,
    ratio,
    rounded,
    spark_session,
    timed,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from assets import blobs
from assets.spark.bloom import FILTER_COLUMN, exact_absent, not_in_filter
from assets.spark.table_source import read_table
from mailq_runtime.settings import Settings
from mailq_runtime.stores.cassandra.blobs import shard_of
from mailq_runtime.stores.cassandra.schema import DELETION_SHARDS

GENERATION = 1
_SPREAD = 1_000_003  # a prime: reference i names live blob (i * _SPREAD) % live, every one at least once
_T0 = 1_700_000_000_000_000
_WIDTH = len(f"g{GENERATION}_") + 64
# The projection's sizes: one GC iteration of this many references and deletions.
PROJECTED_REFERENCES = 1_000_000_000
PROJECTED_DELETIONS = 10_000_000
PROJECTED_CORES = (8, 32, 128)


def blob_id(slot: int) -> str:
    """The id of blob `slot` as BlobId makes them (generation, then 64 hex digits of a hash)."""
    return f"g{GENERATION}_{hashlib.sha256(slot.to_bytes(8, 'big')).hexdigest()}"


@dataclass(frozen=True)
class Dataset:
    references: int
    deletions: int
    live_blobs: int
    garbage: frozenset[str]  # what an exact mark finds
    load_seconds: dict[str, float]


def generate(deployment: Deployment, references: int, deletions: int) -> Dataset:
    live = references * 3 // 4
    live_deleted = deletions // 10 * 5 + min(deletions % 10, 5)
    if not 0 < live_deleted <= live or live % _SPREAD == 0:
        raise SystemExit("need at least 2 references and at most 1.5x as many deletions as references")
    stride = live // live_deleted
    print(f"loading {references:,} references and {deletions:,} deletions ...")
    seconds = {
        "blob_references": load(
            deployment.store,
            "blob_references",
            "INSERT INTO blob_references (owner, blob_id, generation) VALUES (?, ?, ?)",
            ((f"{i // 2:032x}", blob_id(i * _SPREAD % live), GENERATION) for i in range(references)),
        )
    }
    # In groups of ten: five name live blobs spread over all of them, five name four garbage blobs (the
    # last one released by two owners).
    deleted = [
        (i // 10 * 5 + i % 10) * stride if i % 10 < 5 else live + i // 10 * 4 + min(i % 10 - 5, 3)
        for i in range(deletions)
    ]
    ids = [blob_id(slot) for slot in deleted]
    seconds["blob_deletions"] = load(
        deployment.store,
        "blob_deletions",
        "INSERT INTO blob_deletions (generation, shard, blob_id, deleted_at, gc_iteration) "
        "VALUES (?, ?, ?, ?, ?)",
        ((GENERATION, shard_of(ids[i]), ids[i], _T0 + i * 1000, 2 + i % 2) for i in range(deletions)),
    )
    garbage = frozenset(ids[i] for i, slot in enumerate(deleted) if slot >= live)
    return Dataset(references, deletions, live, garbage, seconds)


# --- a. the pipeline's Bloom GC -------------------------------------------------------------------------


def concerned_blobs(spark: SparkSession, url: str) -> DataFrame:
    """deletion_sets: the distinct blob ids of the eligible generation's deletions, read by partition."""
    deletions = read_table(spark, Settings.from_url(url), "blob_deletions", generations=[GENERATION])
    return deletions.groupBy("generation", "blob_id").agg(
        F.count("*").alias("deletions"), F.min("deleted_at").alias("first_deleted_at")
    )


def live_references(spark: SparkSession, url: str) -> DataFrame:
    """live_reference_filter's input: the generation's references, the two columns it needs."""
    references = read_table(
        spark, Settings.from_url(url), "blob_references", columns=["blob_id", "generation"]
    )
    return references.where(F.col("generation") == GENERATION)


def bloom_run(spark: SparkSession, url: str, fpp: float, expected: int) -> tuple[int, dict[str, float]]:
    """`expected` 0: the references counted to size the filter, in the same kept read it is built from."""
    stages: dict[str, float] = {}
    start = time.perf_counter()
    salt = uuid.uuid4().hex
    stages["build"], (filters, _) = timed(
        lambda: blobs.generation_filters(spark, Settings.from_url(url), [GENERATION], fpp, salt, expected)
    )
    absent = not_in_filter(filters.select(FILTER_COLUMN), concerned_blobs(spark, url), "blob_id", salt)
    stages["probe"], count = timed(absent.count)
    stages["total"] = time.perf_counter() - start
    return count, stages


def bloom_ids(spark: SparkSession, url: str, fpp: float, expected: int) -> set[str]:
    salt = uuid.uuid4().hex
    filters, _ = blobs.generation_filters(spark, Settings.from_url(url), [GENERATION], fpp, salt, expected)
    absent = not_in_filter(filters.select(FILTER_COLUMN), concerned_blobs(spark, url), "blob_id", salt)
    return {row["blob_id"] for row in absent.select("blob_id").toLocalIterator()}


# --- b. the exact anti-join -----------------------------------------------------------------------------

_BROADCAST = "spark.sql.autoBroadcastJoinThreshold"


def exact_mark(spark: SparkSession, url: str) -> DataFrame:
    return exact_absent(live_references(spark, url), concerned_blobs(spark, url), "blob_id")


def antijoin_run(spark: SparkSession, url: str) -> int:
    previous = spark.conf.get(_BROADCAST)
    spark.conf.set(_BROADCAST, "-1")  # the sort-merge plan that holds at any size
    try:
        return exact_mark(spark, url).count()
    finally:
        spark.conf.set(_BROADCAST, previous)


# --- c. James's algorithm in one process ----------------------------------------------------------------

_FETCH = 5_000


def _pages(deployment: Deployment, cql: str, parameters: tuple = ()):
    """The rows of a statement page by page, the next page asked for before this one is handed over, so
    that the server and the driver's I/O thread work while the caller hashes."""
    store = deployment.store
    statement = store.statement(cql).bind(parameters)
    statement.fetch_size = _FETCH
    profile = store.session.execution_profile_clone_update(EXEC_PROFILE_DEFAULT, row_factory=tuple_factory)
    future = store.session.execute_async(statement, execution_profile=profile)
    while True:
        rows = future.result().current_rows
        more = future.has_more_pages
        if more:
            future.start_fetching_next_page()
        yield rows
        if not more:
            return


def _matrix(ids: list[str]) -> np.ndarray:
    data = "".join(ids).encode()
    if len(data) != len(ids) * _WIDTH:
        raise ValueError(f"blob ids of generation {GENERATION} should take {_WIDTH} bytes each")
    return np.frombuffer(data, np.uint8).reshape(len(ids), _WIDTH)


def single_process_mark(deployment: Deployment, expected: int, fpp: float) -> tuple[set[str], dict]:
    stages: dict[str, float] = {}
    start = time.perf_counter()
    bloom = NumpyBloom(expected, fpp)
    batch: list[str] = []
    for rows in _pages(deployment, "SELECT blob_id, generation FROM blob_references"):
        batch.extend(blob for blob, generation in rows if generation == GENERATION)
        if len(batch) >= 65_536:
            bloom.put(bloom.hash_rows(_matrix(batch)))
            batch = []
    if batch:
        bloom.put(bloom.hash_rows(_matrix(batch)))
    stages["build"] = time.perf_counter() - start
    concerned: set[str] = set()
    for shard in range(DELETION_SHARDS):
        cql = "SELECT blob_id FROM blob_deletions WHERE generation = ? AND shard = ?"
        for rows in _pages(deployment, cql, (GENERATION, shard)):
            concerned.update(blob for (blob,) in rows)
    ordered = sorted(concerned)
    absent = (
        {ordered[i] for i in np.flatnonzero(~bloom.might_contain(bloom.hash_rows(_matrix(ordered))))}
        if ordered
        else set()
    )
    stages["probe"] = time.perf_counter() - start - stages["build"]
    stages["total"] = time.perf_counter() - start
    return absent, stages


# --- the run ---------------------------------------------------------------------------------------------


def measure_master(master: str, deployment: Deployment, data: Dataset, args: argparse.Namespace) -> dict:
    url = deployment.url
    spark = spark_session(master, args.driver_memory)
    try:
        expected = data.references
        warm, _ = timed(lambda: (bloom_run(spark, url, args.fpp, expected), antijoin_run(spark, url)))
        print(f"{master}: warmed up in {warm:.1f} s")
        bloom, antijoin, counted = Runs(args.quiet_wait), Runs(args.quiet_wait), Runs(args.quiet_wait)
        stages: list[dict[str, float]] = []
        bloom_counts, antijoin_counts = [], []
        for run in range(args.runs):  # interleaved, so that a noisy minute hits both methods alike
            count, seconds = bloom.run(lambda: bloom_run(spark, url, args.fpp, expected))
            stages.append(seconds)
            bloom_counts.append(count)
            antijoin_counts.append(antijoin.run(lambda: antijoin_run(spark, url)))
            print(
                f"{master}: run {run + 1}: bloom {describe(bloom.last)} [build "
                f"{seconds['build']:.1f} + probe {seconds['probe']:.1f}] -> {count:,}; "
                f"antijoin {describe(antijoin.last)} -> {antijoin_counts[-1]:,}"
            )
        counted_count, counted_stages = counted.run(lambda: bloom_run(spark, url, args.fpp, 0))
        print(
            f"{master}: bloom_counted {describe(counted.last)} [build {counted_stages['build']:.1f} + "
            f"probe {counted_stages['probe']:.1f}] -> {counted_count:,}"
        )
        result = {
            "cores": master_cores(master),
            "partitions": spark.sparkContext.defaultParallelism,
            **bloom.summary("bloom"),
            "bloom_stages_s": {key: median([s[key] for s in stages]) for key in ("build", "probe")},
            "bloom_counts": bloom_counts,
            **antijoin.summary("antijoin"),
            "antijoin_counts": antijoin_counts,
            **counted.summary("bloom_counted"),
            "bloom_counted_stages_s": {key: counted_stages[key] for key in ("build", "probe")},
            "bloom_counted_count": counted_count,
        }
        if args.verify == master:
            result["bloom_ids"] = bloom_ids(spark, url, args.fpp, expected)
            exact = exact_mark(spark, url).select("blob_id")
            result["exact_ids"] = {row["blob_id"] for row in exact.toLocalIterator()}
        return result
    finally:
        spark.stop()


def scaling(data: Dataset, per_master: dict[str, dict]) -> dict:
    """Rows read a second per core by each method, and the projection of one iteration at scale."""
    bloom_rows = data.references + data.deletions  # read once
    antijoin_rows = data.references + data.deletions
    rates = {
        master: {
            "bloom_rows_per_s_per_core": bloom_rows / m["bloom_s"] / m["cores"],
            "antijoin_rows_per_s_per_core": antijoin_rows / m["antijoin_s"] / m["cores"],
        }
        for master, m in per_master.items()
    }
    figures: dict = {"rows_per_s_per_core": rates}
    # From the cluster's widest measure (else the widest local one): executors apart from the driver, as
    # on a real cluster.
    basis = max(per_master, key=lambda m: (m.startswith("cluster"), per_master[m]["cores"]))
    rate = rates[basis]["bloom_rows_per_s_per_core"]
    rows = PROJECTED_REFERENCES + PROJECTED_DELETIONS
    figures["projection"] = {
        "basis": basis,
        "rows": rows,
        "bloom_rows_per_s_per_core": rate,
        "core_seconds": rows / rate,
        "hours_on_cores": {str(n): rows / rate / n / 3600 for n in PROJECTED_CORES},
    }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--references", type=int, default=1_000_000)
    parser.add_argument("--deletions", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each method per master (median)")
    parser.add_argument("--masters", default="local[1],local[2],cluster[1],cluster[2]")
    parser.add_argument("--fpp", type=float, default=0.01)
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=60.0,
        help="seconds a timed run may wait for the rest of the machine to go quiet (0: never wait)",
    )
    args = parser.parse_args()
    masters = [master.strip() for master in args.masters.split(",") if master.strip()]
    for master in masters:
        master_cores(master)
    args.verify = "local[2]" if "local[2]" in masters else masters[-1]

    started = time.perf_counter()
    with fresh_deployment("gc") as deployment:
        data = generate(deployment, args.references, args.deletions)
        single = Runs(args.quiet_wait)
        single_stages: list[dict] = []
        single_ids: set[str] = set()
        single_process_mark(deployment, data.references, args.fpp)  # warm-up, as Spark's: the server's caches
        for _ in range(args.runs):
            single_ids, stages = single.run(
                lambda: single_process_mark(deployment, data.references, args.fpp)
            )
            single_stages.append(stages)
            print(
                f"single process: {describe(single.last)} [build {stages['build']:.1f} + probe "
                f"{stages['probe']:.1f}] -> {len(single_ids):,}"
            )
        per_master = {master: measure_master(master, deployment, data, args) for master in masters}
    verified = per_master[args.verify]
    bloom_found, exact_found = verified.pop("bloom_ids"), verified.pop("exact_ids")
    verification = {
        "garbage": len(data.garbage),
        "exact": len(exact_found),
        "exact_is_the_garbage": exact_found == data.garbage
        and all(c == len(data.garbage) for m in per_master.values() for c in m["antijoin_counts"]),
        "bloom": len(bloom_found),
        "bloom_within_exact": bloom_found <= exact_found,
        "single_process": len(single_ids),
        "single_process_within_exact": single_ids <= exact_found,
        "bloom_false_positives": len(exact_found - bloom_found),
        "single_process_false_positives": len(exact_found - single_ids),
    }
    figures: dict = {
        "references": data.references,
        "deletions": data.deletions,
        "live_blobs": data.live_blobs,
        "garbage_blobs": len(data.garbage),
        "load_s": data.load_seconds,
        "load_rows_per_s": (data.references + data.deletions) / sum(data.load_seconds.values()),
        "fpp": args.fpp,
        "runs": args.runs,
        **single.summary("single_process"),
        "single_process_stages_s": {k: median([s[k] for s in single_stages]) for k in ("build", "probe")},
        "masters": per_master,
        "verification": verification,
        "scaling": scaling(data, per_master),
    }
    ratios: dict[str, float] = {}
    targets: dict[str, bool] = {}
    two = per_master.get("local[2]")
    if two:
        ratios["bloom_vs_antijoin"] = ratio(two["antijoin_s"], two["bloom_s"])
        ratios["bloom_vs_single_process"] = two["bloom_s"] / figures["single_process_s"]
        ratios["bloom_vs_antijoin_cpu"] = ratio(two["antijoin_cpu_s"], two["bloom_cpu_s"])
        ratios["bloom_vs_single_process_cpu"] = two["bloom_cpu_s"] / figures["single_process_cpu_s"]
        ratios["bloom_counted_vs_antijoin"] = ratio(two["antijoin_s"], two["bloom_counted_s"])
        targets["bloom_faster_than_antijoin"] = ratios["bloom_vs_antijoin"] > 1
        targets["bloom_within_1_5x_single_process"] = ratios["bloom_vs_single_process"] <= 1.5
    for master, m in per_master.items():
        ratios[f"bloom_vs_antijoin_{master}"] = ratio(m["antijoin_s"], m["bloom_s"])
    targets["results_verified"] = all(
        verification[key]
        for key in ("exact_is_the_garbage", "bloom_within_exact", "single_process_within_exact")
    )
    figures["ratios"] = ratios
    figures["targets"] = targets
    figures["wall_s"] = time.perf_counter() - started

    print()
    print(
        f"single process: {figures['single_process_s']:6.1f} s, cpu {figures['single_process_cpu_s']:.1f} s"
    )
    for master, m in per_master.items():
        s = m["bloom_stages_s"]
        rates = figures["scaling"]["rows_per_s_per_core"][master]
        print(
            f"{master}: bloom {m['bloom_s']:6.1f} s [build {s['build']:.1f}, probe "
            f"{s['probe']:.1f}], {rates['bloom_rows_per_s_per_core']:,.0f} rows/s/core; antijoin "
            f"{m['antijoin_s']:6.1f} s, {rates['antijoin_rows_per_s_per_core']:,.0f} rows/s/core; "
            f"bloom_counted {m['bloom_counted_s']:6.1f} s"
        )
    projection = figures["scaling"]["projection"]
    print(
        f"projection ({projection['basis']}): {projection['rows']:,} rows at "
        f"{projection['bloom_rows_per_s_per_core']:,.0f} rows/s/core = {projection['core_seconds']:,.0f} "
        "core-seconds: "
        + ", ".join(f"{h:.2f} h on {n} cores" for n, h in projection["hours_on_cores"].items())
    )
    print(f"verification: {verification}")
    for name, value in ratios.items():
        print(f"{name}: {value:.2f}")
    for name, met in targets.items():
        print(f"target {name}: {'met' if met else 'MISSED'}")
    print(json.dumps(rounded(figures)))


if __name__ == "__main__":
    main()
