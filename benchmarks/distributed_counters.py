"""Record 23's counter recomputation on Cassandra, detection work: the pipeline's Spark job against James's
RecomputeMailboxCountersService on the same Cassandra data, in one run, as benchmarks/counters.py measures
them on SQLite.

  spark: assets/mailboxes.py's projection_inconsistencies (a full outer join of the projection
         message_id_table with the source of truth imap_uid_table) and counter_drift (count and unseen per
         mailbox from imap_uid_table, against mailbox_counters), read through the "mailq" data source by
         token range, their rows counted, at each master;
  loop:  James's service with the cassandra-driver: list the mailboxes; for each, list its messages from
         message_id_table (its partition), read each message's entry in imap_uid_table by (message_id,
         mailbox_id), one round trip a message (the source of truth wins, an entry it lacks is not
         counted), count and unseen, read mailbox_counters and compare. With James's concurrency:
         2 mailboxes at a time (MAILBOX_CONCURRENCY), 8 reads in flight within each (MESSAGE_CONCURRENCY,
         Reactor's flatMap); the same loop one read at a time is timed once on a sample, for scale.

The repairs (healing the few projection entries, resetting the few drifting counters) are the same
statements for both and are left out: what is measured is finding them.

    eval "$(.venv/bin/python -m tests.servers env)"
    .venv/bin/python benchmarks/distributed_counters.py [--messages 100_000] [--mailboxes 1_000] [--runs 3]
        [--masters local[1],local[2],cluster[1],cluster[2]] [--sequential-mailboxes 50] [--quiet-wait 60]

A run makes a fresh keyspace and bucket on the harness's Cassandra and S3 and drops them at the end. It
loads, with concurrent prepared inserts, the data counters.py generates (the same formulas): the mailboxes
(0.1% empty), the messages spread evenly over the others, 20% unseen; 0.05% of the projection entries
orphan, 0.05% missing, 0.2% outdated; the counters right except for 3% of the mailboxes and 0.1% with no
counters row (Cassandra counters are written by increments). Both results are checked: Spark's against
what was generated, the loop's against Spark's.

`cluster[N]`, the timing, quiet waits and CPU figures are as in distributed_gc.py. Scaling (JSON
`scaling`): rows read a second per core by the Spark job (message_id_table once, imap_uid_table twice,
mailbox_counters and mailboxes once) at each master, and from the cluster's rate the projection of a
recompute over 100 million messages on N cores, assuming linear scaling.

Ratios (JSON `ratios`): spark_vs_loop = loop time / Spark time on local[2] (target >= 5), and per
master. Prints human lines, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import math
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from cassandra.concurrent import execute_concurrent_with_args
from counters import (
    _COUNT_DRIFT,
    _DEFECT_MULTIPLIER,
    _DRIFT_MULTIPLIER,
    _FLAGS,
    _FLAGS_MULTIPLIER,
    _MESSAGE_SEQUENCE,
    _MISSING,
    _NAMES,
    _NO_COUNTERS,
    _ORPHAN,
    _OUTDATED,
    _T0,
    _UNSEEN_DRIFT,
    _UNSEEN_FROM,
    mailbox_id,
    spark_run,
)
from harness import (
    Deployment,
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

from assets.mailboxes import SEEN, counter_drift, projection_inconsistencies
from mailq_runtime.settings import Settings

MAILBOX_CONCURRENCY = 2
MESSAGE_CONCURRENCY = 8
PROJECTED_MESSAGES = 100_000_000
PROJECTED_CORES = (8, 32, 128)


def message_id(i: int) -> str:
    return f"{_T0 + i * 7:016x}{_MESSAGE_SEQUENCE + i:016x}"


def flags(f: int) -> str:
    return next(value for bound, value in _FLAGS if f < bound)


@dataclass(frozen=True)
class Dataset:
    messages: int
    mailboxes: list[str]
    drifting: frozenset[str]
    inconsistencies: dict[str, int]
    rows: dict[str, int]  # per table
    load_seconds: dict[str, float]


def generate(deployment: Deployment, messages: int, mailboxes: int) -> Dataset:
    used = max(1, mailboxes - mailboxes // 1000)  # the last 0.1% stay empty
    per_mailbox = math.ceil(messages / used)
    truth, projection = [], []
    count, unseen = [0] * mailboxes, [0] * mailboxes
    kinds = dict.fromkeys(
        ("orphan_projection_entry", "missing_projection_entry", "outdated_projection_entry"), 0
    )
    for i in range(messages):
        f, d = (i * _FLAGS_MULTIPLIER) % 100, (i * _DEFECT_MULTIPLIER) % 10000
        j, uid, own = i % used, i // used + 1, flags(f)
        if d >= _ORPHAN[1]:
            truth.append((message_id(i), mailbox_id(j), uid, own))
            count[j] += 1
            unseen[j] += f >= _UNSEEN_FROM
        else:
            kinds["orphan_projection_entry"] += 1
        if _MISSING[0] <= d < _MISSING[1]:
            kinds["missing_projection_entry"] += 1
            continue
        if _OUTDATED[0] <= d < _OUTDATED[1]:
            kinds["outdated_projection_entry"] += 1
            own = SEEN if f >= _UNSEEN_FROM else ""
        projection.append((mailbox_id(j), uid, message_id(i), own))
    counters, drifting = [], set()
    for j in range(mailboxes):
        c = (j * _DRIFT_MULTIPLIER) % 1000
        observed = (count[j], unseen[j])
        if _COUNT_DRIFT[0] <= c < _COUNT_DRIFT[1]:
            observed = (observed[0] + 1 + j % 3, observed[1])
        elif _UNSEEN_DRIFT[0] <= c < _UNSEEN_DRIFT[1]:
            observed = (observed[0], observed[1] - 1 if observed[1] else observed[1] + 1)
        elif _NO_COUNTERS[0] <= c < _NO_COUNTERS[1]:
            drifting.add(mailbox_id(j))
            continue
        if observed != (count[j], unseen[j]):
            drifting.add(mailbox_id(j))
        counters.append((*observed, mailbox_id(j)))
    print(f"loading {messages:,} messages in {mailboxes:,} mailboxes ...")
    store = deployment.store
    seconds = {
        "mailboxes": load(
            store,
            "mailboxes",
            "INSERT INTO mailboxes (mailbox_id, user, name, next_uid) VALUES (?, ?, ?, ?)",
            (
                (
                    mailbox_id(j),
                    f"user{j // len(_NAMES):07d}@example.com",
                    _NAMES[j % len(_NAMES)],
                    per_mailbox + 1,
                )
                for j in range(mailboxes)
            ),
        ),
        "imap_uid_table": load(
            store,
            "imap_uid_table",
            "INSERT INTO imap_uid_table (message_id, mailbox_id, uid, flags) VALUES (?, ?, ?, ?)",
            truth,
        ),
        "message_id_table": load(
            store,
            "message_id_table",
            "INSERT INTO message_id_table (mailbox_id, uid, message_id, flags) VALUES (?, ?, ?, ?)",
            projection,
        ),
        "mailbox_counters": load(
            store,
            "mailbox_counters",
            "UPDATE mailbox_counters SET count = count + ?, unseen = unseen + ? WHERE mailbox_id = ?",
            counters,
            batch=1,
        ),
    }
    rows = {
        "mailboxes": mailboxes,
        "imap_uid_table": len(truth),
        "message_id_table": len(projection),
        "mailbox_counters": len(counters),
    }
    return Dataset(
        messages,
        [mailbox_id(j) for j in range(mailboxes)],
        frozenset(drifting),
        kinds,
        rows,
        seconds,
    )


# --- James's loop -----------------------------------------------------------------------------------------


@dataclass
class LoopResult:
    mailboxes: int
    drift: dict[str, tuple[int, int]]  # mailbox id -> recomputed (count, unseen), where it differs
    issues: set[tuple[str, str, str]]  # (mailbox id, message id, kind)


def listed_mailboxes(deployment: Deployment) -> Iterator[str]:
    """mailboxDAO.retrieveAllMailboxes: the table read whole, paged."""
    for row in deployment.store.execute("SELECT mailbox_id FROM mailboxes"):
        yield row.mailbox_id


def recompute_mailbox(deployment: Deployment, mailbox: str, in_flight: int, result: LoopResult, lock) -> None:
    store = deployment.store
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


def loop(deployment: Deployment, mailboxes: int | None = None, concurrent: bool = True) -> LoopResult:
    """The service over every mailbox (or the first `mailboxes` listed): James's concurrency, or one mailbox
    and one read at a time."""
    result = LoopResult(0, {}, set())
    lock = threading.Lock()
    listed = list(listed_mailboxes(deployment))[:mailboxes]
    if not concurrent:
        for mailbox in listed:
            recompute_mailbox(deployment, mailbox, 1, result, lock)
        return result
    with ThreadPoolExecutor(MAILBOX_CONCURRENCY) as pool:
        for done in [
            pool.submit(recompute_mailbox, deployment, m, MESSAGE_CONCURRENCY, result, lock) for m in listed
        ]:
            done.result()
    return result


# --- the run ----------------------------------------------------------------------------------------------


def measure_master(master: str, deployment: Deployment, args: argparse.Namespace) -> dict:
    spark = spark_session(master, args.driver_memory)
    try:
        warm, _ = timed(lambda: spark_run(spark, deployment.url))
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
    basis = max(per_master, key=lambda m: (m.startswith("cluster"), per_master[m]["cores"]))
    # At scale: the projection and the source of truth of every message, the source of truth again for
    # the counts; a mailbox's two small rows are neglected (1k messages a mailbox and more).
    projected = 3 * PROJECTED_MESSAGES
    return {
        "rows_read": read,
        "rows_per_s_per_core": rates,
        "projection": {
            "basis": basis,
            "rows": projected,
            "rows_per_s_per_core": rates[basis],
            "core_seconds": projected / rates[basis],
            "hours_on_cores": {str(n): projected / rates[basis] / n / 3600 for n in PROJECTED_CORES},
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--mailboxes", type=int, default=1_000)
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each method (median)")
    parser.add_argument("--masters", default="local[1],local[2],cluster[1],cluster[2]")
    parser.add_argument(
        "--sequential-mailboxes", type=int, default=50, help="mailboxes the one-at-a-time loop is timed on"
    )
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
    with fresh_deployment("counters") as deployment:
        data = generate(deployment, args.messages, args.mailboxes)
        loop(deployment, max(1, len(data.mailboxes) // 20))  # warm-up: the server's caches, the statements
        james = Runs(args.quiet_wait)
        result = LoopResult(0, {}, set())
        for run in range(args.runs):
            result = james.run(lambda: loop(deployment))
            print(f"loop: run {run + 1}: {describe(james.last)} -> {len(result.drift):,} drifting")
        sequential = Runs(args.quiet_wait)
        sample = sequential.run(lambda: loop(deployment, args.sequential_mailboxes, concurrent=False))
        sequential_s = sequential.last.wall * len(data.mailboxes) / max(1, sample.mailboxes)
        print(f"loop one read at a time: {describe(sequential.last)} for {sample.mailboxes} mailboxes")
        per_master = {master: measure_master(master, deployment, args) for master in masters}

    verified = per_master[args.verify]
    drift_rows, inconsistency_rows = verified.pop("drift_rows"), verified.pop("inconsistency_rows")
    kinds = dict.fromkeys(data.inconsistencies, 0)
    for _, _, kind in inconsistency_rows:
        kinds[kind] += 1
    # The loop cannot see a missing projection entry (record 23: "Missing entries in there will be
    # ignored"), so on a mailbox with one its count is short: those mailboxes are compared apart.
    with_missing = {m for m, _, kind in inconsistency_rows if kind == "missing_projection_entry"}
    verification = {
        "spark_drifting_mailboxes": len(drift_rows),
        "generated_drifting_mailboxes": len(data.drifting),
        "spark_drift_as_generated": set(drift_rows) == data.drifting,
        "spark_inconsistencies": kinds,
        "spark_inconsistencies_as_generated": kinds == data.inconsistencies,
        "loop_mailboxes": result.mailboxes,
        "loop_drifting_mailboxes": len(result.drift),
        "mailboxes_with_missing_entries": len(with_missing),
        "loop_drift_equals_spark": {m: v for m, v in result.drift.items() if m not in with_missing}
        == {m: v for m, v in drift_rows.items() if m not in with_missing},
        "loop_issues_equal_spark": result.issues
        == {row for row in inconsistency_rows if row[2] != "missing_projection_entry"},
    }
    figures: dict = {
        "messages": data.messages,
        "mailboxes": len(data.mailboxes),
        "rows": data.rows,
        "load_s": data.load_seconds,
        "load_rows_per_s": sum(data.rows.values()) / sum(data.load_seconds.values()),
        "runs": args.runs,
        "loop_concurrency": {"mailboxes": MAILBOX_CONCURRENCY, "messages": MESSAGE_CONCURRENCY},
        **james.summary("loop"),
        "loop_one_at_a_time_sample_mailboxes": sample.mailboxes,
        "loop_one_at_a_time_extrapolated_s": sequential_s,
        "masters": per_master,
        "verification": verification,
        "scaling": scaling(data, per_master),
    }
    ratios: dict[str, float] = {
        f"spark_vs_loop_{master}": ratio(figures["loop_s"], m["spark_s"]) for master, m in per_master.items()
    }
    targets: dict[str, bool] = {}
    two = per_master.get("local[2]")
    if two:
        ratios["spark_vs_loop"] = ratio(figures["loop_s"], two["spark_s"])
        ratios["spark_vs_loop_cpu"] = ratio(figures["loop_cpu_s"], two["spark_cpu_s"])
        ratios["spark_vs_loop_one_at_a_time"] = ratio(sequential_s, two["spark_s"])
        targets["spark_at_least_5x_loop"] = ratios["spark_vs_loop"] >= 5
    targets["results_verified"] = all(
        verification[key]
        for key in (
            "spark_drift_as_generated",
            "spark_inconsistencies_as_generated",
            "loop_drift_equals_spark",
            "loop_issues_equal_spark",
        )
    )
    figures["ratios"] = ratios
    figures["targets"] = targets
    figures["wall_s"] = time.perf_counter() - started

    print()
    print(
        f"loop: {figures['loop_s']:.1f} s, cpu {figures['loop_cpu_s']:.1f} s (one read at a time: "
        f"{sequential_s:.1f} s, extrapolated from {sample.mailboxes} mailboxes)"
    )
    for master, m in per_master.items():
        s = m["spark_stages_s"]
        print(
            f"{master}: spark {m['spark_s']:.1f} s, cpu {m['spark_cpu_s']:.1f} s (projection_inconsistencies "
            f"{s['projection']:.1f}, counter_drift {s['drift']:.1f}), "
            f"{figures['scaling']['rows_per_s_per_core'][master]:,.0f} rows/s/core"
        )
    projection = figures["scaling"]["projection"]
    print(
        f"projection ({projection['basis']}): {projection['rows']:,} rows at "
        f"{projection['rows_per_s_per_core']:,.0f} rows/s/core = {projection['core_seconds']:,.0f} "
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
