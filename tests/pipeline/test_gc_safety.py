"""The blob GC under live traffic, and its exact, dry-run and orphan-sweep modes.

Writer threads keep saving and releasing the same few contents under many owners while GC iterations
run, so every iteration sees blobs gaining and losing references around it. Whatever the interleaving,
no referenced blob may lose its row or its content; once the writers stop and two more generations
have passed, every unreferenced blob must be gone.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time

import pytest

from assets import jobs
from mailq_runtime import Runtime
from mailq_runtime.faults import SAVE_AFTER_BLOB_ROWS, InjectedFault
from mailq_runtime.model import BlobId
from tests.runtime.backends import Backend

from .pipeline import materialized, run_gc

# Owners that live for the whole test only ever save the first two contents: their blobs stay live in
# every generation (the filter must keep them). The last two are only ever held by short-lived owners:
# their blobs turn into garbage a little after each generation ends (the collector must take them).
CONTENTS = [b"Subject: shared part %d\r\n\r\n" % n + bytes([65 + n]) * (100 * (n + 1)) for n in range(4)]
KEPT_CONTENTS = CONTENTS[:2]
WRITERS = 3
ROUNDS = 4
WRITER_DEADLINE_S = 240  # a bound on the writers whatever happens to the main thread
EXTRA_ROUNDS = 2  # a false positive keeps garbage one more round; a fresh salt makes another unlikely
GARBAGE = (b"garbage one", b"garbage two, longer")
ORPHAN = b"orphan of a failed write"


class Writer(threading.Thread):
    """Saves and releases through the runtime until told to stop; remembers what each owner holds."""

    def __init__(self, runtime: Runtime, number: int, stop: threading.Event) -> None:
        super().__init__(name=f"writer-{number}", daemon=True)
        self.runtime = runtime
        self.number = number
        self.stop = stop
        self.random = random.Random(number)
        self.kept: dict[str, list[tuple[BlobId, bytes]]] = {}
        self.transient: dict[str, list[tuple[BlobId, bytes]]] = {}
        self.released: list[str] = []
        self.operations = 0
        self.error: BaseException | None = None

    def _save(self, owner: str, contents: list[bytes]) -> list[tuple[BlobId, bytes]]:
        return [(self.runtime.blobs.save(owner, data), data) for data in contents]

    def _release(self, owner: str) -> None:
        self.runtime.blobs.release(owner)
        del self.transient[owner]
        self.released.append(owner)

    def run(self) -> None:
        deadline = time.monotonic() + WRITER_DEADLINE_S
        try:
            while not self.stop.is_set() and time.monotonic() < deadline:
                owner = f"w{self.number}-{self.operations}"
                draw = self.random.random()
                if draw < 0.1:
                    self.kept[owner] = self._save(owner, [self.random.choice(KEPT_CONTENTS)])
                elif self.transient and (draw < 0.55 or len(self.transient) > 40):
                    self._release(self.random.choice(list(self.transient)))
                else:
                    contents = self.random.sample(CONTENTS, self.random.randint(1, 2))
                    self.transient[owner] = self._save(owner, contents)
                self.operations += 1
                time.sleep(0.03)  # a steady trickle, leaving the CPU to Spark
        except BaseException as error:  # reported by the main thread
            self.error = error

    def release_transient(self) -> None:
        for owner in list(self.transient):
            self._release(owner)


def assert_no_referenced_blob_lost(runtime: Runtime, backend: Backend) -> set[str]:
    """Every referenced blob has its `blobs` row and its content, which hashes to its id; returns them.
    The references are read first: a writer saves content, then the row, then the reference, and only
    the GC (run by this thread) deletes rows and content, so a reference read has them afterwards."""
    state = backend.blob_state()
    referenced = state.referenced()
    assert referenced - set(state.blobs) == set()
    assert referenced - state.contents == set()
    for blob_id in referenced:
        assert hashlib.sha256(runtime.blobs.read(blob_id)).hexdigest() == BlobId.parse(blob_id).hash
    return referenced


def unreferenced_eligible_blobs(runtime: Runtime, backend: Backend) -> list[str]:
    """Blobs of the generations the GC may collect that nothing references: garbage still there."""
    oldest_protected = runtime.generations.current() - 1
    referenced = backend.blob_state().referenced()
    return [
        blob_id
        for blob_id, generation in backend.blob_state().blobs.items()
        if generation < oldest_protected and blob_id not in referenced
    ]


def wait_for_operations(writers: list[Writer], count: int) -> None:
    started = time.monotonic()
    while sum(w.operations for w in writers) < count:
        assert time.monotonic() - started < 60, "the writers made no progress"
        assert not any(w.error for w in writers), [w.error for w in writers]
        time.sleep(0.05)


def test_no_referenced_blob_is_collected_under_concurrent_writers_and_garbage_goes_eventually(
    backend: Backend, deployment_resources: dict
) -> None:
    runtime, resources = backend.open(), deployment_resources
    stop = threading.Event()
    writers = [Writer(runtime, n, stop) for n in range(WRITERS)]
    for writer in writers:
        writer.start()
    rounds = []
    try:
        # Two generations of traffic first, so that the first GC round already has one to collect.
        for _ in range(2):
            wait_for_operations(writers, sum(w.operations for w in writers) + 60)
            runtime.generations.rotate()
        for _ in range(ROUNDS):
            wait_for_operations(writers, sum(w.operations for w in writers) + 60)
            runtime.generations.rotate()
            # Its check: no reference left dangling. The rounds take turns between the exact lookups
            # of a few concerned blobs and the Bloom filter (lookup_limit 0).
            rounds.append(run_gc(resources, {"lookup_limit": 0} if len(rounds) % 2 else None))
            assert_no_referenced_blob_lost(runtime, backend)
    finally:
        stop.set()
        for writer in writers:
            writer.join(timeout=60)
    assert [w.error for w in writers] == [None] * WRITERS
    assert not any(w.is_alive() for w in writers)

    # Every round had deletions to look at; across them, the filter kept live blobs and garbage went.
    assert all(r["concerned_blobs"] > 0 and r["delete_errors"] == 0 for r in rounds), rounds
    assert sum(r["kept_still_referenced"] for r in rounds) > 0, rounds
    assert sum(r["deleted_blobs"] for r in rounds) > 0, rounds

    # The writers stop and let go of their short-lived owners; two rotations make every generation
    # eligible, then everything unreferenced goes.
    for writer in writers:
        writer.release_transient()
    for _ in range(2):
        runtime.generations.rotate()
        rounds.append(run_gc(resources))
        assert_no_referenced_blob_lost(runtime, backend)
    for _ in range(EXTRA_ROUNDS):
        if not unreferenced_eligible_blobs(runtime, backend):
            break
        rounds.append(run_gc(resources))
    assert unreferenced_eligible_blobs(runtime, backend) == []
    # Nothing left behind by a collected blob: neither content nor deletions.
    state = backend.blob_state()
    assert state.contents - set(state.blobs) == set()
    assert set(state.deleted()) - set(state.blobs) == set()

    # Every owner still holding blobs reads back exactly what it saved; released owners hold nothing.
    referenced = assert_no_referenced_blob_lost(runtime, backend)
    kept_blobs = set()
    for writer in writers:
        for owner, saved in writer.kept.items():
            assert runtime.blobs.references_of(owner) == sorted({blob_id for blob_id, _ in saved})
            for blob_id, data in saved:
                assert runtime.blobs.read(blob_id) == data
                kept_blobs.add(str(blob_id))
        for owner in writer.released[:: max(1, len(writer.released) // 50)]:
            assert runtime.blobs.references_of(owner) == []
    assert referenced == kept_blobs  # the long-lived owners are the only ones left
    assert len(backend.blob_state().blobs) == len(kept_blobs)


def expect_figures(metadata: dict, **expected: object) -> None:
    """The materialisation's metadata has these values (the others, timings and paths, vary)."""
    assert {key: metadata.get(key) for key in expected} == expected


