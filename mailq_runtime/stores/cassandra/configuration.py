"""The event-sourced queue view configuration on Cassandra (`configuration_events`), as James's event store:
an aggregate's events by position, each appended with a lightweight transaction.

`append_event(aggregate, event, now, position)` writes the event at `position`, the number of events the
caller read before checking its change against the last of them, only if no event holds that position
yet (INSERT ... IF NOT EXISTS). Of two processes that checked a change against the same history, one
appends and the other gets False: it reads the history again and checks its change against the
winner's event, so two changes that each pass the rules alone can never both be appended.
"""

from __future__ import annotations

from .store import CassandraStore


class CassandraConfigurationEvents:
    def __init__(self, store: CassandraStore) -> None:
        self.store = store

    def events(self, aggregate: str) -> list[str]:
        rows = self.store.execute("SELECT event FROM configuration_events WHERE aggregate = ?", (aggregate,))
        return [row.event for row in rows]

    def append_event(self, aggregate: str, event: str, now: int, position: int) -> bool:
        return self.store.applied(
            "INSERT INTO configuration_events (aggregate, position, event, at) VALUES (?, ?, ?, ?) "
            "IF NOT EXISTS",
            (aggregate, position, event, now),
        ).applied
