"""Record 39's deduplicating blob store: content saved per owner, stored once per reference generation.

A blob id is the current reference generation plus the SHA-256 of the content, so the same content saved
twice in one generation is stored once, and saved again in a later generation is stored anew. That is
what lets the garbage collector delete a blob of generation g once the current generation is g+2 or
later: no new reference to it can appear any more. (An operation that read generation g before two
rotations and writes after them is the one case that rule does not cover, as in record 39: rotations are
far apart, operations short.)

No write path assumes a transaction across the tables or between the tables and the content: each
table call commits on its own, in the order its docstring gives, and is idempotent or harmless when
repeated. The deployment's unit of work may group one operation's writes (the embedded store's transaction),
which is faster and never needed for correctness.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..clock import Clock
from ..errors import InvalidInput, shown
from ..faults import (
    COLLECT_AFTER_CONTENT,
    RELEASE_AFTER_DELETIONS,
    ROTATE_AFTER_REFERENCE_GENERATION,
    SAVE_AFTER_BLOB_ROWS,
    SAVE_AFTER_CONTENT,
    FaultInjector,
)
from ..model import BlobId
from ..stores.protocols import BlobTables
from ..unit_of_work import UNGROUPED, UnitOfWork
from .shared_read import SharedRead
from .store import BlobStore

REFERENCE_GENERATION = "reference_generation"
GC_ITERATION = "gc_iteration"
_OWNER = re.compile(r"[!-~]{1,200}")

# Seconds a done()'s release may name the GC iteration it read last (`Generations.recent_gc_iteration`).
GC_ITERATION_REUSE = 1.0


@dataclass(frozen=True)
class DeletionBacklog:
    """Deletions in eligible generations that appeared since a point: what a GC iteration would process."""

    count: int
    oldest: int | None
    newest: int | None
    current_generation: int


@dataclass(frozen=True)
class BlobFacts:
    """What the tables and the content store hold of one blob, for `mailq blobs explain`."""

    blob_id: BlobId
    state: str  # its generation's: eligible, protected, current, or not started
    current_generation: int
    size: int | None  # its `blobs` row's; None: no row
    content: bool
    references: list[tuple[str, int]]  # (owner, generation)
    deletions: list[tuple[int, int, str | None]]  # (deleted_at, gc_iteration, owner)


@dataclass(frozen=True)
class Generation:
    number: int
    started_at: int


class Generations:
    """The reference generations and GC iterations, as events. `rotate()` is what the schedule calls.

    Generation n and GC iteration n are emitted together, so their numbers stay equal. Nothing is
    emitted until the first save or rotation (opening a store writes nothing): until then the current
    generation and iteration are 1.
    """

    def __init__(
        self,
        tables: BlobTables,
        clock: Clock,
        faults: FaultInjector | None = None,
        work: UnitOfWork = UNGROUPED,
    ) -> None:
        self.tables = tables
        self.clock = clock
        self.faults = faults or FaultInjector()
        self.work = work
        self._recent: tuple[int, float] | None = None  # (GC iteration, time.monotonic() it was read)
        # Concurrent saves share a read of the generation that began after each asked (record 39's bound
        # is on the generation's age when the save writes, which a later read cannot widen).
        self._for_saving = SharedRead(lambda: self.tables.current(REFERENCE_GENERATION))

    def current(self) -> int:
        return self.tables.current(REFERENCE_GENERATION) or 1

    def current_gc_iteration(self) -> int:
        return self.tables.current(GC_ITERATION) or 1

    def recent_gc_iteration(self) -> int:
        """The GC iteration read within the last GC_ITERATION_REUSE seconds, else the current one: the
        iteration a deletion names is there to be read (`explain`), no GC step decides by it, so the
        releases of a busy consumer share one read a second. A rotation by this process shows at once;
        another's, within that second."""
        recent = self._recent
        if recent is None or time.monotonic() - recent[1] >= GC_ITERATION_REUSE:
            recent = self._recent = (self.current_gc_iteration(), time.monotonic())
        return recent[0]

    def for_saving(self) -> int:
        """The current generation, for a save: the first one is emitted if none is yet."""
        current = self._for_saving()
        if current is None:
            now = self.clock()
            self.tables.emit(REFERENCE_GENERATION, 1, now)
            self.tables.emit(GC_ITERATION, 1, now)
            return 1
        return current

    def rotate(self) -> tuple[int, int]:
        """Emit the next reference generation and the next GC iteration; returns both numbers.

        Crash-safe order: 1. the reference generation; 2. the GC iteration (both appended only if not
        emitted yet, so of two processes rotating at once one emits each event and both return the same
        numbers). A crash after 1 leaves a generation without its iteration: the next rotation completes
        that one rather than starting another, as it does for a rotation another process has under way.
        """
        try:
            with self.work.writes():
                now = self.clock()
                generation = self.for_saving()
                iteration = self.tables.current(GC_ITERATION) or 0
                if iteration < generation:
                    self.tables.emit(GC_ITERATION, generation, now)
                    return generation, generation
                self.tables.emit(REFERENCE_GENERATION, generation + 1, now)
                self.faults.reached(ROTATE_AFTER_REFERENCE_GENERATION)
                self.tables.emit(GC_ITERATION, generation + 1, now)
            return generation + 1, generation + 1
        finally:
            self._recent = None  # the next release reads the iteration this rotation emitted

    def reference_generations(self) -> list[Generation]:
        return [Generation(n, at) for n, at in self.tables.history(REFERENCE_GENERATION)]

    def eligible(self) -> list[int]:
        """Generations the GC may collect: at least two behind the current one (record 39's n-2)."""
        return list(range(1, self.current() - 1))

    def state(self, generation: int, current: int | None = None) -> str:
        """eligible (the GC may collect it), protected (the one before the current: a save that read it
        may still write), current, or not started (a number no rotation reached yet)."""
        current = self.current() if current is None else current
        if generation <= current - 2:
            return "eligible"
        if generation == current - 1:
            return "protected"
        return "current" if generation == current else "not started"


