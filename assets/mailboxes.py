"""Record 23's counter recomputation as a Spark-materialised asset.

The projection (`message_id_table`) is checked against the source of truth (`imap_uid_table`) in one
distributed join: entries that disagree are healed from the source of truth (as James's message
inconsistency task does), then each mailbox's count and unseen are computed and the counters that differ
are reset. Resets are compare-and-set on the values read, so a counter that moved meanwhile is left for
the next run, which converges (record 23's consequence, without its lost updates).

A run can be limited to a user's mailboxes or to one of them (`CountersConfig`): it then reads those
mailboxes' rows only (the data source's `mailboxes` option) and repairs nothing else. Its repairs can be
paced (`max_repairs_per_second`), so that a big repair does not starve live traffic of the store.
"""

import time

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pydantic import Field
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from mailq_runtime.errors import InvalidInput, MailqError, UnknownMailbox
from mailq_runtime.mailboxes import Mailboxes
from mailq_runtime.pacing import RateLimit
from mailq_runtime.settings import Settings
from resources import MailqRuntime

from .metadata import table
from .spark.table_source import read_table

GROUP = "mailboxes"
SEEN = "\\Seen"


def _unseen(flags: str) -> F.Column:
    return F.when(F.array_contains(F.split(F.col(flags), " "), SEEN), 0).otherwise(1)


Scope = list[str] | None  # the mailbox ids a run is limited to; None: every mailbox


def projection_inconsistencies(spark: SparkSession, settings: Settings, scope: Scope = None) -> DataFrame:
    """(mailbox_id, message_id, kind) for every projection entry that disagrees with the source of truth."""
    projection = read_table(spark, settings, "message_id_table", mailboxes=scope).select(
        "mailbox_id", "message_id", F.col("uid").alias("p_uid"), F.col("flags").alias("p_flags")
    )
    truth = read_table(spark, settings, "imap_uid_table", mailboxes=scope).select(
        "mailbox_id", "message_id", F.col("uid").alias("t_uid"), F.col("flags").alias("t_flags")
    )
    joined = projection.join(truth, ["mailbox_id", "message_id"], "full_outer")
    kind = (
        F.when(F.col("t_uid").isNull(), "orphan_projection_entry")
        .when(F.col("p_uid").isNull(), "missing_projection_entry")
        .when(
            (F.col("p_uid") != F.col("t_uid")) | (F.col("p_flags") != F.col("t_flags")),
            "outdated_projection_entry",
        )
    )
    return joined.select("mailbox_id", "message_id", kind.alias("kind")).where(F.col("kind").isNotNull())


def counter_drift(spark: SparkSession, settings: Settings, scope: Scope = None) -> DataFrame:
    """(mailbox_id, user, name, count, unseen, observed_count, observed_unseen) where the counters differ
    from the source of truth."""
    # Only the columns used: the reader's cost grows with the bytes it hands over.
    truth = read_table(spark, settings, "imap_uid_table", columns=["mailbox_id", "flags"], mailboxes=scope)
    expected = truth.groupBy("mailbox_id").agg(
        F.count("*").alias("count"), F.sum(_unseen("flags")).alias("unseen")
    )
    # Summed by mailbox: Cassandra keeps one row a writer's share (tallies.py), the embedded store one.
    counters = (
        read_table(
            spark, settings, "mailbox_counters", columns=["mailbox_id", "count", "unseen"], mailboxes=scope
        )
        .groupBy("mailbox_id")
        .agg(F.sum("count").alias("observed_count"), F.sum("unseen").alias("observed_unseen"))
    )
    mailboxes = read_table(
        spark, settings, "mailboxes", columns=["mailbox_id", "user", "name"], mailboxes=scope
    )
    compared = (
        mailboxes.join(expected, "mailbox_id", "left")
        .fillna(0, ["count", "unseen"])
        .join(counters, "mailbox_id", "left")
    )
    return compared.where(
        F.col("observed_count").isNull()
        | (F.col("observed_count") != F.col("count"))
        | (F.col("observed_unseen") != F.col("unseen"))
    )


# Rows of the corrections table: every corrected mailbox up to this many, then a note of the rest.
CORRECTIONS_SHOWN = 200
# The figures come before the owner's address, which would push them off a laptop's screen.
CORRECTION_COLUMNS = [
    ("mailbox", "string", "the mailbox's name"),
    ("count_before", "int", "messages the counter held (-1: no counter row)"),
    ("count_after", "int", "messages the mailbox holds, counted from imap_uid_table"),
    ("unseen_before", "int", "unseen messages the counter held (-1: no counter row)"),
    ("unseen_after", "int", "messages without \\Seen, counted from imap_uid_table"),
    ("user", "string", "the mailbox's owner"),
]


class CountersConfig(dg.Config):
    user: str | None = Field(default=None, description="only this user's mailboxes (default: every mailbox)")
    mailbox: str | None = Field(
        default=None, description="only this mailbox of `user`, by its name, e.g. INBOX"
    )
    max_repairs_per_second: float | None = Field(
        default=None,
        description="at most this many repairs (projection entries healed, counters reset) a second "
        "(default: unlimited)",
    )


def resolve_scope(mailboxes: Mailboxes, user: str | None, mailbox: str | None) -> tuple[Scope, str]:
    """The mailbox ids of a run limited to `user` (and `mailbox`), None for every mailbox, and the scope
    in words; an unknown user or mailbox raises (a MailqError) before anything is read or repaired."""
    if user is None and mailbox is None:  # not listed: every mailbox is what the reads see anyway
        return None, "every mailbox"
    chosen = mailboxes.scope(user, mailbox)
    owner = chosen[0].user
    text = f"mailbox {chosen[0].name} of {owner}" if mailbox is not None else f"the mailboxes of {owner}"
    return sorted(m.id for m in chosen), text


