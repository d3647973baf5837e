"""Record 23's counter recomputation, detection work: the pipeline's Spark job against James's
RecomputeMailboxCountersService, on the same data in one run, on either deployment.

  spark: assets/mailboxes.py's projection_inconsistencies (a full outer join of the projection
         message_id_table with the source of truth imap_uid_table) and counter_drift (count and unseen per
         mailbox from imap_uid_table, against mailbox_counters), both read through the "mailq" data source
         (by token range on Cassandra), their rows counted, at each master;
  loop:  James's service: for each mailbox one query listing its messages from message_id_table, one read
         per message of imap_uid_table by (message_id, mailbox_id) (the source of truth wins, an entry it
         lacks is not counted), count and unseen, compared with mailbox_counters. Embedded: one Python
         process with sqlite3. Cassandra: the cassandra-driver with James's concurrency, 2 mailboxes at a
         time (MAILBOX_CONCURRENCY), 8 reads in flight within each (MESSAGE_CONCURRENCY, Reactor's
         flatMap); the same loop one read at a time is timed once on a sample, for scale.

The repairs (healing the few projection entries, resetting the few drifting counters) are the same
statements for both and are left out: what is measured is finding them.

    .venv/bin/python benchmarks/counters.py [--url URL] [--messages N] [--mailboxes N] [--runs 3]
        [--masters local[1],local[2]] [--driver-memory 4g] [--quiet-wait S]
        [--loop-mailboxes N] [--loop-budget 900]       # embedded
        [--sequential-mailboxes 50]                    # Cassandra
    .venv/bin/python benchmarks/counters.py --messages 200000 --mailboxes 2000 --runs 1    # a quick run

Without --url, a fresh embedded data dir next to the repository (10M messages in 100K mailboxes by
default, masters local[1],local[2], quiet wait 120 s). With --url, the deployment it names, which must not
exist yet: the run makes it and removes it at the end (deployments.py). On the test servers (100K messages
in 1K mailboxes by default, masters local[1],local[2],cluster[1],cluster[2], quiet wait 60 s):

    eval "$(.venv/bin/python -m mailq_servers env)"; run=bench$(date +%s)
    s3="s3=$run&s3_endpoint=$MAILQ_S3_ENDPOINT&s3_region=us-east-1"
    url="cassandra://$MAILQ_CASSANDRA_HOST:$MAILQ_CASSANDRA_PORT/$run?$s3&broker=embedded:/tmp/$run"
    .venv/bin/python benchmarks/counters.py --url "$url"

The data is counters_data.py's. Embedded, the loop runs over every mailbox when a first timed sample of 1%
predicts that `--runs` passes fit in `--loop-budget` seconds; otherwise over a random sample
(`--loop-mailboxes` forces a size), its time extrapolated linearly to all mailboxes. Both results are
checked: Spark's against what was generated, the loop's against Spark's on the mailboxes it covered.

Each Spark measure runs in a new session per master (`cluster[N]`: N cores of the harness's Spark
cluster), warmed up by one full run, then `--runs` timed runs; medians are reported. Before each timed run
the script waits (up to `--quiet-wait` s) for the rest of the machine to go quiet, and it records, besides
wall time, the CPU seconds of its own process tree (driver, JVM, Python workers) and the cores other
processes kept busy meanwhile.

Scaling (JSON `scaling`): rows read a second per core by the Spark job (message_id_table once,
imap_uid_table twice, mailbox_counters and mailboxes once) at each master, and from the largest master's
rate the projection of a recompute over 100 million messages on N cores, assuming linear scaling.

Ratios (JSON `ratios`): spark_vs_loop = loop time (all mailboxes) / Spark time on local[2] (target >= 5),
and the same in CPU seconds and per master; spark_local2_vs_local1 = local[1] time / local[2] time (target
>= 1.7); spark_local2_ceiling = 2 / the cores local[1] already keeps busy, the most 2 cores can give.
Prints human lines, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field

from cassandra.concurrent import execute_concurrent_with_args
from counters_data import Dataset, generate
from deployments import Deployment, fresh_deployment
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
from pyspark.sql import SparkSession

from assets.mailboxes import SEEN, counter_drift, projection_inconsistencies
from mailq_runtime.settings import Settings
from mailq_runtime.stores.cassandra import CassandraStore
from mailq_runtime.stores.embedded import DATABASE_FILE

MAILBOX_CONCURRENCY = 2
MESSAGE_CONCURRENCY = 8
PROJECTED_MESSAGES = 100_000_000
# (embedded, distributed)
DEFAULTS = {
    "messages": (10_000_000, 100_000),
    "mailboxes": (100_000, 1_000),
    "masters": ("local[1],local[2]", "local[1],local[2],cluster[1],cluster[2]"),
    "quiet_wait": (120.0, 60.0),
}


# --- the pipeline's detection -----------------------------------------------------------------------------


def spark_run(spark: SparkSession, url: str) -> tuple[dict[str, int], dict[str, float]]:
    """Both detection queries of the mailbox_counters asset, each an action of its own as there."""
    stages: dict[str, float] = {}
    counts: dict[str, int] = {}
    stages["projection"], counts["projection_inconsistencies"] = timed(
        projection_inconsistencies(spark, Settings.from_url(url)).count
    )
    stages["drift"], counts["drifting_mailboxes"] = timed(counter_drift(spark, Settings.from_url(url)).count)
    stages["total"] = stages["projection"] + stages["drift"]
    return counts, stages


# --- James's loop -----------------------------------------------------------------------------------------


@dataclass
class LoopResult:
    mailboxes: int = 0
    drift: dict[str, tuple[int, int]] = field(
        default_factory=dict
    )  # mailbox id -> recomputed, where it differs
    issues: set[tuple[str, str, str]] = field(default_factory=set)  # (mailbox id, message id, kind) seen


def sqlite_loop(deployment: Deployment, mailboxes: list[str]) -> LoopResult:
    """The service's shape, one mailbox after the other, one message after the other. Tuned as far as that
    shape allows: one connection with a page cache that holds the tables' hot pages (1 GiB), reused
    cursors over cached statements, plain tuples."""
    result = LoopResult(len(mailboxes))
    database = deployment.data_dir / DATABASE_FILE
    with closing(sqlite3.connect(f"{database.as_uri()}?mode=ro", uri=True)) as connection:
        connection.execute("PRAGMA cache_size=-1000000")
        listing, truth, counters = connection.cursor(), connection.cursor(), connection.cursor()
        for mailbox in mailboxes:
            # One read transaction a mailbox: a consistent view of it, and the WAL's shared lock taken once
            # rather than by every statement (19 us a lookup without it, measured).
            connection.execute("BEGIN")
            count = unseen = 0
            listing.execute(
                "SELECT uid, message_id, flags FROM message_id_table WHERE mailbox_id = ?", (mailbox,)
            )
            for uid, message_id, flags in listing.fetchall():
                truth.execute(
                    "SELECT uid, flags FROM imap_uid_table WHERE message_id = ? AND mailbox_id = ?",
                    (message_id, mailbox),
                )
                entry = truth.fetchone()
                if entry is None:  # not in the source of truth: not counted
                    result.issues.add((mailbox, message_id, "orphan_projection_entry"))
                    continue
                if entry != (uid, flags):  # the source of truth's version is counted
                    result.issues.add((mailbox, message_id, "outdated_projection_entry"))
                count += 1
                unseen += SEEN not in entry[1].split(" ")
            counters.execute("SELECT count, unseen FROM mailbox_counters WHERE mailbox_id = ?", (mailbox,))
            if counters.fetchone() != (count, unseen):
                result.drift[mailbox] = (count, unseen)
            connection.execute("COMMIT")
    return result


def recompute_mailbox(
    store: CassandraStore, mailbox: str, in_flight: int, result: LoopResult, lock: threading.Lock
) -> None:
    listed = [
        (row.uid, row.message_id, row.flags)
        for row in store.execute(
            "SELECT uid, message_id, flags FROM message_id_table WHERE mailbox_id = ?", (mailbox,)
        )
    ]
    # One read a message in the source of truth, `in_flight` at a time.
    entries = execute_concurrent_with_args(
        store.session,
        store.statement("SELECT uid, flags FROM imap_uid_table WHERE message_id = ? AND mailbox_id = ?"),
        [(message, mailbox) for _, message, _ in listed],
        concurrency=in_flight,
        raise_on_first_error=True,
    )
    count = unseen = 0
    issues = set()
    for (uid, message, flags), (_, rows) in zip(listed, entries, strict=True):
        entry = rows.one()
        if entry is None:  # not in the source of truth: not counted
            issues.add((mailbox, message, "orphan_projection_entry"))
            continue
        if (entry.uid, entry.flags) != (uid, flags):  # the source of truth's version is counted
            issues.add((mailbox, message, "outdated_projection_entry"))
        count += 1
        unseen += SEEN not in entry.flags.split(" ")
    counters = store.execute(
        "SELECT count, unseen FROM mailbox_counters WHERE mailbox_id = ?", (mailbox,)
    ).one()
    with lock:
        if counters is None or (counters.count, counters.unseen) != (count, unseen):
            result.drift[mailbox] = (count, unseen)
        result.issues |= issues
        result.mailboxes += 1


def cassandra_loop(deployment: Deployment, mailboxes: list[str], concurrent: bool = True) -> LoopResult:
    """The service over `mailboxes` (mailboxDAO.retrieveAllMailboxes lists them): James's concurrency, or
    one mailbox and one read at a time."""
    result, lock, store = LoopResult(), threading.Lock(), deployment.cassandra
    if not concurrent:
        for mailbox in mailboxes:
            recompute_mailbox(store, mailbox, 1, result, lock)
        return result
    with ThreadPoolExecutor(MAILBOX_CONCURRENCY) as pool:
        for done in [
            pool.submit(recompute_mailbox, store, m, MESSAGE_CONCURRENCY, result, lock) for m in mailboxes
        ]:
            done.result()
    return result


@dataclass
class LoopRun:
    result: LoopResult  # of the last timed run
    covered: set[str]  # the mailboxes the timed runs went over
    figures: dict  # loop_s, loop_cpu_s ...; all_s, all_cpu_s: over every mailbox (extrapolated if sampled)


def sampled_loop(deployment: Deployment, data: Dataset, args: argparse.Namespace) -> LoopRun:
    everyone = data.mailboxes
    chooser = random.Random(23)
    probe = chooser.sample(everyone, max(1, min(len(everyone), len(everyone) // 100)))
    seconds, _ = timed(lambda: sqlite_loop(deployment, probe))
    estimate = seconds * len(everyone) / len(probe)
    print(f"loop: {len(probe):,} mailboxes in {seconds:.1f} s, all of them ~{estimate:.0f} s")
    if args.loop_mailboxes:
        sample = chooser.sample(everyone, min(args.loop_mailboxes, len(everyone)))
        passes = args.runs
    elif estimate * args.runs <= args.loop_budget:
        sample, passes = everyone, args.runs
    elif estimate <= args.loop_budget:
        sample, passes = everyone, 1
    else:
        sample = chooser.sample(everyone, max(1, int(len(everyone) * args.loop_budget / estimate)))
        passes = 1
    runs = Runs(args.quiet_wait)
    result = LoopResult()
    for run in range(passes):
        result = runs.run(lambda: sqlite_loop(deployment, sample))
        print(f"loop: run {run + 1}: {len(sample):,} mailboxes in {describe(runs.last)}")
    summary = runs.summary("loop")
    share = len(everyone) / len(sample)
    figures = {"sampled_mailboxes": len(sample), "runs": passes, **summary}
    figures |= {"all_s": summary["loop_s"] * share, "all_cpu_s": summary["loop_cpu_s"] * share}
    return LoopRun(result, set(sample), figures)


def concurrent_loop(deployment: Deployment, data: Dataset, args: argparse.Namespace) -> LoopRun:
    everyone = data.mailboxes
    cassandra_loop(deployment, everyone[: max(1, len(everyone) // 20)])  # warm-up: caches, statements
    runs = Runs(args.quiet_wait)
    result = LoopResult()
    for run in range(args.runs):
        result = runs.run(lambda: cassandra_loop(deployment, everyone))
        print(f"loop: run {run + 1}: {describe(runs.last)} -> {len(result.drift):,} drifting")
    sequential = Runs(args.quiet_wait)
    sample = sequential.run(
        lambda: cassandra_loop(deployment, everyone[: args.sequential_mailboxes], concurrent=False)
    )
    sequential_s = sequential.last.wall * len(everyone) / max(1, sample.mailboxes)
    print(f"loop one read at a time: {describe(sequential.last)} for {sample.mailboxes} mailboxes")
    summary = runs.summary("loop")
    figures = {
        "concurrency": {"mailboxes": MAILBOX_CONCURRENCY, "messages": MESSAGE_CONCURRENCY},
        **summary,
        "all_s": summary["loop_s"],
        "all_cpu_s": summary["loop_cpu_s"],
        "one_at_a_time_sample_mailboxes": sample.mailboxes,
        "one_at_a_time_extrapolated_s": sequential_s,
    }
    return LoopRun(result, set(everyone), figures)


# --- the run ----------------------------------------------------------------------------------------------


def measure_master(master: str, deployment: Deployment, args: argparse.Namespace) -> dict:
    spark = spark_session(master, args.driver_memory)
    try:
        warm, _ = timed(lambda: spark_run(spark, deployment.url))  # full size: JIT, workers, both plans
        print(f"{master}: warmed up in {warm:.1f} s")
        runs = Runs(args.quiet_wait)
        stages: list[dict[str, float]] = []
        found: dict[str, int] = {}
        for run in range(args.runs):
            found, seconds = runs.run(lambda: spark_run(spark, deployment.url))
            stages.append(seconds)
            print(
                f"{master}: run {run + 1}: {describe(runs.last)} [projection_inconsistencies "
                f"{seconds['projection']:.1f} -> {found['projection_inconsistencies']:,}, counter_drift "
                f"{seconds['drift']:.1f} -> {found['drifting_mailboxes']:,}]"
            )
        result = {
            "cores": master_cores(master),
            "partitions": spark.sparkContext.defaultParallelism,
            **runs.summary("spark"),
            "spark_stages_s": {key: median([r[key] for r in stages]) for key in ("projection", "drift")},
            "counts": found,
        }
        if args.verify == master:
            result["drift_rows"] = {
                row["mailbox_id"]: (row["count"], row["unseen"])
                for row in counter_drift(spark, Settings.from_url(deployment.url)).toLocalIterator()
            }
            result["inconsistency_rows"] = {
                (row["mailbox_id"], row["message_id"], row["kind"])
                for row in projection_inconsistencies(
                    spark, Settings.from_url(deployment.url)
                ).toLocalIterator()
            }
        return result
    finally:
        spark.stop()


def scaling(data: Dataset, per_master: dict[str, dict]) -> dict:
    rows = data.rows
    read = (
        rows["message_id_table"] + 2 * rows["imap_uid_table"] + rows["mailbox_counters"] + rows["mailboxes"]
    )
    rates = {master: read / m["spark_s"] / m["cores"] for master, m in per_master.items()}
    # At scale: the projection and the source of truth of every message, the source of truth again for
    # the counts; a mailbox's two small rows are neglected (1k messages a mailbox and more).
    return {
        "rows_read": read,
        "rows_per_s_per_core": rates,
        "projection": projection(per_master, rates, 3 * PROJECTED_MESSAGES),
    }


def verification(data: Dataset, loop: LoopRun, verified: dict) -> dict:
    """Spark against what was generated; the loop against Spark on the mailboxes it covered. The loop
    cannot see a missing projection entry (record 23: "Missing entries in there will be ignored"), so on
    a mailbox with one its count is short: those mailboxes are compared apart."""
    drift_rows, inconsistency_rows = verified.pop("drift_rows"), verified.pop("inconsistency_rows")
    covered, result = loop.covered, loop.result
    kinds = dict.fromkeys(data.inconsistencies, 0)
    for _, _, kind in inconsistency_rows:
        kinds[kind] += 1
    with_missing = {m for m, _, kind in inconsistency_rows if kind == "missing_projection_entry"} & covered
    spark_drift = {m: v for m, v in drift_rows.items() if m in covered and m not in with_missing}
    spark_issues = {
        row for row in inconsistency_rows if row[0] in covered and row[2] != "missing_projection_entry"
    }
    return {
        "spark_drifting_mailboxes": len(drift_rows),
        "generated_drifting_mailboxes": len(data.drifting),
        "spark_drift_as_generated": set(drift_rows) == data.drifting,
        "spark_inconsistencies": kinds,
        "generated_inconsistencies": data.inconsistencies,
        "spark_inconsistencies_as_generated": kinds == data.inconsistencies,
        "loop_mailboxes": len(covered),
        "loop_drifting_mailboxes": len(result.drift),
        "mailboxes_with_missing_entries": len(with_missing),
        "loop_drift_equals_spark": {m: v for m, v in result.drift.items() if m not in with_missing}
        == spark_drift,
        "loop_issues_equal_spark": result.issues == spark_issues,
        "loop_disagreements_from_missing_entries": sum(
            1 for m in with_missing if result.drift.get(m) != drift_rows.get(m)
        ),
    }


def ratios_and_targets(loop: dict, per_master: dict[str, dict], verified: dict) -> tuple[dict, dict]:
    ratios = {
        f"spark_vs_loop_{master}": ratio(loop["all_s"], m["spark_s"]) for master, m in per_master.items()
    }
    targets: dict[str, bool] = {}
    two, one = per_master.get("local[2]"), per_master.get("local[1]")
    if two:
        ratios["spark_vs_loop"] = ratio(loop["all_s"], two["spark_s"])
        # The same in CPU seconds, which other work on the machine hardly inflates.
        ratios["spark_vs_loop_cpu"] = ratio(loop["all_cpu_s"], two["spark_cpu_s"])
        if "one_at_a_time_extrapolated_s" in loop:
            ratios["spark_vs_loop_one_at_a_time"] = ratio(
                loop["one_at_a_time_extrapolated_s"], two["spark_s"]
            )
        targets["spark_at_least_5x_loop"] = ratios["spark_vs_loop"] >= 5
    if one and two:
        ratios["spark_local2_vs_local1"] = ratio(one["spark_s"], two["spark_s"])
        # local[1] already keeps more than one core busy (a task's Python reader and its JVM consumer run
        # side by side), so 2 cores can speed it up by 2 / that at most.
        ratios["spark_local2_ceiling"] = 2 / one["spark_cores"] if one["spark_cores"] else float("inf")
        targets["spark_local2_at_least_1_7x_local1"] = ratios["spark_local2_vs_local1"] >= 1.7
    checks = (
        "spark_drift_as_generated",
        "spark_inconsistencies_as_generated",
        "loop_drift_equals_spark",
        "loop_issues_equal_spark",
    )
    targets["results_verified"] = all(verified[key] for key in checks)
    return ratios, targets


def report(figures: dict) -> None:
    loop, per_master = figures["loop"], figures["masters"]
    print()
    line = (
        f"loop: {loop['loop_s']:.1f} s, cpu {loop['loop_cpu_s']:.1f} s (all mailboxes: {loop['all_s']:.1f} s"
    )
    if "one_at_a_time_extrapolated_s" in loop:
        line += f"; one read at a time: {loop['one_at_a_time_extrapolated_s']:.1f} s"
    print(line + ")")
    for master, m in per_master.items():
        s = m["spark_stages_s"]
        print(
            f"{master}: spark {m['spark_s']:.1f} s, cpu {m['spark_cpu_s']:.1f} s, "
            f"{m['spark_cores']:.2f} cores (projection_inconsistencies {s['projection']:.1f}, "
            f"counter_drift {s['drift']:.1f}), "
            f"{figures['scaling']['rows_per_s_per_core'][master]:,.0f} rows/s/core"
        )
    print_projection(figures["scaling"]["projection"])
    print_outcome(figures)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int)
    parser.add_argument("--mailboxes", type=int)
    parser.add_argument("--loop-mailboxes", type=int, default=0, help="embedded: run the loop on this many")
    parser.add_argument(
        "--loop-budget", type=float, default=900.0, help="embedded: seconds the loop may take"
    )
    parser.add_argument(
        "--sequential-mailboxes", type=int, default=50, help="Cassandra: mailboxes of the one-at-a-time loop"
    )
    args = arguments(parser, DEFAULTS, {"messages": 20_000, "mailboxes": 200, "sequential_mailboxes": 5})
    started = time.perf_counter()
    with fresh_deployment("counters", args.url) as deployment:
        data = generate(deployment, args.messages, args.mailboxes)
        loop = (concurrent_loop if deployment.distributed else sampled_loop)(deployment, data, args)
        per_master = {master: measure_master(master, deployment, args) for master in args.masters}
    checked = verification(data, loop, per_master[args.verify])
    figures: dict = {
        "messages": data.messages,
        "mailboxes": len(data.mailboxes),
        "rows": data.rows,
        "generation_s": data.seconds,
        "runs": args.runs,
        "loop": loop.figures,
        "masters": per_master,
        "verification": checked,
        "scaling": scaling(data, per_master),
    }
    figures["ratios"], figures["targets"] = ratios_and_targets(loop.figures, per_master, checked)
    figures["wall_s"] = time.perf_counter() - started
    report(figures)


if __name__ == "__main__":
    main()
