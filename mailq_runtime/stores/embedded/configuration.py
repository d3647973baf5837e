"""The event-sourced queue view configuration on the embedded store (`configuration_events`): an
aggregate's events in the order appended, each appended in a transaction that first counts them, so an
append lands only at the position its caller read."""

from __future__ import annotations

from .store import EmbeddedStore


class EmbeddedConfigurationEvents:
    def __init__(self, store: EmbeddedStore) -> None:
        self.store = store

    def events(self, aggregate: str) -> list[str]:
        rows = self.store.read(
            "SELECT event FROM configuration_events WHERE aggregate = ? ORDER BY seq", (aggregate,)
        )
        return [e for (e,) in rows]

    def append_event(self, aggregate: str, event: str, now: int, position: int) -> bool:
        """Append the event as the aggregate's event number `position` (the number of events the caller
        read), only if it holds exactly that many; False, and nothing written, if another was appended."""
        with self.store.transaction() as db:
            (held,) = db.execute(
                "SELECT COUNT(*) FROM configuration_events WHERE aggregate = ?", (aggregate,)
            ).fetchone()
            if held != position:
                return False
            db.execute(
                "INSERT INTO configuration_events (aggregate, event, at) VALUES (?, ?, ?)",
                (aggregate, event, now),
            )
            return True