@dg.asset(group_name=GROUP, kinds={"spark"})
def mailbox_counters(
    context: dg.AssetExecutionContext,
    config: CountersConfig,
    mailq: MailqRuntime,
    pyspark: LazyPySparkResource,
) -> dg.MaterializeResult:
    """Recomputed mailbox counters and the corrections applied (record 23): the projection entries healed
    from the source of truth (orphan, missing, outdated), then each mailbox whose count or unseen differed
    from a recount, reset, with its values before and after. Its config limits it to a user's mailboxes
    or one of them, and paces its repairs."""
    started = time.monotonic()
    mailboxes = mailq.runtime.mailboxes
    try:
        scope, scope_text = resolve_scope(mailboxes, config.user, config.mailbox)
        pace = RateLimit(config.max_repairs_per_second)
    except MailqError as error:
        raise dg.Failure(description=f"{error}: nothing read, nothing repaired") from None
    spark = pyspark.spark_session
    failed: set[str] = set()
    healed = {"orphan_projection_entry": 0, "missing_projection_entry": 0, "outdated_projection_entry": 0}
    for row in projection_inconsistencies(spark, mailq.settings, scope).toLocalIterator():
        try:
            pace.wait()
            mailboxes.heal_projection(row["mailbox_id"], row["message_id"])
            healed[row["kind"]] += 1
        except Exception as error:  # one mailbox's failure must not stop the others
            context.log.warning(f"could not heal {row['message_id']} in {row['mailbox_id']}: {error}")
            failed.add(row["mailbox_id"])
    corrected = []
    for row in counter_drift(spark, mailq.settings, scope).toLocalIterator():
        if row["mailbox_id"] in failed:
            continue
        try:
            observed = (
                None if row["observed_count"] is None else (row["observed_count"], row["observed_unseen"])
            )
            pace.wait()
            if mailboxes.reset_counters(row["mailbox_id"], row["count"], row["unseen"], observed=observed):
                corrected.append(row.asDict())
        except Exception as error:
            context.log.warning(f"could not reset the counters of {row['mailbox_id']}: {error}")
            failed.add(row["mailbox_id"])
    processed = read_table(
        spark, mailq.settings, "mailboxes", columns=["mailbox_id"], mailboxes=scope
    ).count()
    corrected.sort(key=lambda row: (row["user"], row["name"]))
    records = [
        {
            "user": row["user"],
            "mailbox": row["name"],
            "count_before": -1 if row["observed_count"] is None else row["observed_count"],
            "count_after": row["count"],
            "unseen_before": -1 if row["observed_unseen"] is None else row["observed_unseen"],
            "unseen_after": row["unseen"],
        }
        for row in corrected[:CORRECTIONS_SHOWN]
    ]
    more = len(corrected) - len(records)
    return dg.MaterializeResult(
        metadata={
            "scope": scope_text,
            # What the check reads back to check the same mailboxes.
            "scope_config": dg.MetadataValue.json({"user": config.user, "mailbox": config.mailbox}),
            "max_repairs_per_second": config.max_repairs_per_second or "unlimited",
            "repairs": pace.operations,
            "repair_seconds": round(pace.seconds(), 3),
            "processed_mailboxes": processed,
            "failed_mailboxes": dg.MetadataValue.json(sorted(failed)),
            "corrected_counters": len(corrected),
            "projection_inconsistencies": sum(healed.values()),
            **healed,
            **table(
                "corrections",
                CORRECTION_COLUMNS,
                records,
                "no counter differed from the source of truth: nothing corrected",
            ),
            **({"corrections_more": dg.MetadataValue.text(f"... and {more} more")} if more else {}),
            "seconds": round(time.monotonic() - started, 3),
        }
    )


@dg.asset_check(asset=mailbox_counters, blocking=True)
def counters_match_source_of_truth(
    context: dg.AssetCheckExecutionContext, mailq: MailqRuntime, pyspark: LazyPySparkResource
) -> dg.AssetCheckResult:
    """Every mailbox's count and unseen equal a recount of its messages in imap_uid_table: of the mailboxes
    the latest recompute covered (its scope), so that drift left outside a scoped run does not fail it."""
    event = context.instance.get_latest_materialization_event(mailbox_counters.key)
    materialization = None if event is None else event.asset_materialization
    entry = None if materialization is None else materialization.metadata.get("scope_config")
    chosen = entry.value if isinstance(entry, dg.JsonMetadataValue) else {}
    user, mailbox = chosen.get("user"), chosen.get("mailbox")
    try:
        scope, scope_text = resolve_scope(mailq.runtime.mailboxes, user, mailbox)
    except (UnknownMailbox, InvalidInput) as error:
        # The scope's mailboxes are gone since: none left to drift. A store that fails is no such case:
        # the check fails with its error.
        scope, scope_text = [], str(error)
    drift = counter_drift(pyspark.spark_session, mailq.settings, scope)
    sample = [r.asDict() for r in drift.limit(10).collect()]
    count = drift.count()
    return dg.AssetCheckResult(
        passed=count == 0,
        metadata={
            "scope": scope_text,
            "drifting_mailboxes": count,
            "sample": dg.MetadataValue.json(sample),
        },
    )
