"""A fault-injection seam for tests: make an operation die between two of its writes, as a crash would.

No write path assumes a transaction across its writes, so a process dying between two of them leaves a
state that a later step heals (republish, record 32's content clean-up, the orphan sweep, the counter
recomputation). Tests reproduce that death on purpose: `faults.arm(point)` makes the next operation to
pass `point` raise `InjectedFault` there. A point is named `<path>.after_<step>`: the step's write is
done, the next one is not. Production never arms it: a fresh injector is disarmed, and no URL option or
environment variable reaches it. One injector serves a runtime (`Runtime.faults`).
"""

from __future__ import annotations

import threading

from .errors import InvalidInput, shown

# The mail queue's write paths (queue.py).
ENQUEUE_AFTER_REFERENCES = "enqueue.after_references"  # content and references saved; no view row yet
ENQUEUE_AFTER_VIEW_ROW = "enqueue.after_view_row"  # view row written; not published nor delayed yet
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
QUEUE_POINTS = (
    ENQUEUE_AFTER_REFERENCES,
    ENQUEUE_AFTER_VIEW_ROW,
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
)

# Record 23's mailbox writes (mailbox.py).
AFTER_SOURCE_OF_TRUTH = "after_source_of_truth"  # imap_uid_table committed; message_id_table not yet
AFTER_PROJECTION = "after_projection"  # message_id_table committed; mailbox_counters not yet
MAILBOX_POINTS = (AFTER_SOURCE_OF_TRUTH, AFTER_PROJECTION)

POINTS = QUEUE_POINTS + MAILBOX_POINTS


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
