"""Record 39's deduplicating blob store: content saved per owner, stored once per reference generation.

A blob id is the current reference generation plus the SHA-256 of the content, so the same content saved
twice in one generation is stored once, and saved again in a later generation is stored anew. That is
what lets the garbage collector delete a blob of generation g once the current generation is g+2 or
later: no new reference to it can appear any more.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..clock import Clock
from ..errors import InvalidInput, shown
from ..model import BlobId
from .store import BlobStore

REFERENCE_GENERATION = "reference_generation"
GC_ITERATION = "gc_iteration"
_OWNER = re.compile(r"[!-~]{1,200}")


class BlobTables(Protocol):
    def transaction(self): ...
    def current(self, kind: str) -> int | None: ...
    def emit(self, kind: str, number: int, now: int) -> None: ...
    def history(self, kind: str) -> list[tuple[int, int]]: ...
    def add_references(self, owner: str, blobs: Sequence[tuple[BlobId, int]], now: int) -> set[str]: ...
    def references_of(self, owner: str) -> list[BlobId]: ...
    def release(self, owner: str, blob_ids: Iterable[BlobId] | None, gc_iteration: int, now: int) -> int: ...
    def deletion_backlog(self, max_generation: int, newly_eligible_above: int, since: int) -> tuple: ...
    def sizes(self, blob_ids: Iterable[BlobId]) -> dict[BlobId, int]: ...
    def forget(self, blob_ids: Iterable[BlobId]) -> None: ...


@dataclass(frozen=True)
class DeletionBacklog:
    """Deletions in eligible generations that appeared since a point: what a GC iteration would process."""

    count: int
    oldest: int | None
    newest: int | None
    current_generation: int


@dataclass(frozen=True)
class Generation:
    number: int
    started_at: int


class Generations:
    """The reference generations and GC iterations, as events. `rotate()` is what the schedule calls."""

    def __init__(self, tables: BlobTables, clock: Clock) -> None:
        self.tables = tables
        self.clock = clock

    def start(self) -> None:
        """Emit the first reference generation and GC iteration when none is: a store's creation."""
        with self.tables.transaction():
            if self.tables.current(REFERENCE_GENERATION) is None:
                now = self.clock()
                self.tables.emit(REFERENCE_GENERATION, 1, now)
                self.tables.emit(GC_ITERATION, 1, now)

    def current(self) -> int:
        return self.tables.current(REFERENCE_GENERATION)

    def current_gc_iteration(self) -> int:
        return self.tables.current(GC_ITERATION)

    def rotate(self) -> tuple[int, int]:
        """Emit the next reference generation and the next GC iteration; returns both numbers."""
        with self.tables.transaction():
            now = self.clock()
            generation = self.tables.current(REFERENCE_GENERATION) + 1
            iteration = self.tables.current(GC_ITERATION) + 1
            self.tables.emit(REFERENCE_GENERATION, generation, now)
            self.tables.emit(GC_ITERATION, iteration, now)
        return generation, iteration

    def reference_generations(self) -> list[Generation]:
        return [Generation(n, at) for n, at in self.tables.history(REFERENCE_GENERATION)]

    def gc_iterations(self) -> list[Generation]:
        return [Generation(n, at) for n, at in self.tables.history(GC_ITERATION)]

    def eligible(self) -> list[int]:
        """Generations the GC may collect: at least two behind the current one (record 39's n-2)."""
        return list(range(1, self.current() - 1))


def validate_owner(owner: str) -> str:
    if not isinstance(owner, str) or not _OWNER.fullmatch(owner):
        raise InvalidInput(f"invalid blob owner {shown(owner)}: 1-200 printable ASCII characters, no spaces")
    return owner


class DeduplicatingBlobStore:
    def __init__(self, tables: BlobTables, content: BlobStore, clock: Clock) -> None:
        self.tables = tables
        self.content = content
        self.clock = clock
        self.generations = Generations(tables, clock)

    def save(self, owner: str, data: bytes) -> BlobId:
        """Store `data` for `owner`; returns its blob id. The owner's reference is recorded atomically."""
        return self.save_all(owner, [data])[0]

    def save_all(self, owner: str, contents: Sequence[bytes]) -> list[BlobId]:
        """Store each of `contents` (a message's header and body) for `owner`, in one transaction and
        with one read of the generation; returns their blob ids in order."""
        validate_owner(owner)
        for data in contents:
            if not isinstance(data, bytes | bytearray | memoryview):
                raise InvalidInput(f"blob content must be bytes, not {type(data).__name__}")
        if not contents:
            return []
        digests = [hashlib.sha256(data).hexdigest() for data in contents]
        with self.tables.transaction():
            # Read inside the write transaction: a rotation cannot slip between choosing the
            # generation and recording the references. The content is written before the commit,
            # so a committed blob row always has its content.
            generation = self.generations.current()
            blob_ids = [BlobId(generation, digest) for digest in digests]
            sized = [(blob_id, len(data)) for blob_id, data in zip(blob_ids, contents, strict=True)]
            new = self.tables.add_references(owner, sized, self.clock())
            for blob_id, data in zip(blob_ids, contents, strict=True):
                if str(blob_id) in new:
                    new.discard(str(blob_id))  # the same content twice is written once
                    self.content.put(blob_id, bytes(data))
        return blob_ids

    def read(self, blob_id: BlobId | str) -> bytes:
        return self.content.get(BlobId.parse(blob_id))

    def references_of(self, owner: str) -> list[BlobId]:
        return self.tables.references_of(validate_owner(owner))

    def release(self, owner: str, blob_ids: Iterable[BlobId | str] | None = None) -> int:
        """Remove the owner's references (all, or the given ones) and append a deletion for each.

        Releasing an owner with no references left is a no-op, so clean-ups can be retried; naming a
        blob the owner does not reference is an error and releases nothing.
        """
        validate_owner(owner)
        with self.tables.transaction():
            chosen = None
            if blob_ids is not None:
                chosen = {BlobId.parse(b) for b in blob_ids}
                foreign = chosen - set(self.tables.references_of(owner))
                if foreign:
                    names = ", ".join(map(str, sorted(foreign)))
                    raise InvalidInput(f"owner {shown(owner)} holds no reference to {names}")
                if not chosen:
                    return 0
            return self.tables.release(owner, chosen, self.generations.current_gc_iteration(), self.clock())

    def collect(self, blob_ids: Iterable[BlobId | str]) -> dict[BlobId, int]:
        """Garbage collection: delete the content of blobs found unreferenced, then their rows in `blobs`
        and `blob_deletions`. Returns the size of each blob collected (those already gone are left out).

        Content goes first: a failure in between leaves rows that the next iteration collects again,
        never a row whose content is gone. Only eligible generations are accepted, whatever the caller.
        """
        chosen = sorted({BlobId.parse(b) for b in blob_ids})
        current = self.generations.current()
        young = [b for b in chosen if b.generation > current - 2]
        if young:
            raise InvalidInput(
                f"refusing to collect {len(young)} blob(s) of generations not yet eligible "
                f"(current generation {current}), e.g. {young[0]}"
            )
        sizes = self.tables.sizes(chosen)
        for blob_id in chosen:
            self.content.delete(blob_id)
        self.tables.forget(chosen)
        return sizes

    def deletion_backlog(self, since_generation: int = 0, since: int = 0) -> DeletionBacklog:
        """Deletions of eligible generations appended after `since`, or eligible only since the current
        generation moved past `since_generation`."""
        current = self.generations.current()
        count, oldest, newest = self.tables.deletion_backlog(current - 2, since_generation - 2, since)
        return DeletionBacklog(count, oldest, newest, current)
