"""What the mail queues hold, at a glance: each queue's mails by state, the live mails per recipient domain,
and the dead letters by reason and age, with a check that warns when the dead letters grow."""

from datetime import datetime

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from mailq_runtime.clock import MICROS_PER_SECOND, from_datetime
from mailq_runtime.settings import Settings
from resources import MailqRuntime

from .metadata import DATETIME, table, when
from .spark.table_source import read_table

GROUP = "mail_queue"
TOP_DOMAINS = 20
# The age classes of the dead letters: (column, upper bound in seconds, what it holds).
AGES = (
    ("died_within_1h", 3600, "died in the last hour"),
    ("died_1h_to_1d", 86400, "died between an hour and a day ago"),
    ("died_1d_to_7d", 7 * 86400, "died between a day and a week ago"),
    ("died_over_7d", None, "died more than a week ago"),
)
DEAD_LETTERS_CHECK = "dead_letters_not_growing"


def _shown(moment: datetime | None, unknown: bool = False) -> str:
    if unknown:
        return "unknown on this broker"
    return "" if moment is None else when(from_datetime(moment))


@dg.asset(group_name=GROUP, kinds={"python"})
def mail_queue_overview(mailq: MailqRuntime) -> dg.MaterializeResult:
    """Per queue: ready, in-flight, delayed and dead-lettered mails and the oldest of each, read from the
    slice counters, the delayed mails, the dead letters and the broker's counts, without a browse (the
    same figures as `mailq queues`)."""
    runtime = mailq.runtime
    overviews = [runtime.queue(name, create=False).overview() for name in runtime.queues()]
    rows = [
        {
            "queue": o.queue,
            "size": o.size,
            "ready": -1 if o.ready is None else o.ready,
            "in_flight": -1 if o.in_flight is None else o.in_flight,
            "delayed": o.delayed,
            "dead_letters": o.dead_letters,
            "oldest_ready": _shown(o.oldest_ready, "oldest_ready" in o.unknown),
            "oldest_in_flight": _shown(o.oldest_in_flight, "oldest_in_flight" in o.unknown),
            "oldest_delayed": _shown(o.oldest_delayed),
            "next_due": _shown(o.next_due),
            "oldest_dead_letter": _shown(o.oldest_dead_letter),
        }
        for o in overviews
    ]
    return dg.MaterializeResult(
        metadata={
            "queues": len(overviews),
            "live_mails": sum(o.size for o in overviews),
            "ready_mails": sum(o.ready or 0 for o in overviews),
            "in_flight_mails": sum(o.in_flight or 0 for o in overviews),
            "delayed_mails": sum(o.delayed for o in overviews),
            "dead_letters": sum(o.dead_letters for o in overviews),
            **table(
                "per_queue",
                [
                    ("queue", "string", "mail queue"),
                    ("size", "int", "live mails: ready, in flight and delayed (the slice counters)"),
                    ("ready", "int", "deliverable now, not handed to a consumer (-1: the broker is away)"),
                    ("in_flight", "int", "handed to a consumer, not settled yet (-1: the broker is away)"),
                    ("delayed", "int", "waiting for their delay to end"),
                    ("dead_letters", "int", "mails the queue will not deliver"),
                    ("oldest_ready", DATETIME, "enqueue time of the oldest ready mail"),
                    ("oldest_in_flight", DATETIME, "enqueue time of the oldest mail in flight"),
                    ("oldest_delayed", DATETIME, "enqueue time of the oldest delayed mail"),
                    ("next_due", DATETIME, "when the next delayed mail falls due"),
                    ("oldest_dead_letter", DATETIME, "when the longest-kept dead letter died"),
                ],
                rows,
                "no mail queue yet",
            ),
        }
    )


def live_mails_by_domain(spark: SparkSession, settings: Settings) -> DataFrame:
    """Per queue and recipient domain (in lower case): the live mails with a recipient there, those
    recipients, and the oldest such mail's enqueue time. A live mail is an enqueued_mails row that
    deleted_mails does not mark."""
    enqueued = read_table(
        spark, settings, "enqueued_mails", columns=("queue", "enqueue_id", "enqueued_time", "recipients")
    )
    deleted = read_table(spark, settings, "deleted_mails", columns=("queue", "enqueue_id"))
    live = enqueued.join(deleted, ["queue", "enqueue_id"], "left_anti")
    recipients = live.select(
        "queue",
        "enqueue_id",
        "enqueued_time",
        F.explode(F.from_json("recipients", "array<string>")).alias("recipient"),
    )
    # After the last '@': a quoted local part may hold one too.
    return (
        recipients.withColumn("domain", F.lower(F.substring_index("recipient", "@", -1)))
        .groupBy("queue", "domain")
        .agg(
            F.countDistinct("enqueue_id").alias("live_mails"),
            F.count("*").alias("recipients"),
            F.min("enqueued_time").alias("oldest_enqueued_time"),
        )
        .orderBy(F.desc("live_mails"), "queue", "domain")
    )