def _save(runtime: Runtime, owner: str, data: bytes) -> str:
    return str(runtime.blobs.save(owner, data))


def _orphan(runtime: Runtime, data: bytes) -> str:
    """A blob row and its content with neither reference nor deletion: a save that died between the
    blob rows and the reference (the runtime commits every write alone)."""
    runtime.faults.arm(SAVE_AFTER_BLOB_ROWS)
    with pytest.raises(InjectedFault):
        runtime.blobs.save("dies", data)
    return str(BlobId(runtime.generations.current(), hashlib.sha256(data).hexdigest()))


def _blob_rows(backend: Backend) -> dict[str, list]:
    state = backend.blob_state()
    return {
        "blobs": sorted(state.blobs.items()),
        "blob_references": sorted(state.references),
        "blob_deletions": state.deletions,
        "content": sorted(state.contents),
    }


def test_dry_run_exact_mode_and_orphan_sweep(backend: Backend, deployment_resources: dict) -> None:
    runtime, resources = backend.open(group_writes=False), deployment_resources
    # Generation 1: two garbage blobs (all owners released), one blob still referenced by a second owner,
    # and an orphan no deletion names.
    garbage = [_save(runtime, "m1", GARBAGE[0]), _save(runtime, "m2", GARBAGE[1])]
    live = _save(runtime, "m3", b"live")
    _save(runtime, "m4", b"live")
    for owner in ("m1", "m2", "m3"):
        runtime.blobs.release(owner)
    orphan = _orphan(runtime, ORPHAN)
    runtime.generations.rotate()
    # Generation 2, still protected when the GC runs in generation 3: its garbage and orphan stay.
    young_garbage = _save(runtime, "m5", b"young garbage")
    runtime.blobs.release("m5")
    young_orphan = _orphan(runtime, b"young orphan")
    runtime.generations.rotate()
    before = _blob_rows(backend)

    planned = jobs.gc_plan_job.execute_in_process(
        resources=resources,
        run_config={"ops": {"gc_plan": {"config": {"exact": True}}}},
    )
    assert planned.success
    expect_figures(
        materialized(planned, "gc_plan"),
        mode="exact anti-join",
        concerned_blobs=3,
        blobs_to_delete=2,
        kept_still_referenced=1,
        kept_by_filter_false_positive=0,
        bytes_to_reclaim=len(GARBAGE[0] + GARBAGE[1]),
    )
    assert _blob_rows(backend) == before

    result = jobs.orphan_sweep_job.execute_in_process(resources=resources)
    assert result.success
    sweep = materialized(result, "orphan_blobs")
    expect_figures(
        sweep, dry_run=False, orphans_found=1, deleted_blobs=1, delete_errors=0, bytes_reclaimed=len(ORPHAN)
    )
    assert not runtime.content.exists(orphan)
    after_sweep = _blob_rows(backend)
    assert after_sweep == {
        table: [row for row in rows if orphan != row and orphan not in row] for table, rows in before.items()
    }

    exact = run_gc(resources, exact=True)
    expect_figures(
        exact,
        mode="exact anti-join",
        concerned_blobs=3,
        deleted_blobs=2,
        kept_still_referenced=1,
        kept_by_filter_false_positive=0,
        delete_errors=0,
        bytes_reclaimed=len(GARBAGE[0] + GARBAGE[1]),
    )
    assert [runtime.content.exists(b) for b in garbage] == [False, False]
    assert set(backend.blob_state().blobs) == {
        live,
        young_garbage,
        young_orphan,
    }
    assert runtime.blobs.read(live) == b"live"
    # The live blob's deletion stays for a later iteration; the young generation's is not touched.
    assert sorted(blob_id for blob_id, _, _ in backend.blob_state().deletions) == sorted(
        [live, young_garbage]
    )
