"""Destination counters and notes on the embedded store (the `Destinations` protocol of
stores/protocols.py); a count that reaches 0 is dropped in the transaction that changed it, so the table
holds only slots with mails."""

from __future__ import annotations

from collections.abc import Sequence

from ..records import DestinationCount, DestinationNote, DomainBounce, Suspension
from .store import EmbeddedStore


class EmbeddedDestinations:
    def __init__(self, store: EmbeddedStore) -> None:
        self.store = store

    def count(self, queue: str, changes: Sequence[DestinationCount]) -> None:
        with self.store.transaction() as db:
            for change in changes:
                key = (queue, change.domain, change.state, change.slot)
                (mails,) = db.execute(
                    "INSERT INTO destination_counters (queue, domain, state, slot, mails) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (queue, domain, state, slot) "
                    "DO UPDATE SET mails = mails + excluded.mails RETURNING mails",
                    (*key, change.mails),
                ).fetchone()
                # Only a count this change left at 0 is dropped: a row it left at any other count is one
                # the DELETE's `mails = 0` cannot match, so it is not made (most changes: a slot holds
                # every mail enqueued in its five minutes). A later change of the same key in this call
                # starts from 0 either way, the dropped row's count.
                if mails == 0:
                    db.execute(
                        "DELETE FROM destination_counters "
                        "WHERE queue = ? AND domain = ? AND state = ? AND slot = ? AND mails = 0",
                        key,
                    )

    def counts(self, queue: str) -> list[DestinationCount]:
        rows = self.store.read(
            "SELECT domain, state, slot, mails FROM destination_counters WHERE queue = ? "
            "ORDER BY domain, state, slot",
            (queue,),
        )
        return [DestinationCount(*row) for row in rows]

    def note(self, queue: str, note: DestinationNote) -> None:
        with self.store.transaction() as db:
            db.execute("INSERT OR REPLACE INTO destination_notes VALUES (?, ?, ?, ?, ?)", (queue, *note))

    def notes(self, queue: str) -> list[DestinationNote]:
        rows = self.store.read(
            "SELECT domain, error, noted_at, next_attempt FROM destination_notes WHERE queue = ?", (queue,)
        )
        return [DestinationNote(*row) for row in rows]

    def suspend(self, queue: str, suspension: Suspension) -> None:
        with self.store.transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO destination_suspensions VALUES (?, ?, ?)", (queue, *suspension)
            )

    def resume(self, queue: str, domain: str) -> None:
        with self.store.transaction() as db:
            db.execute("DELETE FROM destination_suspensions WHERE queue = ? AND domain = ?", (queue, domain))

    def suspensions(self, queue: str) -> list[Suspension]:
        rows = self.store.read("SELECT domain, until FROM destination_suspensions WHERE queue = ?", (queue,))
        return [Suspension(*row) for row in rows]

    def bounce(self, queue: str, bounce: DomainBounce) -> None:
        with self.store.transaction() as db:
            db.execute("INSERT OR REPLACE INTO destination_bounces VALUES (?, ?, ?, ?)", (queue, *bounce))

    def bounces(self, queue: str) -> list[DomainBounce]:
        rows = self.store.read(
            "SELECT domain, reason, until FROM destination_bounces WHERE queue = ?", (queue,)
        )
        return [DomainBounce(*row) for row in rows]

    def take_slot(self, destination: str, slots: int, holder: str, now: int, lease: int) -> int | None:
        # BEGIN IMMEDIATE: the read of the slots held and the write of the one taken are one writer's.
        with self.store.transaction() as db:
            held = {
                row[0]
                for row in db.execute(
                    "SELECT slot FROM destination_slots WHERE destination = ? AND expires > ?",
                    (destination, now),
                )
            }
            free = next((slot for slot in range(slots) if slot not in held), None)
            if free is not None:
                db.execute(
                    "INSERT OR REPLACE INTO destination_slots VALUES (?, ?, ?, ?)",
                    (destination, free, holder, now + lease),
                )
            return free

    def renew_slot(self, destination: str, slot: int, holder: str, now: int, lease: int) -> bool:
        # A renewal come late still holds the slot if no one took it meanwhile: the row names its holder.
        with self.store.transaction() as db:
            return bool(
                db.execute(
                    "UPDATE destination_slots SET expires = ? "
                    "WHERE destination = ? AND slot = ? AND holder = ?",
                    (now + lease, destination, slot, holder),
                ).rowcount
            )

    def free_slot(self, destination: str, slot: int, holder: str) -> None:
        with self.store.transaction() as db:
            db.execute(
                "DELETE FROM destination_slots WHERE destination = ? AND slot = ? AND holder = ?",
                (destination, slot, holder),
            )

    def take_send(self, destination: str, window: int, length: int, mails: int) -> bool:
        with self.store.transaction() as db:
            db.execute(
                "DELETE FROM destination_sends WHERE destination = ? AND window_start < ?",
                (destination, window),
            )
            return bool(
                db.execute(
                    "INSERT INTO destination_sends VALUES (?, ?, 1) "
                    "ON CONFLICT (destination, window_start) DO UPDATE SET mails = mails + 1 "
                    "WHERE mails < ?",
                    (destination, window, mails),
                ).rowcount
            )
