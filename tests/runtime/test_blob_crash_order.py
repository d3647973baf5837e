"""Crash order of record 39's paths without a transaction: each write of save, release, collect and the
generation rotation fails in turn (faults.POINTS), with the embedded store's grouping of writes on and
off. After every fault no content a caller was told is saved is lost, no blob row lacks its content
(but garbage whose collection died half-way), every reference names a blob row, what is left over is
what the orphan sweep or the GC collects, and running the operation again completes it."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from mailq_runtime import InjectedFault, Runtime, faults
from mailq_runtime.blobs.dedup import GC_ITERATION
from mailq_runtime.model import BlobId

from .backends import Backend

POINTS = [p for p in faults.POINTS if p.startswith(("blobs.", "generations."))]
KEPT = b"kept: saved before the fault, by an owner the fault must not touch\r\n"
NEW = b"new: first saved by the operation that dies\r\n"
GARBAGE = b"garbage: released two generations ago\r\n"


@dataclass
class Scene:
    runtime: Runtime
    backend: Backend
    kept: BlobId
    released: tuple[BlobId, ...] = ()
    garbage: BlobId | None = None


def _scene(backend: Backend, grouping: bool) -> Scene:
    runtime = backend.open(group_writes=grouping)
    return Scene(runtime, backend, runtime.blobs.save("keeper", KEPT))


def _assert_sound(scene: Scene, collecting: frozenset[str] = frozenset()) -> None:
    """Nothing told saved is lost, every reference names a blob row, every blob row has its content,
    but blobs in `collecting` (garbage whose collection died between the content and the rows)."""
    state = scene.backend.blob_state()
    assert scene.runtime.blobs.read(scene.kept) == KEPT
    assert scene.runtime.blobs.references_of("keeper") == [scene.kept]
    rows = set(state.blobs)
    assert state.referenced() <= rows
    assert rows - state.contents <= collecting


CONTENT_WITHOUT_ROW = "content without row (orphan sweep)"
ROW_WITHOUT_REFERENCE = "row without reference or deletion (orphan sweep)"


def _leftovers(scene: Scene) -> dict[str, set[str]]:
    """What a fault may leave, by who heals it."""
    state = scene.backend.blob_state()
    rows = set(state.blobs)
    return {
        CONTENT_WITHOUT_ROW: state.contents - rows,
        ROW_WITHOUT_REFERENCE: rows - state.referenced() - set(state.deleted()),
    }


# What each point leaves when every write commits alone (grouped, nothing is left).
LEFT_BY = {
    faults.SAVE_AFTER_CONTENT: CONTENT_WITHOUT_ROW,
    faults.SAVE_AFTER_BLOB_ROWS: ROW_WITHOUT_REFERENCE,
}


def _hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# Each path: its setup, the operation that dies, and what running it again to completion must leave.
def _save(scene: Scene) -> list[BlobId]:
    return scene.runtime.blobs.save_all("saver", [NEW, KEPT])


def _save_done(scene: Scene) -> None:
    # Saved again by another owner first: a blob id whose content a fault left unwritten would be
    # skipped by every later save, the failure content-before-rows prevents.
    (again,) = [scene.runtime.blobs.save("another", NEW)]
    new, kept = _save(scene)
    assert (again, kept) == (new, scene.kept)
    assert scene.runtime.blobs.read(new) == NEW
    assert scene.runtime.blobs.references_of("saver") == sorted([new, kept])
    assert scene.backend.blob_state().held()["another"] == {str(new)}


def _release_setup(scene: Scene) -> None:
    scene.released = tuple(scene.runtime.blobs.save_all("releaser", [NEW, KEPT]))


def _release(scene: Scene) -> int:
    return scene.runtime.blobs.release("releaser")


def _release_done(scene: Scene) -> None:
    assert scene.runtime.blobs.references_of("releaser") == []
    # Appended once, or twice when a first attempt died after appending them: the GC counts blob ids.
    assert set(scene.backend.blob_state().deleted()) == {str(blob_id) for blob_id in scene.released}


def _collect_setup(scene: Scene) -> None:
    scene.garbage = scene.runtime.blobs.save("thrown-away", GARBAGE)
    scene.runtime.blobs.release("thrown-away")
    scene.runtime.generations.rotate()
    scene.runtime.generations.rotate()


def _collect(scene: Scene) -> dict:
    return scene.runtime.blobs.collect([scene.garbage])


def _collect_done(scene: Scene) -> None:
    state = scene.backend.blob_state()
    assert str(scene.garbage) not in state.blobs.keys() | state.contents
    assert scene.backend.blob_state().deleted() == []


def _rotate(scene: Scene) -> tuple[int, int]:
    return scene.runtime.generations.rotate()


def _rotate_done(scene: Scene) -> None:
    # One rotation, whether the first attempt died half-way or not at all.
    generations = scene.runtime.generations
    assert (generations.current(), generations.current_gc_iteration()) == (2, 2)
    assert [g.number for g in generations.reference_generations()] == [1, 2]
    assert [n for n, _ in generations.tables.history(GC_ITERATION)] == [1, 2]


PATHS: dict[str, tuple[Callable[[Scene], None], Callable[[Scene], object], Callable[[Scene], None]]] = {
    "blobs.save": (lambda scene: None, _save, _save_done),
    "blobs.release": (_release_setup, _release, _release_done),
    "blobs.collect": (_collect_setup, _collect, _collect_done),
    "generations.rotate": (lambda scene: None, _rotate, _rotate_done),
}


def test_every_blob_path_has_its_points() -> None:
    assert {point.rsplit(".", 1)[0] for point in POINTS} == set(PATHS)


@pytest.mark.parametrize("grouping", [True, False], ids=["grouped", "ungrouped"])
@pytest.mark.parametrize("point", POINTS)
def test_a_fault_after_each_write_loses_nothing_and_a_rerun_completes(
    backend: Backend, point: str, grouping: bool
) -> None:
    setup, operation, done = PATHS[point.rsplit(".", 1)[0]]
    scene = _scene(backend, grouping)
    setup(scene)
    scene.runtime.faults.arm(point)
    with pytest.raises(InjectedFault, match=point):
        operation(scene)
    assert scene.runtime.faults.armed is None
    collecting = frozenset({str(scene.garbage)}) if scene.garbage else frozenset()
    _assert_sound(scene, collecting)
    # Grouped (where a deployment can group), the writes rolled back together and left nothing. Alone,
    # a save leaves its new blob.
    expected = {kind: set() for kind in (CONTENT_WITHOUT_ROW, ROW_WITHOUT_REFERENCE)}
    if not (grouping and backend.groups_writes) and point in LEFT_BY:
        expected[LEFT_BY[point]] = {str(BlobId(1, _hash(NEW)))}
    assert _leftovers(scene) == expected
    operation(scene)
    done(scene)
    _assert_sound(scene)
    assert not any(_leftovers(scene).values())


def test_content_left_without_its_row_is_written_again_by_the_next_save(backend: Backend) -> None:
    scene = _scene(backend, grouping=False)
    scene.runtime.faults.arm(faults.SAVE_AFTER_CONTENT)
    with pytest.raises(InjectedFault):
        scene.runtime.blobs.save("saver", NEW)
    (left,) = _leftovers(scene)["content without row (orphan sweep)"]
    backend.lose_content(left)  # as if the content store lost what no row names: it is put again
    blob_id = scene.runtime.blobs.save("another", NEW)
    assert str(blob_id) == left and scene.runtime.blobs.read(blob_id) == NEW
    _assert_sound(scene)


def test_a_half_done_rotation_is_completed_not_repeated(backend: Backend) -> None:
    scene = _scene(backend, grouping=False)
    generations = scene.runtime.generations
    scene.runtime.faults.arm(faults.ROTATE_AFTER_REFERENCE_GENERATION)
    with pytest.raises(InjectedFault):
        generations.rotate()
    assert (generations.current(), generations.current_gc_iteration()) == (2, 1)
    # A second process rotating now completes the first one's rotation: both see generation 2.
    other = backend.open()
    assert other.generations.rotate() == (2, 2)
    assert generations.rotate() == (3, 3)
