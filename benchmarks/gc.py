"""The mark phase of record 39's blob GC (which concerned blobs of an eligible generation to delete), three
ways on the same data in one run, on either deployment:

  a. bloom: the pipeline's Bloom GC (assets/blobs.py: deletion_sets, live_reference_filter,
     collected_blobs), through the same functions, Dagster left out: the eligible generation's deletions
     read through the "mailq" data source by generation and grouped into the concerned blobs; the
     references of the generation read likewise (by token range on Cassandra) and folded into a Bloom
     filter at fpp 0.01 (bloom_filter, checkpointed as the asset does), the concerned blobs tested against
     it (not_in_filter), the result counted. The filter is sized for `--expected-references`; 0, the
     pipeline's default, sizes it by the references table's rowid span (embedded), and on Cassandra (no
     cheap bound) the filter is sized for R, as James's GC is given its `expectedBlobCount`;
  a'. bloom_counted (Cassandra): the same with `expected_references: 0`, which there keeps the references'
     read and counts it to size the filter: one timed run per master, reported beside;
  b. antijoin: the exact mode (exact_absent) on the same inputs, a sort-merge left anti-join
     (spark.sql.autoBroadcastJoinThreshold=-1; the plan Spark picks by default is reported too);
  c. single_process: James's BloomFilterGCAlgorithm in one Python process (gc_single.py), its filter
     sized as the Bloom GC's; embedded, a plain version (fetchmany, built-in hash) is timed once for scale.

    .venv/bin/python benchmarks/gc.py [--url URL] [--references N] [--deletions N] [--runs 3]
        [--masters local[1],local[2]] [--fpp 0.01] [--expected-references 0] [--driver-memory 4g]
        [--quiet-wait S]
    .venv/bin/python benchmarks/gc.py --references 200000 --deletions 20000 --runs 1    # a quick run

Without --url, a fresh embedded data dir next to the repository (10M references and 1M deletions by
default, masters local[1],local[2], quiet wait 120 s). With --url, the deployment it names, which must not
exist yet: the run makes it and removes it at the end (deployments.py). On the test servers (1M references
and 100K deletions by default, masters local[1],local[2],cluster[1],cluster[2], quiet wait 60 s):

    eval "$(.venv/bin/python -m mailq_servers env)"; run=bench$(date +%s)
    s3="s3=$run&s3_endpoint=$MAILQ_S3_ENDPOINT&s3_region=us-east-1"
    url="cassandra://$MAILQ_CASSANDRA_HOST:$MAILQ_CASSANDRA_PORT/$run?$s3&broker=embedded:/tmp/$run"
    .venv/bin/python benchmarks/gc.py --url "$url"

The data is gc_data.py's. The results are checked against each other: exact = the garbage, Bloom results
within it, and the Bloom false positives near the rate the filter's true load predicts (0.75 R distinct
ids in a filter sized for R: about 0.24%, not the nominal 1%).

Left out of the Bloom measure, as outside the mark: the Parquet hand-over between the assets, the
deletion sets' metadata pass, and collected_blobs' exact audit of what the filter kept (`kept_live`: a
distinct of all references and a join, which costs more than the whole mark; see the report).

Each Spark measure runs in a new session per master (`cluster[N]`: the harness's standalone cluster with
spark.cores.max=N, one core an executor), warmed up by one full run of each method, then `--runs` timed
runs of each method, interleaved; medians are reported. Before each timed run the script waits (up to
`--quiet-wait` s) for the rest of the machine to go quiet, and it records, besides wall time, the CPU
seconds of its own process tree (driver, local executors and their Python workers; on the cluster the
executors are the workers' children, so they are left out there) and the cores other processes kept busy
meanwhile: on a shared machine the CPU figures still compare the methods' work.

Scaling (JSON `scaling`): rows read per second per core by each method at each master (each reads the
references and the deletions once), and from the widest master's Bloom rate the projection of one GC
iteration over 1 billion references and 10 million deletions on N cores, assuming linear scaling.

Ratios (the JSON's `ratios`, on local[2] unless named): bloom_vs_antijoin = antijoin time / bloom time
(> 1: Bloom faster; target > 1); bloom_vs_single_process = bloom time / single-process time (target
<= 1.5); *_cpu: the same in CPU seconds; *_local2_vs_local1 = local[1] time / local[2] time (target
>= 1.7 for Bloom); *_local2_ceiling = 2 / the cores local[1] already keeps busy, the most 2 cores can give.
Prints human lines, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import math
import time
import uuid

from deployments import Deployment, fresh_deployment
from gc_data import GENERATION, Dataset, generate
from gc_single import single_process_mark, single_process_plain
from harness import (
    Runs,
    arguments,
    describe,
    master_cores,
    median,
    print_outcome,
    print_projection,
    projection,
    ratio,
    spark_session,
    timed,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from assets import gc_mark
from assets.spark.bloom import FILTER_COLUMN, exact_absent, filter_bits, not_in_filter
from assets.spark.table_source import read_table, rows_upper_bound
from mailq_runtime.settings import Settings

# (embedded, distributed)
DEFAULTS = {
    "references": (10_000_000, 1_000_000),
    "deletions": (1_000_000, 100_000),
    "masters": ("local[1],local[2]", "local[1],local[2],cluster[1],cluster[2]"),
    "quiet_wait": (120.0, 60.0),
}
# The projection's sizes: one GC iteration of this many references and deletions.
PROJECTED_REFERENCES = 1_000_000_000
PROJECTED_DELETIONS = 10_000_000
BLOOM_STAGES = ("build", "probe")


# --- a. the pipeline's Bloom GC -------------------------------------------------------------------------


def concerned_blobs(spark: SparkSession, url: str) -> DataFrame:
    """deletion_sets: the distinct blob ids of the eligible generation's deletions."""
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


