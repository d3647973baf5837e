"""What the mail queues hold, at a glance: each queue's mails by state, the mails per destination domain
as qshape shows them, and the dead letters by reason and age, with a check that warns when the dead
letters grow."""

from datetime import datetime

import dagster as dg

from mailq_runtime.clock import MICROS_PER_SECOND, from_datetime
from mailq_runtime.queue import BUCKET_NAMES, STATES, DomainShape
from resources import MailqRuntime

from .metadata import DATETIME, table, when

GROUP = "mail_queue"
TOP_DOMAINS = 20  # the by-domain table's rows: the domains with the most mails waiting
PLOTTED_DOMAINS = 5  # the domains whose figures are numbers of their own, plotted over time
# qshape's age buckets as the by-domain table's columns: (column, bucket).
BUCKET_AGES = tuple(("min_" + name.replace("-", "_").replace("+", "_plus"), name) for name in BUCKET_NAMES)
BUCKET_COLUMNS = tuple(column for column, _ in BUCKET_AGES)
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
    overviews = [runtime.queue(name, create=False).overviews.overview() for name in runtime.queues()]
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


def _domain_rows(queue: str, shape: DomainShape, now: int) -> list[dict]:
    """The table's rows of one destination domain: one per state that holds mails (a domain with none, one
    row of state `none`), as `mailq queues --by-domain`. The domain's own figures (its oldest mail, its
    suspension, remote delivery's note) are on its first row only: the others have none of their own."""
    states = [state for state in STATES if shape.total(state)] or ["none"]
    domain_figures = {
        "oldest_minutes": None if shape.oldest is None else _oldest_minutes(shape, now),
        "suspended_until": _shown(shape.suspended_until),
        "next_attempt": _shown(shape.next_attempt),
        "last_error": shape.last_error or "",
        "last_error_at": _shown(shape.last_error_at),
    }
    return [
        {
            "queue": queue,
            "domain": shape.domain,
            "state": state,
            "mails": shape.total(state),
            **dict(zip(BUCKET_COLUMNS, shape.buckets.get(state, (0,) * len(BUCKET_NAMES)), strict=True)),
            **(domain_figures if index == 0 else dict.fromkeys(domain_figures)),
        }
        for index, state in enumerate(states)
    ]


def _oldest_minutes(shape: DomainShape, now: int) -> int:
    """The age of the domain's oldest mail waiting, from the start of its 5-minute slot; -1 if none."""
    return -1 if shape.oldest is None else (now - from_datetime(shape.oldest)) // (60 * MICROS_PER_SECOND)


def _waiting(shape: DomainShape) -> int:
    return sum(shape.total(state) for state in STATES)


def _retrying(shape: DomainShape, now: int) -> bool:
    """Whether remote delivery failed at the domain and tries it again later (a note stays once due)."""
    return shape.next_attempt is not None and from_datetime(shape.next_attempt) > now


def _plotted(shapes: list[tuple[str, DomainShape]], now: int) -> dict[str, int]:
    """The figures of the PLOTTED_DOMAINS domains with the most mails waiting (`shapes` sorted so), summed
    over the queues: a number each, which the UI plots across materialisations."""
    figures: dict[str, int] = {}
    for _, shape in shapes:
        if f"{shape.domain} waiting" not in figures and len(figures) == 3 * PLOTTED_DOMAINS:
            break
        for figure, value in (("waiting", _waiting(shape)), ("deferred", shape.total("deferred"))):
            key = f"{shape.domain} {figure}"
            figures[key] = figures.get(key, 0) + value
        key = f"{shape.domain} oldest_minutes"
        figures[key] = max(figures.get(key, -1), _oldest_minutes(shape, now))
    return figures


@dg.asset(group_name=GROUP, kinds={"python"})
def mail_queue_domains(mailq: MailqRuntime) -> dg.MaterializeResult:
    """Per queue and destination domain, as qshape and `mailq queues --by-domain` show it: the mails by
    state (queued, deferred, held) in doubling age buckets, the oldest, remote delivery's last error there and
    its next attempt, read from the counters kept as mail moves (never a browse of the queue). Totals
    and the top domains' figures as numbers, to plot across materialisations; the top domains' rows as
    a table. Its counts are of mails per recipient domain: a mail to two domains counts in each, so
    `waiting_by_domain` may exceed mail_queue_overview's `live_mails`."""
    runtime = mailq.runtime
    now = runtime.clock()
    shapes = [
        (name, shape)
        for name in runtime.queues()
        for shape in runtime.queue(name, create=False).overviews.by_domain()
    ]
    shapes.sort(key=lambda each: (-_waiting(each[1]), each[0], each[1].domain))
    return dg.MaterializeResult(
        metadata={
            "domains": len({shape.domain for _, shape in shapes}),
            # A mail counts once per domain it has a recipient in, as in qshape: the names say so.
            "waiting_by_domain": sum(_waiting(shape) for _, shape in shapes),
            "deferred_by_domain": sum(shape.total("deferred") for _, shape in shapes),
            "held_by_domain": sum(shape.total("held") for _, shape in shapes),
            "domains_retrying": sum(1 for _, shape in shapes if _retrying(shape, now)),
            "domains_suspended": sum(1 for _, shape in shapes if shape.suspended_until is not None),
            "oldest_minutes": max((_oldest_minutes(shape, now) for _, shape in shapes), default=-1),
            **_plotted(shapes, now),
            **table(
                "by_domain",
                [
                    ("queue", "string", "mail queue"),
                    ("domain", "string", "destination domain, in lower case"),
                    (
                        "state",
                        "string",
                        "queued: never tried or due; deferred: waiting for a retry or delay; held: by an "
                        "operator until released; none: no mail (a row for the domain's figures)",
                    ),
                    (
                        "mails",
                        "int",
                        "mails with a recipient in the domain, in this state (a mail to two "
                        "domains counts in each)",
                    ),
                    *[
                        (column, "int", f"of them, enqueued {name} minutes ago")
                        for column, name in BUCKET_AGES
                    ],
                    (
                        "oldest_minutes",
                        "int",
                        "age of the domain's oldest mail waiting, in any state, to the 5 minutes (on its "
                        "first row)",
                    ),
                    ("suspended_until", DATETIME, "while an operator suspends the domain"),
                    ("next_attempt", DATETIME, "when remote delivery tries the domain again"),
                    ("last_error", "string", "remote delivery's last failure at the domain"),
                    ("last_error_at", DATETIME, "when it failed"),
                ],
                [row for queue, shape in shapes[:TOP_DOMAINS] for row in _domain_rows(queue, shape, now)],
                "no mail waiting for any domain",
            ),
        }
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
        for reason, died in runtime.queue(name, create=False).dead_letters.reasons():
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