@dg.asset(group_name=GROUP, kinds={"spark"}, io_manager_key="spark_parquet")
def mail_queue_domains(mailq: MailqRuntime, pyspark: LazyPySparkResource) -> dg.Output[DataFrame]:
    """Per queue and recipient domain: the live mails bound there and the oldest of them (what a sender
    delivering by MX needs), the top domains in the metadata; every domain in the Parquet output."""
    domains = live_mails_by_domain(pyspark.spark_session, mailq.settings).cache()
    top = domains.limit(TOP_DOMAINS).collect()
    totals = domains.agg(F.count("*").alias("domains"), F.max("live_mails").alias("most")).first()
    return dg.Output(
        domains,
        metadata={
            "domains": totals["domains"],
            "most_live_mails_to_one_domain": totals["most"] or 0,
            **table(
                "top_domains",
                [
                    ("queue", "string", "mail queue"),
                    ("domain", "string", "recipient domain, in lower case"),
                    ("live_mails", "int", "live mails with at least one recipient in the domain"),
                    ("recipients", "int", "their recipients in the domain"),
                    ("oldest", DATETIME, "enqueue time of the oldest of them"),
                ],
                [
                    {
                        "queue": r["queue"],
                        "domain": r["domain"],
                        "live_mails": r["live_mails"],
                        "recipients": r["recipients"],
                        "oldest": when(r["oldest_enqueued_time"]),
                    }
                    for r in top
                ],
                "no live mail in any queue",
            ),
        },
    )


@dg.asset(
    group_name=GROUP,
    kinds={"python"},
    check_specs=[
        dg.AssetCheckSpec(
            DEAD_LETTERS_CHECK,
            asset="mail_queue_dead_letters",
            description="Warns when the queues hold more dead letters than at the asset's previous "
            "materialization.",
        )
    ],
)
def mail_queue_dead_letters(context: dg.AssetExecutionContext, mailq: MailqRuntime) -> dg.MaterializeResult:
    """The dead letters of every queue, counted by reason and by how long ago they died (those the broker
    gave up on are moved into the store first, as `mailq dead-letters list` does)."""
    runtime = mailq.runtime
    now = runtime.clock()
    groups: dict[tuple[str, str], dict] = {}
    for name in runtime.queues():
        for reason, died in runtime.queue(name, create=False).dead_letter_reasons():
            died_at = from_datetime(died)
            group = groups.setdefault(
                (name, reason),
                {"queue": name, "reason": reason, "letters": 0, "oldest": died_at}
                | {column: 0 for column, _, _ in AGES},
            )
            group["letters"] += 1
            group["oldest"] = min(group["oldest"], died_at)
            age = (now - died_at) / MICROS_PER_SECOND
            column = next(column for column, bound, _ in AGES if bound is None or age < bound)
            group[column] += 1
    rows = [{**g, "oldest": when(g["oldest"])} for _, g in sorted(groups.items())]
    total = sum(g["letters"] for g in groups.values())
    previous = context.instance.get_latest_materialization_event(context.asset_key)
    before = None
    if previous is not None and previous.asset_materialization is not None:
        recorded = previous.asset_materialization.metadata.get("dead_letters")
        before = None if recorded is None else recorded.value
    grew = before is not None and total > before
    return dg.MaterializeResult(
        metadata={
            "dead_letters": total,
            "queues_with_dead_letters": len({g["queue"] for g in groups.values()}),
            **table(
                "by_reason",
                [
                    ("queue", "string", "mail queue"),
                    ("reason", "string", "why the mail will not be delivered"),
                    ("letters", "int", "dead letters of the queue with this reason"),
                    *[(column, "int", text) for column, _, text in AGES],
                    ("oldest", DATETIME, "when the longest-kept of them died"),
                ],
                rows,
                "no dead letter in any queue",
            ),
        },
        check_results=[
            dg.AssetCheckResult(
                check_name=DEAD_LETTERS_CHECK,
                passed=not grew,
                severity=dg.AssetCheckSeverity.WARN,
                metadata={
                    "dead_letters": total,
                    "dead_letters_before": -1 if before is None else before,
                    "note": "dead letters grew since the previous materialization"
                    if grew
                    else "no earlier materialization to compare with"
                    if before is None
                    else "no more dead letters than at the previous materialization",
                },
            )
        ],
    )