def bloom_mark(spark: SparkSession, url: str, fpp: float, expected: int) -> tuple[DataFrame, dict]:
    """The concerned blobs absent from a Bloom filter of the live references, built and probed as the
    assets do; returns the (lazy) result and the seconds of the eager stages before it."""
    stages: dict[str, float] = {}
    salt = uuid.uuid4().hex
    # live_reference_filter's work: the filter sized and built eagerly, as its IO manager would
    # materialise it (`expected` 0: from metadata, or counted in the same kept read).
    stages["build"], (filters, _) = timed(
        lambda: gc_mark.generation_filters(spark, Settings.from_url(url), [GENERATION], fpp, salt, expected)
    )
    # collected_blobs (_absent_from_filters) for the one eligible generation.
    bloom = filters.where(F.col("generation") == GENERATION).select(FILTER_COLUMN)
    return not_in_filter(bloom, concerned_blobs(spark, url), "blob_id", salt), stages


def bloom_run(spark: SparkSession, url: str, fpp: float, expected: int) -> tuple[int, dict]:
    start = time.perf_counter()
    absent, stages = bloom_mark(spark, url, fpp, expected)
    stages["probe"], count = timed(absent.count)
    stages["total"] = time.perf_counter() - start
    return count, stages


# --- b. the exact anti-join -----------------------------------------------------------------------------

_BROADCAST = "spark.sql.autoBroadcastJoinThreshold"


def exact_mark(spark: SparkSession, url: str) -> DataFrame:
    return exact_absent(live_references(spark, url), concerned_blobs(spark, url), "blob_id")


def join_strategy(df: DataFrame) -> str:
    """The join operator of the plan Spark starts from (adaptive execution may only change it when a side
    turns out smaller than the broadcast threshold, which the references never are here)."""
    plan = df._jdf.queryExecution().executedPlan().toString()
    return next(
        (
            name
            for name in ("SortMergeJoin", "BroadcastHashJoin", "ShuffledHashJoin", "BroadcastNestedLoopJoin")
            if name in plan
        ),
        "unknown",
    )


def antijoin_run(spark: SparkSession, url: str, broadcast: str = "-1") -> int:
    """`broadcast` -1: the sort-merge plan that holds at any size."""
    previous = spark.conf.get(_BROADCAST)
    spark.conf.set(_BROADCAST, broadcast)
    try:
        return exact_mark(spark, url).count()
    finally:
        spark.conf.set(_BROADCAST, previous)


# --- the run ---------------------------------------------------------------------------------------------


def effective_fpp(expected: int, fpp: float, distinct: int) -> float:
    """The false-positive rate of a filter sized for `expected` items at `fpp` holding `distinct` ones."""
    bits = filter_bits(expected, fpp)
    hashes = max(1, round(bits / expected * math.log(2)))
    return (1 - math.exp(-hashes * distinct / bits)) ** hashes


