"""A fault-injection seam for tests: make an operation die between two of its writes, as a crash would.

No path of the core assumes a transaction: every write commits on its own, in an order chosen so that a
crash between two of them leaves only what a later step heals. Each such gap is a named point
`<path>.after_<step>`; `faults.arm(point)` makes the next operation to reach it raise `InjectedFault`
there, after the writes before it and before the rest. POINTS lists every point, so a test can fail each
write of each path in turn. Production never arms it: a fresh injector is disarmed, and no URL option or
environment variable reaches it.

Record 23's two mailbox points are also groups: arming AFTER_SOURCE_OF_TRUTH (or AFTER_PROJECTION)
fires at that step of whichever mailbox operation reaches it first.
"""

from __future__ import annotations

import threading

from .errors import InvalidInput, shown

# Record 39's deduplicating blob store (blobs/dedup.py).
SAVE_AFTER_CONTENT = "blobs.save.after_content"  # content written; no blob row yet
SAVE_AFTER_BLOB_ROWS = "blobs.save.after_blob_rows"  # blob rows written; no reference yet
RELEASE_AFTER_DELETIONS = "blobs.release.after_deletions"  # deletions appended; references still there
COLLECT_AFTER_CONTENT = "blobs.collect.after_content"  # content deleted; rows still there
ROTATE_AFTER_REFERENCE_GENERATION = "generations.rotate.after_reference_generation"  # no GC iteration yet
BLOB_POINTS = (
    SAVE_AFTER_CONTENT,
    SAVE_AFTER_BLOB_ROWS,
    RELEASE_AFTER_DELETIONS,
    COLLECT_AFTER_CONTENT,
    ROTATE_AFTER_REFERENCE_GENERATION,
)

# Record 23's mailboxes (mailbox.py), each operation in its order: source of truth, projection, counters.
APPEND_AFTER_UID = "mailbox.append.after_uid"
APPEND_AFTER_CONTENT = "mailbox.append.after_content"
APPEND_AFTER_MESSAGE_ROW = "mailbox.append.after_message_row"
APPEND_AFTER_SOURCE_OF_TRUTH = "mailbox.append.after_source_of_truth"
APPEND_AFTER_PROJECTION = "mailbox.append.after_projection"
FLAG_AFTER_SOURCE_OF_TRUTH = "mailbox.flag.after_source_of_truth"
FLAG_AFTER_PROJECTION = "mailbox.flag.after_projection"
MOVE_AFTER_TARGET = "mailbox.move.after_target"  # in both mailboxes' source of truth, never in neither
MOVE_AFTER_SOURCE_OF_TRUTH = "mailbox.move.after_source_of_truth"
MOVE_AFTER_PROJECTION = "mailbox.move.after_projection"
EXPUNGE_AFTER_SOURCE_OF_TRUTH = "mailbox.expunge.after_source_of_truth"
EXPUNGE_AFTER_PROJECTION = "mailbox.expunge.after_projection"
EXPUNGE_AFTER_COUNTERS = "mailbox.expunge.after_counters"  # message in no mailbox; its row and content kept
EXPUNGE_AFTER_MESSAGE_ROW = "mailbox.expunge.after_message_row"  # row gone; references not released yet
ORPHAN_AFTER_MESSAGE_ROW = "mailbox.release_orphan.after_message_row"  # the orphan sweep's release, as above
MAILBOX_POINTS = (
    APPEND_AFTER_UID,
    APPEND_AFTER_CONTENT,
    APPEND_AFTER_MESSAGE_ROW,
    APPEND_AFTER_SOURCE_OF_TRUTH,
    APPEND_AFTER_PROJECTION,
    FLAG_AFTER_SOURCE_OF_TRUTH,
    FLAG_AFTER_PROJECTION,
    MOVE_AFTER_TARGET,
    MOVE_AFTER_SOURCE_OF_TRUTH,
    MOVE_AFTER_PROJECTION,
    EXPUNGE_AFTER_SOURCE_OF_TRUTH,
    EXPUNGE_AFTER_PROJECTION,
    EXPUNGE_AFTER_COUNTERS,
    EXPUNGE_AFTER_MESSAGE_ROW,
    ORPHAN_AFTER_MESSAGE_ROW,
)

POINTS = (*BLOB_POINTS, *MAILBOX_POINTS)

AFTER_SOURCE_OF_TRUTH = "after_source_of_truth"  # imap_uid_table written; message_id_table not yet
AFTER_PROJECTION = "after_projection"  # message_id_table written; mailbox_counters not yet
GROUPS = {
    AFTER_SOURCE_OF_TRUTH: frozenset(p for p in MAILBOX_POINTS if p.endswith("." + AFTER_SOURCE_OF_TRUTH)),
    AFTER_PROJECTION: frozenset(p for p in MAILBOX_POINTS if p.endswith("." + AFTER_PROJECTION)),
}


class InjectedFault(RuntimeError):
    """The simulated crash. Deliberately not a MailqError: unlike those, it leaves work half done."""


class FaultInjector:
    """One-shot faults: an armed point (or group) fires once, for the first operation reaching it, then
    disarms."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: str | None = None
        self._points: frozenset[str] = frozenset()

    @property
    def armed(self) -> str | None:
        return self._armed

    def arm(self, point: str) -> None:
        if point not in POINTS and point not in GROUPS:
            known = ", ".join((*GROUPS, *POINTS))
            raise InvalidInput(f"unknown fault point {shown(point)}: known points are {known}")
        with self._lock:
            self._armed = point
            self._points = GROUPS.get(point, frozenset((point,)))

    def disarm(self) -> None:
        with self._lock:
            self._armed = None
            self._points = frozenset()

    def reached(self, point: str) -> None:
        """Called by the code at `point`; raises InjectedFault if the point is armed."""
        if self._armed is None:  # the production path: no lock taken
            return
        with self._lock:
            if point not in self._points:
                return
            self._armed = None
            self._points = frozenset()
        raise InjectedFault(f"fault injected at {point}")
