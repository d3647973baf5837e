"""A fault-injection seam for tests: make an operation die between two of its commits, as a crash would.

The mailboxes write the three tables of record 23 as separate commits, so a process dying between them
leaves the inconsistencies that the counter recomputation repairs. Tests reproduce that death on purpose:
`faults.arm(AFTER_SOURCE_OF_TRUTH)` makes the next operation to pass that point raise `InjectedFault`
after its source-of-truth commit and before the rest. Production never arms it: a fresh injector is
disarmed, and no URL option or environment variable reaches it.
"""

from __future__ import annotations

import threading

from .errors import InvalidInput, shown

AFTER_SOURCE_OF_TRUTH = "after_source_of_truth"  # imap_uid_table committed; message_id_table not yet
AFTER_PROJECTION = "after_projection"  # message_id_table committed; mailbox_counters not yet
POINTS = (AFTER_SOURCE_OF_TRUTH, AFTER_PROJECTION)


class InjectedFault(RuntimeError):
    """The simulated crash. Deliberately not a MailqError: unlike those, it leaves work half done."""


class FaultInjector:
    """One-shot faults: an armed point fires once, for the first operation reaching it, then disarms."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: str | None = None

    @property
    def armed(self) -> str | None:
        return self._armed

    def arm(self, point: str) -> None:
        if point not in POINTS:
            raise InvalidInput(f"unknown fault point {shown(point)}: known points are {', '.join(POINTS)}")
        with self._lock:
            self._armed = point

    def disarm(self) -> None:
        with self._lock:
            self._armed = None

    def reached(self, point: str) -> None:
        """Called by the code at `point`; raises InjectedFault if the point is armed."""
        if self._armed is None:  # the production path: no lock taken
            return
        with self._lock:
            if self._armed != point:
                return
            self._armed = None
        raise InjectedFault(f"fault injected at {point}")