def blob_ids(df: DataFrame) -> set[str]:
    return {row["blob_id"] for row in df.select("blob_id").toLocalIterator()}


def plans(spark: SparkSession, url: str, master: str) -> dict:
    """The join the anti-join is forced to, and the one Spark picks by default, timed once if it differs."""
    spark.conf.set(_BROADCAST, "-1")
    forced = join_strategy(exact_mark(spark, url))
    spark.conf.unset(_BROADCAST)
    default = join_strategy(exact_mark(spark, url))
    figures: dict = {"antijoin_join": forced, "default_plan_join": default}
    if default != forced:
        seconds, count = timed(lambda: antijoin_run(spark, url, broadcast=spark.conf.get(_BROADCAST)))
        figures["default_plan_s"] = seconds
        print(f"{master}: default plan ({default}) {seconds:.1f} s -> {count:,}")
    else:
        print(f"{master}: the default plan is the same {default}")
    return figures


def measure_master(master: str, deployment: Deployment, args: argparse.Namespace) -> dict:
    url, fpp, expected = deployment.url, args.fpp, args.bloom_expected
    spark = spark_session(master, args.driver_memory)
    try:
        # One untimed run of each method at full size: the JVM's JIT, the Python workers, the data source
        # and both plans' operators (a lighter warm-up on the smaller table left the first timed run 2x
        # slower).
        warm, _ = timed(lambda: (bloom_run(spark, url, fpp, expected), antijoin_run(spark, url)))
        print(f"{master}: warmed up in {warm:.1f} s")
        bloom, antijoin = Runs(args.quiet_wait), Runs(args.quiet_wait)
        stages: list[dict] = []
        bloom_counts, antijoin_counts = [], []
        for run in range(args.runs):  # interleaved, so that a noisy minute hits both methods alike
            count, seconds = bloom.run(lambda: bloom_run(spark, url, fpp, expected))
            stages.append(seconds)
            bloom_counts.append(count)
            antijoin_counts.append(antijoin.run(lambda: antijoin_run(spark, url)))
            print(
                f"{master}: run {run + 1}: bloom {describe(bloom.last)} [build "
                f"{seconds['build']:.1f} + probe {seconds['probe']:.1f}] -> {count:,}; "
                f"antijoin {describe(antijoin.last)} -> {antijoin_counts[-1]:,}"
            )
        result = {
            "cores": master_cores(master),
            "partitions": spark.sparkContext.defaultParallelism,
            **bloom.summary("bloom"),
            "bloom_stages_s": {key: median([s[key] for s in stages]) for key in BLOOM_STAGES},
            "bloom_counts": bloom_counts,
            **antijoin.summary("antijoin"),
            "antijoin_counts": antijoin_counts,
            **plans(spark, url, master),
        }
        if deployment.distributed:
            counted = Runs(args.quiet_wait)
            count, seconds = counted.run(lambda: bloom_run(spark, url, fpp, 0))
            print(
                f"{master}: bloom_counted {describe(counted.last)} [build {seconds['build']:.1f} + "
                f"probe {seconds['probe']:.1f}] -> {count:,}"
            )
            result |= counted.summary("bloom_counted") | {"bloom_counted_count": count}
            result["bloom_counted_stages_s"] = {key: seconds[key] for key in BLOOM_STAGES}
        if args.verify == master:
            result["bloom_ids"] = blob_ids(bloom_mark(spark, url, fpp, expected)[0])
            result["exact_ids"] = blob_ids(exact_mark(spark, url))
        return result
    finally:
        spark.stop()


def single_process(deployment: Deployment, expected: int, args: argparse.Namespace) -> tuple[set[str], dict]:
    single = Runs(args.quiet_wait)
    stages: list[dict] = []
    found: set[str] = set()
    single_process_mark(deployment, expected, args.fpp)  # warm-up, as Spark's: the caches
    for _ in range(args.runs):
        found, seconds = single.run(lambda: single_process_mark(deployment, expected, args.fpp))
        stages.append(seconds)
        print(
            f"single process: {describe(single.last)} [build {seconds['build']:.1f} + probe "
            f"{seconds['probe']:.1f}] -> {len(found):,}"
        )
    figures = single.summary("single_process")
    figures["single_process_stages_s"] = {key: median([s[key] for s in stages]) for key in BLOOM_STAGES}
    if not deployment.distributed:
        plain = Runs(args.quiet_wait)
        count, _ = plain.run(lambda: single_process_plain(deployment, expected, args.fpp))
        print(f"single process, plain: {describe(plain.last)} -> {count:,}")
        figures["single_process_plain_s"] = plain.last.wall
    return found, figures


