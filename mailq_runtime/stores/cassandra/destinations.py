"""Destination counters and notes on Cassandra (the `Destinations` protocol of stores/protocols.py): one
partition a queue in each table, so the per-domain view is two partition reads. The counts are tallies
(tallies.py), each writer's share of a (domain, state, slot) written whole, summed at read; a share at 0
cannot be dropped without losing a concurrent change, so its row stays and reads as 0.

Remote delivery's slots and send windows are lightweight transactions: two workers must never both take
a slot, nor both count the last mail of a window."""

from __future__ import annotations

from collections.abc import Sequence

from ..records import DestinationCount, DestinationNote, DomainBounce, Suspension
from .store import CassandraStore
from .tallies import Change


def destination_changes(
    store: CassandraStore, queue: str, changes: Sequence[DestinationCount]
) -> list[Change]:
    """The changes of this writer's shares; the queue view writes them with a delivered mail's count."""
    tally = store.tallies.tally("destination_counters", ("queue", "domain", "state", "slot"), ("mails",))
    return [Change(tally, (queue, c.domain, c.state, c.slot), (c.mails,)) for c in changes]


class CassandraDestinations:
    def __init__(self, store: CassandraStore) -> None:
        self.store = store

    def count(self, queue: str, changes: Sequence[DestinationCount]) -> None:
        """Add the changes; a failure takes them back, so a caller told they failed counts them again
        or not at all (the enqueuer's failed enqueues)."""
        counted = destination_changes(self.store, queue, changes)
        if not counted:
            return
        try:
            self.store.tallies.add(counted)
        except BaseException:
            self.store.tallies.take_back(counted)
            raise

    def counts(self, queue: str) -> list[DestinationCount]:
        rows = self.store.execute(
            "SELECT domain, state, slot, mails FROM destination_counters WHERE queue = ?", (queue,)
        )
        summed: dict[tuple[str, str, int], int] = {}
        for row in rows:
            key = (row.domain, row.state, row.slot)
            summed[key] = summed.get(key, 0) + (row.mails or 0)
        return [DestinationCount(*key, mails) for key, mails in summed.items() if mails]

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

    def take_slot(self, destination: str, slots: int, holder: str, now: int, lease: int) -> int | None:
        """The slots held are read plainly, and each free one tried with a lightweight transaction, which
        alone decides: a stale read costs a failed try, never a slot held twice."""
        held = {
            row.slot
            for row in self.store.execute(
                "SELECT slot FROM destination_slots WHERE destination = ?", (destination,)
            )
        }
        for slot in range(slots):
            if slot in held:
                continue
            taken = self.store.applied(
                "INSERT INTO destination_slots (destination, slot, holder) VALUES (?, ?, ?) "
                "IF NOT EXISTS USING TTL ?",
                (destination, slot, holder, _seconds(lease)),
            )
            # A try the driver ran again after a timeout finds the row its first run wrote.
            if taken.applied or getattr(taken, "holder", None) == holder:
                return slot
        return None

    def renew_slot(self, destination: str, slot: int, holder: str, now: int, lease: int) -> bool:
        return self.store.applied(
            "UPDATE destination_slots USING TTL ? SET holder = ? WHERE destination = ? AND slot = ? "
            "IF holder = ?",
            (_seconds(lease), holder, destination, slot, holder),
        ).applied

    def free_slot(self, destination: str, slot: int, holder: str) -> None:
        self.store.applied(
            "DELETE FROM destination_slots WHERE destination = ? AND slot = ? IF holder = ?",
            (destination, slot, holder),
        )

    def take_send(self, destination: str, window: int, length: int, mails: int) -> bool:
        """A compare-and-set on the window's count: each one lost to another sender returns the count it
        lost to, so it ends within `mails` tries. A row lives one window past its own (its TTL)."""
        row = self.store.execute(
            "SELECT mails FROM destination_sends WHERE destination = ? AND window_start = ?",
            (destination, window),
        ).one()
        count = None if row is None else row.mails
        for _ in range(mails + 1):
            if count is not None and count >= mails:
                return False
            if count is None:
                result = self.store.applied(
                    "INSERT INTO destination_sends (destination, window_start, mails) VALUES (?, ?, 1) "
                    "IF NOT EXISTS USING TTL ?",
                    (destination, window, _seconds(2 * length)),
                )
            else:
                result = self.store.applied(
                    "UPDATE destination_sends USING TTL ? SET mails = ? "
                    "WHERE destination = ? AND window_start = ? IF mails = ?",
                    (_seconds(2 * length), count + 1, destination, window, count),
                )
            if result.applied:
                return True
            count = getattr(result, "mails", None)  # none: the row expired meanwhile
        return False


def _seconds(micros: int) -> int:
    """A TTL: whole seconds, at least one, never shorter than `micros`."""
    return max(1, -(-micros // 1_000_000))
