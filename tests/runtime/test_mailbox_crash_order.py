"""Crash order of record 23's paths without a transaction: each write of append, flag, move, expunge and
the orphan release fails in turn (faults.POINTS), with the embedded store's grouping of writes on and
off. After every fault no message a caller was told is stored is lost, every message in a mailbox has its
content, what is left over is what the counter recomputation or the orphan sweep repairs, and running
the operation again completes it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from mailq_runtime import Counters, InjectedFault, MailboxId, MessageId, Runtime, UnknownMailbox, faults

from .backends import Backend

POINTS = [p for p in faults.POINTS if p.startswith("mailbox.")]
SEEN = "\\Seen"
USER = "alice@example.org"
# Points inside an operation's first group of writes: grouped, a fault there undoes the whole operation.
IN_FIRST_GROUP = {
    faults.APPEND_AFTER_UID,
    faults.APPEND_AFTER_CONTENT,
    faults.APPEND_AFTER_MESSAGE_ROW,
    faults.MOVE_AFTER_TARGET,
    faults.ORPHAN_AFTER_MESSAGE_ROW,
}


def message(n: int) -> bytes:
    return f"Subject: message {n}\r\nFrom: bob@example.org\r\n\r\nbody {n}\r\n".encode()


@dataclass
class Scene:
    runtime: Runtime
    backend: Backend
    inbox: MailboxId
    archive: MailboxId
    told: dict[str, bytes]  # message id -> content, of every append a caller was told succeeded
    first: str  # the message at uid 1 of the INBOX, which the operations work on
    new: str = field(default_factory=lambda: MessageId.generate(0))


def _scene(backend: Backend, grouping: bool) -> Scene:
    runtime = backend.open(group_writes=grouping)
    boxes = runtime.mailboxes
    inbox, archive = boxes.create(USER, "INBOX"), boxes.create(USER, "Archive")
    first = boxes.append(inbox, message(1)).message_id
    second = boxes.append(inbox, message(2), flags=[SEEN]).message_id
    third = boxes.append(archive, message(3)).message_id
    told = {first: message(1), second: message(2), third: message(3)}
    return Scene(runtime, backend, inbox, archive, told, first)


def _state(scene: Scene) -> dict:
    mailboxes, blobs = scene.backend.mailbox_state(), scene.backend.blob_state()
    boxes = scene.runtime.mailboxes
    return {
        "source of truth": mailboxes.source_of_truth,
        "projection": mailboxes.projection,
        "counters": {m: boxes.counters(m) for m in (scene.inbox, scene.archive)},
        "messages": mailboxes.messages,
        "references": blobs.held(),
        "deletions": blobs.deleted(),
    }


def _assert_sound(scene: Scene, removed: frozenset[str]) -> None:
    """Every told message (but those the operation removes) is in a mailbox and reads back whole; every
    message in a mailbox has its row and its references; every blob row has its content."""
    backend, boxes = scene.backend, scene.runtime.mailboxes
    for message_id, content in scene.told.items():
        placements = boxes.locate(message_id)
        assert placements or message_id in removed, message_id
        for mailbox, uid in placements.items():
            assert boxes.read(mailbox, uid) == content
    mailboxes, blobs = backend.mailbox_state(), backend.blob_state()
    held = blobs.held()
    for message_id in mailboxes.placed():
        assert held[message_id] == set(mailboxes.messages[message_id])
    assert blobs.referenced() <= set(blobs.blobs) <= blobs.contents


def _recompute(scene: Scene) -> None:
    """Record 23's recomputation through the runtime's repairs, as the mailbox_counters asset does."""
    backend, boxes = scene.backend, scene.runtime.mailboxes
    state = backend.mailbox_state()
    differing = state.source_of_truth ^ state.projection
    for mailbox, _, message_id, _ in differing:
        boxes.heal_projection(mailbox, message_id)
    for mailbox in (scene.inbox, scene.archive):
        recount = boxes.recount(mailbox)
        observed = boxes.counters(mailbox)
        boxes.reset_counters(
            mailbox, recount.count, recount.unseen, observed=(observed.count, observed.unseen)
        )


def _sweep(scene: Scene) -> None:
    """The orphan sweep's runtime half, once the leftovers' generation is eligible: owners of references
    that no mailbox holds (the Spark half, which finds them by anti-join, is tests/pipeline's)."""
    runtime = scene.runtime
    runtime.generations.rotate()
    runtime.generations.rotate()
    placed = scene.backend.mailbox_state().placed()
    for owner in set(scene.backend.blob_state().held()) - placed:
        assert runtime.mailboxes.release_orphan(owner) == 2


def _assert_consistent(scene: Scene) -> None:
    backend, boxes = scene.backend, scene.runtime.mailboxes
    state = backend.mailbox_state()
    assert state.projection == state.source_of_truth
    for mailbox in (scene.inbox, scene.archive):
        assert boxes.counters(mailbox) == boxes.recount(mailbox)
    assert set(state.messages) == set(backend.blob_state().held()) == state.placed()


# Each path: its setup, the operation that dies, and what it leaves once run again and healed.
def _orphan_setup(scene: Scene) -> None:
    # An expunge that died before releasing the message's content; two rotations make it eligible.
    boxes = scene.runtime.mailboxes
    scene.runtime.faults.arm(faults.EXPUNGE_AFTER_COUNTERS)
    with pytest.raises(InjectedFault):
        boxes.expunge(scene.inbox, [1])
    scene.runtime.generations.rotate()
    scene.runtime.generations.rotate()


def _append_done(scene: Scene) -> None:
    (uid,) = scene.runtime.mailboxes.locate(scene.new).values()
    assert scene.runtime.mailboxes.locate(scene.new) == {scene.inbox: uid}
    assert scene.runtime.mailboxes.read(scene.inbox, uid) == message(9)


def _flag_done(scene: Scene) -> None:
    assert (scene.inbox, 1, scene.first, SEEN) in scene.backend.mailbox_state().source_of_truth
    assert scene.runtime.mailboxes.counters(scene.inbox) == Counters(2, 0)


def _move_done(scene: Scene) -> None:
    (uid,) = scene.runtime.mailboxes.locate(scene.first).values()
    assert scene.runtime.mailboxes.locate(scene.first) == {scene.archive: uid}
    assert scene.runtime.mailboxes.counters(scene.archive) == Counters(2, 2)


def _removed_done(scene: Scene) -> None:
    assert scene.runtime.mailboxes.locate(scene.first) == {}
    assert scene.first not in scene.backend.mailbox_state().messages
    assert scene.first not in scene.backend.blob_state().held()


Path = tuple[Callable[[Scene], None], Callable[[Scene], object], Callable[[Scene], None]]
PATHS: dict[str, Path] = {
    "mailbox.append": (
        lambda scene: None,
        lambda scene: scene.runtime.mailboxes.append(scene.inbox, message(9), message_id=scene.new),
        _append_done,
    ),
    "mailbox.flag": (
        lambda scene: None,
        lambda scene: scene.runtime.mailboxes.set_flags(scene.inbox, 1, add=[SEEN]),
        _flag_done,
    ),
    "mailbox.move": (
        lambda scene: None,
        lambda scene: scene.runtime.mailboxes.move(scene.inbox, 1, scene.archive),
        _move_done,
    ),
    "mailbox.expunge": (
        lambda scene: None,
        lambda scene: scene.runtime.mailboxes.expunge(scene.inbox, [1]),
        _removed_done,
    ),
    "mailbox.release_orphan": (
        _orphan_setup,
        lambda scene: scene.runtime.mailboxes.release_orphan(scene.first),
        _removed_done,
    ),
}
REMOVES = {"mailbox.expunge", "mailbox.release_orphan"}


def test_every_mailbox_path_has_its_points() -> None:
    assert {point.rsplit(".", 1)[0] for point in POINTS} == set(PATHS)


@pytest.mark.parametrize("grouping", [True, False], ids=["grouped", "ungrouped"])
@pytest.mark.parametrize("point", POINTS)
def test_a_fault_after_each_write_loses_nothing_and_leaves_only_what_is_healed(
    backend: Backend, point: str, grouping: bool
) -> None:
    path = point.rsplit(".", 1)[0]
    setup, operation, done = PATHS[path]
    scene = _scene(backend, grouping)
    setup(scene)
    removed = frozenset({scene.first}) if path in REMOVES else frozenset()
    before = _state(scene)
    scene.runtime.faults.arm(point)
    with pytest.raises(InjectedFault, match=point):
        operation(scene)
    assert scene.runtime.faults.armed is None
    _assert_sound(scene, removed)
    if grouping and backend.groups_writes and point in IN_FIRST_GROUP:
        assert _state(scene) == before
    elif point != faults.APPEND_AFTER_UID:  # a uid taken, which leaves a gap and nothing else
        assert _state(scene) != before
    # Run again: it completes, or finds its first write done and nothing left for it to do.
    try:
        operation(scene)
    except UnknownMailbox:
        assert path in {"mailbox.move", "mailbox.expunge"}
    _recompute(scene)
    _sweep(scene)
    _assert_consistent(scene)
    _assert_sound(scene, removed)
    done(scene)


def test_a_message_is_never_in_neither_mailbox_during_a_move(backend: Backend) -> None:
    scene = _scene(backend, grouping=False)
    boxes = scene.runtime.mailboxes
    scene.runtime.faults.arm(faults.MOVE_AFTER_TARGET)
    with pytest.raises(InjectedFault):
        boxes.move(scene.inbox, 1, scene.archive)
    placed = boxes.locate(scene.first)
    assert set(placed) == {scene.inbox, scene.archive}
    # Run again, the move finds the message in the target already and keeps that uid.
    assert boxes.move(scene.inbox, 1, scene.archive) == placed[scene.archive]
    assert boxes.locate(scene.first) == {scene.archive: placed[scene.archive]}
