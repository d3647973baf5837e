"""Destination counters and notes on Cassandra (the `Destinations` protocol of stores/protocols.py): one
partition a queue in each table, so the per-domain view is two partition reads. The counters are
Cassandra counters, changed concurrently (a counter cannot share an unlogged batch); a counter at 0
cannot be dropped without losing a concurrent change, so its row stays and reads as 0."""

from __future__ import annotations

from collections.abc import Sequence

from ..records import DestinationCount, DestinationNote, DomainBounce, Suspension
from .store import CassandraStore

# One change of a count; the queue view sends it in the counter batch of a delivered mail's count too.
COUNT = (
    "UPDATE destination_counters SET mails = mails + ? "
    "WHERE queue = ? AND domain = ? AND state = ? AND slot = ?"
)


def count_parameters(queue: str, change: DestinationCount) -> tuple:
    return (change.mails, queue, change.domain, change.state, change.slot)


class CassandraDestinations:
    def __init__(self, store: CassandraStore) -> None:
        self.store = store

    def count(self, queue: str, changes: Sequence[DestinationCount]) -> None:
        self.store.execute_all(COUNT, [count_parameters(queue, change) for change in changes])

    def counts(self, queue: str) -> list[DestinationCount]:
        rows = self.store.execute(
            "SELECT domain, state, slot, mails FROM destination_counters WHERE queue = ?", (queue,)
        )
        return [DestinationCount(*row) for row in rows if row.mails]

    def note(self, queue: str, note: DestinationNote) -> None:
        self.store.execute(
            "INSERT INTO destination_notes (queue, domain, error, noted_at, next_attempt) "
            "VALUES (?, ?, ?, ?, ?)",
            (queue, *note),
        )

    def notes(self, queue: str) -> list[DestinationNote]:
        rows = self.store.execute(
            "SELECT domain, error, noted_at, next_attempt FROM destination_notes WHERE queue = ?", (queue,)
        )
        return [DestinationNote(*row) for row in rows]

    def suspend(self, queue: str, suspension: Suspension) -> None:
        self.store.execute(
            "INSERT INTO destination_suspensions (queue, domain, until) VALUES (?, ?, ?)",
            (queue, *suspension),
        )

    def resume(self, queue: str, domain: str) -> None:
        self.store.execute(
            "DELETE FROM destination_suspensions WHERE queue = ? AND domain = ?", (queue, domain)
        )

    def suspensions(self, queue: str) -> list[Suspension]:
        rows = self.store.execute(
            "SELECT domain, until FROM destination_suspensions WHERE queue = ?", (queue,)
        )
        return [Suspension(*row) for row in rows]

    def bounce(self, queue: str, bounce: DomainBounce) -> None:
        self.store.execute(
            "INSERT INTO destination_bounces (queue, domain, reason, until) VALUES (?, ?, ?, ?)",
            (queue, *bounce),
        )

    def bounces(self, queue: str) -> list[DomainBounce]:
        rows = self.store.execute(
            "SELECT domain, reason, until FROM destination_bounces WHERE queue = ?", (queue,)
        )
        return [DomainBounce(*row) for row in rows]
