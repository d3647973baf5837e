"""A fault-injection seam for tests: make an operation die between two of its writes, as a crash would.

No path of the core assumes a transaction: every write commits on its own, in an order chosen so that a
crash between two of them leaves only what a later step heals. Each such gap is a named point
`<path>.after_<step>`; `faults.arm(point)` makes the next operation to reach it raise `InjectedFault`
there, after the writes before it and before the rest. POINTS lists every point, so a test can fail each
write of each path in turn. Production never arms it: a fresh injector is disarmed, and no URL option or
environment variable reaches it.

Record 23's two mailbox points are also groups: arming AFTER_SOURCE_OF_TRUTH (or AFTER_PROJECTION)
fires at that step of whichever mailbox operation reaches it first. One injector serves a runtime
(`Runtime.faults`).
"""

from __future__ import annotations

import threading

from .errors import InvalidInput, shown

# The mail queue's write paths (queue/).
ENQUEUE_AFTER_REFERENCES = "enqueue.after_references"  # content and references saved; no view row yet
ENQUEUE_AFTER_VIEW_ROW = "enqueue.after_view_row"  # view row written; not published nor delayed yet
DONE_AFTER_DELETION_MARK = "done.after_deletion_mark"  # marked deleted; not counted as deleted yet
DONE_AFTER_MARK = "done.after_mark"  # marked deleted; references kept, broker message not acked
DONE_AFTER_RELEASE = "done.after_release"  # references released; broker message not acked
RETRY_AFTER_DELAYED_ROW = "retry.after_delayed_row"  # delayed row written; broker message not acked
RETRY_AFTER_ACK = "retry.after_ack"  # acked; the view row's next delivery not updated
REJECT_AFTER_DEAD_LETTER = "reject.after_dead_letter"  # dead letter written; not marked deleted
REJECT_AFTER_MARK = "reject.after_mark"  # marked deleted; broker message not acked
REMOVE_AFTER_MARK = "remove.after_mark"  # marked deleted; references kept (remove and clear)
REMOVE_AFTER_RELEASE = "remove.after_release"  # references released; delayed row kept
PUBLISH_DUE_AFTER_PUBLISH = "publish_due.after_publish"  # published; delayed row kept (flush too)
FLUSH_AFTER_DELAYED_ROWS = "flush.after_delayed_rows"  # every delayed mail published; view not rescheduled
CLEAN_AFTER_BROWSE_START = "clean.after_browse_start"  # browse_start advanced; nothing cleaned
CLEAN_AFTER_RELEASE = "clean.after_release"  # the slices' references released; rows kept
CLEAN_AFTER_DELETE = "clean.after_delete"  # the slices' rows deleted; content_start not moved
REQUEUE_AFTER_ENQUEUE = "requeue.after_enqueue"  # a dead letter enqueued anew; letter kept
REQUEUE_AFTER_REMOVE = "requeue.after_remove"  # letter removed; the old enqueue id's references kept
PURGE_AFTER_REMOVE = "purge.after_remove"  # letter removed; its references kept
PARK_AFTER_PAYLOAD = "park.after_payload"  # a held mail's payload parked; broker message not acked
RELEASE_AFTER_DELAYED_ROW = "release.after_delayed_row"  # parked payload due now; held row kept
QUEUE_POINTS = (
    ENQUEUE_AFTER_REFERENCES,
    ENQUEUE_AFTER_VIEW_ROW,
    DONE_AFTER_DELETION_MARK,
    DONE_AFTER_MARK,
    DONE_AFTER_RELEASE,
    RETRY_AFTER_DELAYED_ROW,
    RETRY_AFTER_ACK,
    REJECT_AFTER_DEAD_LETTER,
    REJECT_AFTER_MARK,
    REMOVE_AFTER_MARK,
    REMOVE_AFTER_RELEASE,
    PUBLISH_DUE_AFTER_PUBLISH,
    FLUSH_AFTER_DELAYED_ROWS,
    CLEAN_AFTER_BROWSE_START,
    CLEAN_AFTER_RELEASE,
    CLEAN_AFTER_DELETE,
    REQUEUE_AFTER_ENQUEUE,
    REQUEUE_AFTER_REMOVE,
    PURGE_AFTER_REMOVE,
    PARK_AFTER_PAYLOAD,
    RELEASE_AFTER_DELAYED_ROW,
)

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

# Record 23's mailboxes (mailboxes.py), each operation in its order: source of truth, projection, counters.
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

POINTS = (*QUEUE_POINTS, *BLOB_POINTS, *MAILBOX_POINTS)

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
