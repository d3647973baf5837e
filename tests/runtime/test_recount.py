"""Exact counts through crashes: the counts a done() without a transaction can leave wrong (a mail
settled twice; a crash between its deletion mark and its count, in test_queue_crash_order.py) are
corrected by the queue itself once they settled, and no count is ever shown below zero."""

from __future__ import annotations

import time

from mailq_runtime.queue import MailQueue

from .conftest import QUEUE
from .helpers import make_mail


def _no_fault() -> None:
    """Nothing between the second settlement's mark and its count."""


def test_a_mail_settled_twice_never_shows_a_negative_size(clocked: MailQueue, settling: float):
    clocked.enqueue(make_mail("a"))
    clocked.enqueue(make_mail("b"))
    item = clocked.dequeue(timeout=0)
    assert item is not None
    row = item._row
    item.done()
    # A consumer whose lease had expired settles the same mail as well (Cassandra counts it again).
    clocked.backends.view.mark_done(QUEUE, row.enqueue_id, row.slice_start, row.bucket, _no_fault)
    time.sleep(settling)
    clocked.overviews.recount()
    assert clocked.size() == 1 and clocked.overviews.overview().size == 1
    other = clocked.dequeue(timeout=0)
    assert other is not None
    other.done()
    row = other._row
    clocked.backends.view.mark_done(QUEUE, row.enqueue_id, row.slice_start, row.bucket, _no_fault)
    # Counted below zero (Cassandra) until the recount folds it: size() shows the queue empty meanwhile.
    assert clocked.size() == 0 and clocked.overviews.overview().size == 0
    time.sleep(settling)
    clocked.overviews.recount()
    assert clocked.backends.view.size(QUEUE, clocked.maintenance.browse_start()) == 0 and clocked.size() == 0
    assert clocked.overviews.recount() == 0