def validate_owner(owner: str) -> str:
    if not isinstance(owner, str) or not _OWNER.fullmatch(owner):
        raise InvalidInput(f"invalid blob owner {shown(owner)}: 1-200 printable ASCII characters, no spaces")
    return owner


class DeduplicatingBlobStore:
    def __init__(
        self,
        tables: BlobTables,
        content: BlobStore,
        clock: Clock,
        faults: FaultInjector | None = None,
        work: UnitOfWork = UNGROUPED,
    ) -> None:
        self.tables = tables
        self.content = content
        self.clock = clock
        self.faults = faults or FaultInjector()
        self.work = work
        self.generations = Generations(tables, clock, self.faults, work)

    def save(self, owner: str, data: bytes) -> BlobId:
        """Store `data` for `owner`; returns its blob id (see `save_all`)."""
        return self.save_all(owner, [data])[0]

    def save_all(self, owner: str, contents: Sequence[bytes]) -> list[BlobId]:
        """Store each of `contents` (a message's header and body) for `owner`, with one read of the
        generation; returns their blob ids in order.

        Crash-safe order: 1. the content of each blob without a row yet (a put is idempotent: its key is
        the blob id); 2. the missing `blobs` rows; 3. the owner's references. A blob row therefore always
        has its content, which is why a blob with a row is not written again. A crash after 1 leaves
        content without a row, after 2 blobs nobody references: the same save run again completes them,
        and the orphan sweep collects them once their generation is eligible. Two processes saving the
        same new content at once both write it, harmlessly, and each records its reference.
        """
        return self._save(owner, contents, skip_known=True)

    def save_new(self, owner: str, contents: Sequence[bytes]) -> list[BlobId]:
        """`save_all` for contents that are all but certainly stored nowhere yet (a mail just accepted,
        whose header holds its own trace fields and Message-ID), without the read of which blobs have a
        row: each content is put and its row written. One stored already gets the same bytes under the
        same key and a row of the same size (its `created_at`, which nothing reads, moves), so it is
        still stored once; what a crash leaves is `save_all`'s."""
        return self._save(owner, contents, skip_known=False)

    def save_new_many(self, saves: Sequence[tuple[str, Sequence[bytes]]]) -> list[list[BlobId]]:
        """`save_new` for several owners (the enqueues of a group, queue/enqueuer.py): one read of the
        generation and one call a table for them all, in the same crash-safe order; the blob ids of each
        owner's contents."""
        for owner, contents in saves:
            _check(owner, contents)
        digests = [[hashlib.sha256(data).hexdigest() for data in contents] for _, contents in saves]
        with self.work.writes():
            generation = self.generations.for_saving()
            saved = [[BlobId.of_checked(generation, digest) for digest in owned] for owned in digests]
            new = {
                blob_id: bytes(data)
                for blob_ids, (_, contents) in zip(saved, saves, strict=True)
                for blob_id, data in zip(blob_ids, contents, strict=True)
            }
            self.content.put_many(list(new.items()))
            self.faults.reached(SAVE_AFTER_CONTENT)
            self.tables.add_blobs([(blob_id, len(data)) for blob_id, data in new.items()], self.clock())
            self.faults.reached(SAVE_AFTER_BLOB_ROWS)
            self.tables.add_references_of(
                [
                    (owner, list(dict.fromkeys(blob_ids)))
                    for (owner, _), blob_ids in zip(saves, saved, strict=True)
                ]
            )
        return saved

    def _save(self, owner: str, contents: Sequence[bytes], skip_known: bool) -> list[BlobId]:
        _check(owner, contents)
        if not contents:
            return []
        digests = [hashlib.sha256(data).hexdigest() for data in contents]
        with self.work.writes():
            generation = self.generations.for_saving()
            blob_ids = [BlobId.of_checked(generation, digest) for digest in digests]
            distinct = dict(zip(blob_ids, contents, strict=True))  # the same content twice is one blob
            known = self.tables.sizes(distinct) if skip_known else {}
            new = [(blob_id, data) for blob_id, data in distinct.items() if blob_id not in known]
            for blob_id, data in new:
                self.content.put(blob_id, bytes(data))
            self.faults.reached(SAVE_AFTER_CONTENT)
            if new:
                self.tables.add_blobs([(blob_id, len(data)) for blob_id, data in new], self.clock())
            self.faults.reached(SAVE_AFTER_BLOB_ROWS)
            self.tables.add_references(owner, list(distinct))
        return blob_ids

    def read(self, blob_id: BlobId | str) -> bytes:
        return self.content.get(BlobId.parse(blob_id))

    def references_of(self, owner: str) -> list[BlobId]:
        return self.tables.references_of(validate_owner(owner))

    def release(self, owner: str, blob_ids: Iterable[BlobId | str] | None = None) -> int:
        """Remove the owner's references (all, or the given ones) and append a deletion for each; returns
        how many were released.

        Releasing an owner with no references left is a no-op, so clean-ups can be retried; naming a
        blob the owner does not reference is an error and releases nothing.

        Crash-safe order: 1. the deletions; 2. the references. A crash after 1 leaves deletions of blobs
        still referenced, which is harmless (the GC keeps any blob with a live reference); the release
        run again appends them once more and removes the references. The other order could lose the
        deletion of a removed reference, and its blob would never be collected.
        """
        validate_owner(owner)
        chosen = None if blob_ids is None else {BlobId.parse(b) for b in blob_ids}
        with self.work.writes():
            held = self.tables.references_of(owner)
            if chosen is not None:
                foreign = chosen - set(held)
                if foreign:
                    names = ", ".join(map(str, sorted(foreign)))
                    raise InvalidInput(f"owner {shown(owner)} holds no reference to {names}")
                held = [blob_id for blob_id in held if blob_id in chosen]
            if not held:
                return 0
            self.tables.add_deletions(owner, held, self.generations.current_gc_iteration(), self.clock())
            self.faults.reached(RELEASE_AFTER_DELETIONS)
            self.tables.remove_references(owner, held)
        return len(held)

    def release_saved(self, owner: str, blob_ids: Iterable[BlobId | str]) -> None:
        """Release the references a `save_all` for `owner` wrote to `blob_ids`, without reading them
        first: for a caller whose record names them (a mail's row names its header and body). The order
        is `release`'s: 1. the deletions; 2. the references. Released again, they get their deletions
        appended again (harmless, as for `release` run again after a crash) and nothing is removed."""
        validate_owner(owner)
        held = list(dict.fromkeys(BlobId.parse(blob_id) for blob_id in blob_ids))
        with self.work.writes():
            self.tables.add_deletions(owner, held, self.generations.recent_gc_iteration(), self.clock())
            self.faults.reached(RELEASE_AFTER_DELETIONS)
            self.tables.remove_references(owner, held)

    def collect(self, blob_ids: Iterable[BlobId | str]) -> dict[BlobId, int]:
        """Garbage collection: delete the content of blobs found unreferenced, then their rows in `blobs`
        and `blob_deletions`. Returns the size of each blob collected (those already gone are left out).
        Only eligible generations are accepted, whatever the caller.

        Crash-safe order: 1. the content; 2. the rows. A crash after 1 leaves rows of garbage whose
        content is gone: their deletions make the next iteration collect them again (deleting missing
        content is no error), and a blob left without deletion is the orphan sweep's. No save can meet
        such a row: saves write the current generation, and these are at least two behind it.
        """
        chosen = sorted({BlobId.parse(b) for b in blob_ids})
        current = self.generations.current()
        young = [b for b in chosen if b.generation > current - 2]
        if young:
            raise InvalidInput(
                f"refusing to collect {len(young)} blob(s) of generations not yet eligible "
                f"(current generation {current}), e.g. {young[0]}"
            )
        with self.work.writes():
            sizes = self.tables.sizes(chosen)
            self.content.delete_many(chosen)  # in batches: DeleteObjects of a thousand keys on S3
            self.faults.reached(COLLECT_AFTER_CONTENT)
            self.tables.forget(chosen)
        return sizes

    def referenced(self, blob_ids: Iterable[BlobId | str]) -> set[BlobId]:
        """Those of the blobs some owner still references: the GC's exact check of a few blobs."""
        return self.tables.referenced(sorted({BlobId.parse(b) for b in blob_ids}))

    def retire_deletions(self, rows: Iterable[tuple[BlobId | str, int]]) -> int:
        """Drop the deletion rows (blob id, deleted_at) of blobs a GC iteration found still referenced,
        so that the next iteration does not examine them again; returns how many rows were named.

        Never deletes content or a `blobs` row, so it cannot lose a live blob. The caller names only
        rows it read and old enough that the releases that wrote them have removed their references
        (see assets/blobs.py, the settle time); a later release of the blob appends a new row, which
        makes the GC examine the blob again.
        """
        chosen = sorted({(BlobId.parse(blob_id), int(deleted_at)) for blob_id, deleted_at in rows})
        if chosen:
            with self.work.writes():
                self.tables.retire_deletions(chosen)
        return len(chosen)

    def explain(self, blob_id: BlobId | str) -> BlobFacts:
        """The blob's generation state, `blobs` row, content, references and deletions, read by its id.
        A well-formed id of which nothing is left anywhere is no error: its facts are all empty."""
        parsed = BlobId.parse(blob_id)
        current = self.generations.current()
        return BlobFacts(
            blob_id=parsed,
            state=self.generations.state(parsed.generation, current),
            current_generation=current,
            size=self.tables.sizes([parsed]).get(parsed),
            content=self.content.exists(parsed),
            references=self.tables.references_to(parsed),
            deletions=self.tables.deletions_of(parsed),
        )

    def sizes(self, blob_ids: Iterable[BlobId | str]) -> dict[BlobId, int]:
        """The size of each of the blobs that still has its `blobs` row."""
        return self.tables.sizes(sorted({BlobId.parse(b) for b in blob_ids}))

    def deletion_backlog(self, since_generation: int = 0, since: int = 0) -> DeletionBacklog:
        """Deletions of eligible generations appended after `since`, or eligible only since the current
        generation moved past `since_generation`."""
        current = self.generations.current()
        count, oldest, newest = self.tables.deletion_backlog(current - 2, since_generation - 2, since)
        return DeletionBacklog(count, oldest, newest, current)


def _check(owner: str, contents: Sequence[bytes]) -> None:
    validate_owner(owner)
    for data in contents:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise InvalidInput(f"blob content must be bytes, not {type(data).__name__}")
