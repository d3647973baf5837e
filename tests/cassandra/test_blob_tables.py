"""Record 39: the Cassandra blob tables answer every call as the embedded ones do, generations,
blob rows, references, deletions, the deletion backlog and the collector's forgetting."""

from __future__ import annotations

from mailq_runtime.blobs.dedup import GC_ITERATION, REFERENCE_GENERATION
from mailq_runtime.model import BlobId

from .conftest import Tables, same_on_both

T0 = 1_700_002_800 * 1_000_000


def blob(generation: int, n: int) -> BlobId:
    return BlobId(generation, f"{n:064x}")


def test_generations_are_emitted_once_each(both):
    def scenario(t: Tables) -> list:
        b = t.blobs
        return [
            b.current(REFERENCE_GENERATION),
            b.emit(REFERENCE_GENERATION, 1, T0),
            b.emit(GC_ITERATION, 1, T0),
            b.emit(REFERENCE_GENERATION, 1, T0 + 5),
            b.emit(REFERENCE_GENERATION, 2, T0 + 10),
            b.current(REFERENCE_GENERATION),
            b.current(GC_ITERATION),
            b.history(REFERENCE_GENERATION),
            b.history(GC_ITERATION),
        ]

    assert same_on_both(both, scenario) == [
        None,
        True,
        True,
        False,
        True,
        2,
        1,
        [(1, T0), (2, T0 + 10)],
        [(1, T0)],
    ]


def test_blobs_references_deletions_backlog_and_forgetting_as_the_embedded_ones(both):
    b1, b2, b3, b4, old = blob(3, 1), blob(3, 2), blob(3, 3), blob(4, 4), blob(1, 5)

    def scenario(t: Tables) -> dict:
        b = t.blobs
        seen: dict = {}
        # A save's steps: the blob rows that `sizes` did not find, then the owner's references.
        b.add_blobs([(b1, 10), (b2, 20)], T0)
        b.add_blobs([(b3, 30)], T0 + 1)
        b.add_blobs([(b2, 20)], T0 + 2)  # a racing save of the same new content
        b.add_blobs([(b4, 40), (old, 50)], T0 + 3)
        b.add_blobs([], T0 + 4)
        seen["sizes"] = [b.sizes([b1, b2, b3, b4, old, blob(3, 9)]), b.sizes([]), b.sizes([b2, b2])]
        b.add_references("m1", [b1, b2])
        b.add_references("m2", [b2, b3])
        b.add_references("m3", [b3, b3])
        b.add_references("m4", [b4, old])
        b.add_references("m5", [])
        b.add_references("m1", [b1])  # a save run again after a crash
        seen["references"] = [b.references_of(owner) for owner in ("m1", "m2", "m3", "m4", "m5", "nobody")]
        # A release's steps: the deletions, then the references; m1's first one run again after a crash.
        b.add_deletions("m1", [b1], 7, T0 + 100)
        b.add_deletions("m1", [b1], 7, T0 + 101)
        b.remove_references("m1", [b1])
        b.remove_references("m1", [b1])
        b.add_deletions("m1", [b2], 7, T0 + 102)
        b.remove_references("m1", [b2])
        b.add_deletions("m2", [b2, b3], 8, T0 + 200)
        b.remove_references("m2", [b2, b3])
        b.add_deletions("m4", [b4, old], 8, T0 + 300)
        b.remove_references("m4", [b4, old])
        b.remove_references("m3", [b1])  # a blob it does not reference: its own are kept
        b.remove_references("nobody", [b1])
        seen["left"] = [b.references_of(owner) for owner in ("m1", "m2", "m3", "m4")]
        seen["backlog"] = [
            b.deletion_backlog(5, 0, 0),
            b.deletion_backlog(3, 5, T0 + 150),
            b.deletion_backlog(3, 2, T0 + 150),
            b.deletion_backlog(2, 0, 0),
            b.deletion_backlog(1, 0, T0 + 350),
            b.deletion_backlog(0, -2, 0),
        ]
        b.forget([b1, old])
        seen["forgotten"] = [b.sizes([b1, b2, old]), b.deletion_backlog(5, 0, 0), b.references_of("m3")]
        return seen

    seen = same_on_both(both, scenario)
    assert seen["sizes"] == [{b1: 10, b2: 20, b3: 30, b4: 40, old: 50}, {}, {b2: 20}]
    assert seen["references"] == [sorted([b1, b2]), sorted([b2, b3]), [b3], sorted([b4, old]), [], []]
    assert seen["left"] == [[], [], [b3], []]
    assert seen["backlog"] == [
        (7, T0 + 100, T0 + 300),
        (3, T0 + 200, T0 + 300),
        (6, T0 + 100, T0 + 300),
        (1, T0 + 300, T0 + 300),
        (1, T0 + 300, T0 + 300),
        (0, None, None),
    ]
    assert seen["forgotten"] == [{b2: 20}, (4, T0 + 102, T0 + 300), [b3]]
