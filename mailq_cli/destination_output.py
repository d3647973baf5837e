"""`mailq queues --by-domain`: each queue's destination domains as qshape shows them, from the counters
kept as mail moves (mailq_runtime/queue/destinations.py)."""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import Any

from mailq_runtime.clock import to_datetime
from mailq_runtime.errors import NoStore
from mailq_runtime.queue import BUCKET_NAMES, STATES, DomainShape
from mailq_runtime.runtime import Runtime

from .output import Report, span, table, time_text


def _entry(queue: str, shape: DomainShape) -> dict[str, Any]:
    return {
        "queue": queue,
        "domain": shape.domain,
        "states": {
            state: dict(zip(BUCKET_NAMES, shape.buckets.get(state, (0,) * len(BUCKET_NAMES)), strict=True))
            for state in STATES
        },
        "last_error": shape.last_error,
        "last_error_at": None if shape.last_error_at is None else time_text(shape.last_error_at),
        "next_attempt": None if shape.next_attempt is None else time_text(shape.next_attempt),
        "suspended_until": None if shape.suspended_until is None else time_text(shape.suspended_until),
    }


def _rows(queue: str, shape: DomainShape, now: datetime) -> list[tuple[str, ...]]:
    due = "-" if shape.next_attempt is None else _when(shape.next_attempt, now)
    error = shape.last_error or "-"
    suspended = "-" if shape.suspended_until is None else time_text(shape.suspended_until)
    rows = []
    for state in STATES:
        counts = shape.buckets.get(state, (0,) * len(BUCKET_NAMES))
        rows.append((queue, shape.domain, state, str(sum(counts)), *map(str, counts), suspended, due, error))
        error, due, suspended = "", "", ""  # once a domain
    return rows


def _when(moment: datetime, now: datetime) -> str:
    return f"in {span(moment - now)}" if moment > now else "due"


def by_domain_report(args: argparse.Namespace) -> Report:
    try:
        runtime = Runtime.open(args.url)
    except NoStore:
        return Report([], ["no queues"])
    with runtime:
        now = to_datetime(runtime.clock())
        shapes = [
            (name, shape)
            for name in runtime.queues()
            for shape in runtime.queue(name, create=False).overviews.by_domain()
        ]
    if not shapes:
        return Report([], ["no mails for any domain"])
    rows = [row for queue, shape in shapes for row in _rows(queue, shape, now)]
    headers = (
        "QUEUE",
        "DOMAIN",
        "STATE",
        "TOTAL",
        *BUCKET_NAMES,
        "SUSPENDED UNTIL",
        "NEXT ATTEMPT",
        "LAST ERROR",
    )
    lines = table(headers, rows)
    lines.append("(mails per destination domain by age in minutes since enqueue, as qshape)")
    return Report([_entry(queue, shape) for queue, shape in shapes], lines)