def scaling(data: Dataset, per_master: dict[str, dict]) -> dict:
    """Rows read a second per core by each method, and the projection of one iteration at scale."""
    read = data.references + data.deletions  # by each method, once
    rates = {
        master: {
            "bloom_rows_per_s_per_core": read / m["bloom_s"] / m["cores"],
            "antijoin_rows_per_s_per_core": read / m["antijoin_s"] / m["cores"],
        }
        for master, m in per_master.items()
    }
    bloom_rates = {master: rate["bloom_rows_per_s_per_core"] for master, rate in rates.items()}
    rows = PROJECTED_REFERENCES + PROJECTED_DELETIONS
    return {"rows_per_s_per_core": rates, "projection": projection(per_master, bloom_rates, rows)}


def verification(
    data: Dataset, expected: int, args: argparse.Namespace, single_ids: set[str], per_master: dict[str, dict]
) -> dict:
    """Exact = the garbage; no live blob in a Bloom result; the false positives near the rate predicted
    from the filter's true load (distinct references, not reference rows)."""
    verified = per_master[args.verify]
    bloom_ids, exact_ids = verified.pop("bloom_ids"), verified.pop("exact_ids")
    predicted = effective_fpp(expected, args.fpp, data.live_blobs)
    bloom_fp, single_fp = len(exact_ids - bloom_ids), len(exact_ids - single_ids)
    # Binomial spread of the false positives: 5 standard deviations, and at least 10, of the prediction.
    tolerance = max(10.0, 5 * math.sqrt(data.garbage * predicted * (1 - predicted)))
    return {
        "garbage": data.garbage,
        "exact": len(exact_ids),
        "exact_is_the_garbage": len(exact_ids) == data.garbage
        and data.garbage_ids in (None, exact_ids)
        and all(c == data.garbage for m in per_master.values() for c in m["antijoin_counts"]),
        "bloom": len(bloom_ids),
        "bloom_within_exact": bloom_ids <= exact_ids,
        "single_process": len(single_ids),
        "single_process_within_exact": single_ids <= exact_ids,
        "predicted_fpp": predicted,
        "predicted_false_positives": data.garbage * predicted,
        "bloom_false_positives": bloom_fp,
        "single_process_false_positives": single_fp,
        "false_positives_as_predicted": all(
            abs(fp - data.garbage * predicted) <= tolerance for fp in (bloom_fp, single_fp)
        ),
    }


def ratios_and_targets(figures: dict, per_master: dict[str, dict]) -> tuple[dict, dict]:
    ratios = {
        f"bloom_vs_antijoin_{master}": ratio(m["antijoin_s"], m["bloom_s"])
        for master, m in per_master.items()
    }
    targets: dict[str, bool] = {}
    two, one = per_master.get("local[2]"), per_master.get("local[1]")
    if two:
        ratios["bloom_vs_antijoin"] = ratio(two["antijoin_s"], two["bloom_s"])
        ratios["bloom_vs_single_process"] = two["bloom_s"] / figures["single_process_s"]
        # The same comparisons in CPU seconds, which other work on the machine hardly inflates.
        ratios["bloom_vs_antijoin_cpu"] = ratio(two["antijoin_cpu_s"], two["bloom_cpu_s"])
        ratios["bloom_vs_single_process_cpu"] = two["bloom_cpu_s"] / figures["single_process_cpu_s"]
        if "bloom_counted_s" in two:
            ratios["bloom_counted_vs_antijoin"] = ratio(two["antijoin_s"], two["bloom_counted_s"])
        targets["bloom_faster_than_antijoin"] = ratios["bloom_vs_antijoin"] > 1
        targets["bloom_within_1_5x_single_process"] = ratios["bloom_vs_single_process"] <= 1.5
    if one and two:
        ratios["bloom_local2_vs_local1"] = ratio(one["bloom_s"], two["bloom_s"])
        ratios["antijoin_local2_vs_local1"] = ratio(one["antijoin_s"], two["antijoin_s"])
        # local[1] already keeps more than one core busy (a task's Python reader and its JVM consumer
        # run side by side), so 2 cores can speed it up by 2 / that at most.
        ratios["bloom_local2_ceiling"] = 2 / one["bloom_cores"] if one["bloom_cores"] else float("inf")
        ratios["antijoin_local2_ceiling"] = (
            2 / one["antijoin_cores"] if one["antijoin_cores"] else float("inf")
        )
        targets["bloom_local2_at_least_1_7x_local1"] = ratios["bloom_local2_vs_local1"] >= 1.7
    checks = (
        "exact_is_the_garbage",
        "bloom_within_exact",
        "single_process_within_exact",
        "false_positives_as_predicted",
    )
    targets["results_verified"] = all(figures["verification"][key] for key in checks)
    return ratios, targets


