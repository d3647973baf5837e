"""The orphan sweep heals what writes that died half-way leave, when nobody runs them again.

Every leftover the crash-order tests name (tests/runtime/test_blob_crash_order.py and
test_mailbox_crash_order.py) is made here by a real fault, with every write committing alone: references
of an enqueue id whose mail never reached the queue, of messages whose append or expunge died, content
without its blob row, a blob row without a reference. Once their generation is eligible, one sweep
releases the references (for the next GC iteration to collect) and deletes the rest; live mails and
messages, owners younger than the grace period and the generations still protected keep everything.
"""

from __future__ import annotations

import hashlib

import dagster as dg
import pytest

from assets import blobs, orphan_sweep
from mailq_runtime import EnqueueId, InjectedFault, Mail, MessageId, Runtime, faults
from mailq_runtime.clock import system_clock
from mailq_runtime.model import BlobId
from tests.runtime.backends import Backend

from .pipeline import materialized, run_gc

START = 1_700_002_800_000_000  # 2023-11-14, microseconds: years before the sweep's clock


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> int:
        self.now += 1_000_000
        return self.now


def message(n: int) -> bytes:
    return f"Subject: message {n}\r\n\r\nbody {n}\r\n".encode()


def _die(runtime: Runtime, point: str, operation) -> None:
    runtime.faults.arm(point)
    with pytest.raises(InjectedFault):
        operation()


def test_one_sweep_heals_every_leftover_and_keeps_what_lives(
    backend: Backend, deployment_resources: dict
) -> None:
    runtime = backend.open(Clock(), group_writes=False)
    boxes = runtime.mailboxes
    inbox = boxes.create("alice@example.org", "INBOX")
    # What lives: a queued mail, a message in a mailbox.
    queued = runtime.queue("outbound").enqueue(Mail(recipients=("bob@example.org",), message=message(0)))
    kept = boxes.append(inbox, message(1))
    # What writes that died left, in generation 1.
    orphan_enqueue = EnqueueId.generate(runtime.clock())
    runtime.blobs.save_all(orphan_enqueue, [b"Subject: never queued\r\n\r\n", b"never queued\r\n"])
    after_content, after_row = MessageId.generate(runtime.clock()), MessageId.generate(runtime.clock())
    _die(
        runtime,
        faults.APPEND_AFTER_CONTENT,
        lambda: boxes.append(inbox, message(2), message_id=after_content),
    )
    _die(
        runtime,
        faults.APPEND_AFTER_MESSAGE_ROW,
        lambda: boxes.append(inbox, message(3), message_id=after_row),
    )
    expunged = boxes.append(inbox, message(4))
    _die(runtime, faults.EXPUNGE_AFTER_COUNTERS, lambda: boxes.expunge(inbox, [expunged.uid]))
    _die(runtime, faults.SAVE_AFTER_CONTENT, lambda: runtime.blobs.save("saver", b"content without row"))
    _die(runtime, faults.SAVE_AFTER_BLOB_ROWS, lambda: runtime.blobs.save("saver", b"row without reference"))
    # Leftovers the sweep must not touch yet: an owner younger than the grace period...
    young = MessageId.generate(system_clock())  # created now, by the sweep's clock
    runtime.blobs.save_all(young, [b"Subject: young\r\n\r\n", b"young\r\n"])
    runtime.generations.rotate()
    runtime.generations.rotate()
    # ... and one of a generation still protected (it may be in the middle of a write).
    protected = EnqueueId.generate(runtime.clock())
    runtime.blobs.save_all(protected, [b"Subject: protected\r\n\r\n", b"protected\r\n"])
    orphans = {orphan_enqueue, after_content, after_row, expunged.message_id}
    orphan_blob_ids = {b for owner in orphans for b in runtime.blobs.references_of(owner)}
    assert len(orphan_blob_ids) == 8

    resources = deployment_resources
    result = dg.materialize([blobs.reference_generations, orphan_sweep.orphan_blobs], resources=resources)
    assert result.success
    figures = materialized(result, "orphan_blobs")
    assert {key: figures[key] for key in ("orphan_owners", "orphan_references", "references_released")} == {
        "orphan_owners": 4,
        "orphan_references": 8,
        "references_released": 8,
    }
    assert {
        key: figures[key] for key in ("orphans_found", "orphan_content", "deleted_blobs", "delete_errors")
    } == {
        "orphans_found": 2,
        "orphan_content": 1,
        "deleted_blobs": 2,
        "delete_errors": 0,
    }
    for owner in orphans:
        assert runtime.blobs.references_of(owner) == []
    assert set(backend.mailbox_state().messages) == {kept.message_id}
    rows = set(backend.blob_state().blobs)
    contents = backend.blob_state().contents
    assert rows == contents
    for data in (b"content without row", b"row without reference"):
        assert str(BlobId(1, hashlib.sha256(data).hexdigest())) not in contents

    # The next GC iteration collects what the sweep released.
    collected = run_gc(resources)
    assert (collected["concerned_blobs"], collected["deleted_blobs"]) == (8, 8)
    rows = set(backend.blob_state().blobs)
    assert not rows & {str(b) for b in orphan_blob_ids}
    # What lives, and what the sweep had to leave, is whole.
    assert boxes.read(inbox, kept.uid) == message(1)
    item = runtime.queue("outbound").dequeue(timeout=0)
    assert item is not None and item.enqueue_id == queued and item.mail.message == message(0)
    for owner in (young, protected):
        assert len(runtime.blobs.references_of(owner)) == 2