def report(figures: dict) -> None:
    print()
    line = (
        f"single process: {figures['single_process_s']:6.1f} s, cpu {figures['single_process_cpu_s']:.1f} s"
    )
    if "single_process_plain_s" in figures:
        line += f"   plain: {figures['single_process_plain_s']:6.1f} s"
    print(line)
    for master, m in figures["masters"].items():
        s = m["bloom_stages_s"]
        rates = figures["scaling"]["rows_per_s_per_core"][master]
        counted = f"; bloom_counted {m['bloom_counted_s']:6.1f} s" if "bloom_counted_s" in m else ""
        bloom = (
            f"bloom {m['bloom_s']:6.1f} s, cpu {m['bloom_cpu_s']:.1f} s, {m['bloom_cores']:.2f} cores "
            f"[build {s['build']:.1f}, probe {s['probe']:.1f}], "
            f"{rates['bloom_rows_per_s_per_core']:,.0f} rows/s/core"
        )
        antijoin = (
            f"antijoin {m['antijoin_s']:6.1f} s, cpu {m['antijoin_cpu_s']:.1f} s, {m['antijoin_cores']:.2f} "
            f"cores ({m['antijoin_join']}), {rates['antijoin_rows_per_s_per_core']:,.0f} rows/s/core"
        )
        print(f"{master}: {bloom}; {antijoin}{counted}")
    print_projection(figures["scaling"]["projection"])
    print_outcome(figures)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--references", type=int)
    parser.add_argument("--deletions", type=int)
    parser.add_argument("--fpp", type=float, default=0.01)
    parser.add_argument(
        "--expected-references",
        type=int,
        default=0,
        help="the filter's expected count, as the asset's config; 0 (its default): the rowid span, on "
        "Cassandra the references generated",
    )
    args = arguments(parser, DEFAULTS, {"references": 20_000, "deletions": 10_000})
    started = time.perf_counter()
    with fresh_deployment("gc", args.url) as deployment:
        data = generate(deployment, args.references, args.deletions)
        if deployment.distributed:
            args.bloom_expected = args.expected_references or data.references
            expected = args.bloom_expected
        else:
            args.bloom_expected = args.expected_references
            # The single process is given the expected count the Bloom GC sizes its filter by.
            expected = (
                args.expected_references
                or rows_upper_bound(Settings.from_url(deployment.url), "blob_references")
                or 1
            )
        single_ids, single = single_process(deployment, expected, args)
        per_master = {master: measure_master(master, deployment, args) for master in args.masters}
    figures: dict = {
        "references": data.references,
        "deletions": data.deletions,
        "blobs": data.blobs,
        "live_blobs": data.live_blobs,
        "concerned_blobs": data.concerned,
        "garbage_blobs": data.garbage,
        "generation_s": data.seconds,
        "fpp": args.fpp,
        "expected_references": expected,
        "filter_bits": filter_bits(expected, args.fpp),
        "runs": args.runs,
        **single,
        "verification": verification(data, expected, args, single_ids, per_master),
        "masters": per_master,
        "scaling": scaling(data, per_master),
    }
    figures["ratios"], figures["targets"] = ratios_and_targets(figures, per_master)
    figures["wall_s"] = time.perf_counter() - started
    report(figures)


if __name__ == "__main__":
    main()
