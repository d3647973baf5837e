"""Record 39's tables on the embedded store: generations, blobs, blob_references, blob_deletions.

Each method is one SQLite transaction of its own (joining the caller's group of writes, if any)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ...model import BlobId
from ..records import BlobDeletion, BlobReference, DeletionRow, DeletionSpan, GenerationStart, SizedBlob
from .store import EmbeddedStore


class EmbeddedBlobTables:
    def __init__(self, store: EmbeddedStore) -> None:
        self.store = store

    # generations: an append-only event log of reference generations and GC iterations
    def current(self, kind: str) -> int | None:
        row = self.store.read_one("SELECT MAX(number) FROM generations WHERE kind = ?", (kind,))
        return row[0]

    def emit(self, kind: str, number: int, now: int) -> bool:
        """Emit `number`; False if it was emitted already (another process's rotation got there first)."""
        with self.store.transaction() as db:
            return bool(
                db.execute(
                    "INSERT OR IGNORE INTO generations (kind, number, started_at) VALUES (?, ?, ?)",
                    (kind, number, now),
                ).rowcount
            )

    def history(self, kind: str) -> list[GenerationStart]:
        rows = self.store.read(
            "SELECT number, started_at FROM generations WHERE kind = ? ORDER BY number", (kind,)
        )
        return [GenerationStart(*row) for row in rows]

    # blobs and references
    def add_blobs(self, blobs: Sequence[SizedBlob], now: int) -> None:
        with self.store.transaction() as db:
            db.executemany(
                "INSERT OR IGNORE INTO blobs (blob_id, generation, size, created_at) VALUES (?, ?, ?, ?)",
                [(str(blob_id), blob_id.generation, size, now) for blob_id, size in blobs],
            )

    def add_references(self, owner: str, blob_ids: Sequence[BlobId]) -> None:
        with self.store.transaction() as db:
            db.executemany(
                "INSERT OR IGNORE INTO blob_references (owner, blob_id, generation) VALUES (?, ?, ?)",
                [(owner, str(blob_id), blob_id.generation) for blob_id in blob_ids],
            )

    def add_references_of(self, references: Sequence[tuple[str, Sequence[BlobId]]]) -> None:
        with self.store.transaction() as db:
            db.executemany(
                "INSERT OR IGNORE INTO blob_references (owner, blob_id, generation) VALUES (?, ?, ?)",
                [
                    (owner, str(blob_id), blob_id.generation)
                    for owner, blob_ids in references
                    for blob_id in blob_ids
                ],
            )

    def references_of(self, owner: str) -> list[BlobId]:
        rows = self.store.read(
            "SELECT blob_id FROM blob_references WHERE owner = ? ORDER BY blob_id", (owner,)
        )
        return [BlobId.parse(blob_id) for (blob_id,) in rows]

    def referenced(self, blob_ids: Sequence[BlobId]) -> set[BlobId]:
        by_name = {str(blob_id): blob_id for blob_id in blob_ids}
        names = list(by_name)
        found: set[BlobId] = set()
        for start in range(0, len(names), 500):  # under SQLite's default limit of 999 parameters
            chunk = names[start : start + 500]
            chosen = ", ".join("?" * len(chunk))
            rows = self.store.read(
                f"SELECT DISTINCT blob_id FROM blob_references WHERE blob_id IN ({chosen})", chunk
            )
            found.update(by_name[name] for (name,) in rows)
        return found

    def add_deletions(self, owner: str, blob_ids: Sequence[BlobId], gc_iteration: int, now: int) -> None:
        with self.store.transaction() as db:
            db.executemany(
                "INSERT INTO blob_deletions (blob_id, generation, deleted_at, gc_iteration, owner) "
                "VALUES (?, ?, ?, ?, ?)",
                [(str(blob_id), blob_id.generation, now, gc_iteration, owner) for blob_id in blob_ids],
            )

    def remove_references(self, owner: str, blob_ids: Sequence[BlobId]) -> None:
        # An owner holds a few references (a mail's header and body): one statement for all of them.
        chosen = ", ".join("?" * len(blob_ids))
        with self.store.transaction() as db:
            db.execute(
                f"DELETE FROM blob_references WHERE owner = ? AND blob_id IN ({chosen})",
                [owner, *map(str, blob_ids)],
            )

    def forget(self, blob_ids: Iterable[BlobId]) -> None:
        """Drop collected blobs from `blobs` and `blob_deletions` (their content is already gone)."""
        blob_ids = list(blob_ids)
        with self.store.transaction() as db:
            db.executemany("DELETE FROM blob_deletions WHERE blob_id = ?", [(str(b),) for b in blob_ids])
            db.executemany("DELETE FROM blobs WHERE blob_id = ?", [(str(b),) for b in blob_ids])

    def retire_deletions(self, rows: Sequence[DeletionRow]) -> None:
        """Drop exactly these deletion rows; found by the blob id's index."""
        with self.store.transaction() as db:
            db.executemany(
                "DELETE FROM blob_deletions WHERE blob_id = ? AND generation = ? AND deleted_at = ?",
                [(str(blob_id), blob_id.generation, deleted_at) for blob_id, deleted_at in rows],
            )

    def references_to(self, blob_id: BlobId) -> list[BlobReference]:
        rows = self.store.read(
            "SELECT owner, generation FROM blob_references WHERE blob_id = ? ORDER BY owner", (str(blob_id),)
        )
        return [BlobReference(*row) for row in rows]

    def deletions_of(self, blob_id: BlobId) -> list[BlobDeletion]:
        rows = self.store.read(
            "SELECT deleted_at, gc_iteration, owner FROM blob_deletions WHERE blob_id = ? "
            "ORDER BY deleted_at",
            (str(blob_id),),
        )
        return [BlobDeletion(*row) for row in rows]

    def deletion_backlog(self, max_generation: int, newly_eligible_above: int, since: int) -> DeletionSpan:
        return DeletionSpan(
            *self.store.read_one(
                "SELECT COUNT(*), MIN(deleted_at), MAX(deleted_at) FROM blob_deletions "
                "WHERE generation <= ? AND (deleted_at > ? OR generation > ?)",
                (max_generation, since, newly_eligible_above),
            )
        )

    def sizes(self, blob_ids: Iterable[BlobId]) -> dict[BlobId, int]:
        by_name = {str(blob_id): blob_id for blob_id in blob_ids}
        sizes = {}
        names = list(by_name)
        # In chunks under SQLite's default limit of 999 parameters (a GC batch is 1000 blobs).
        for start in range(0, len(names), 500):
            chunk = names[start : start + 500]
            rows = self.store.read(
                f"SELECT blob_id, size FROM blobs WHERE blob_id IN ({', '.join('?' * len(chunk))})", chunk
            )
            sizes.update({by_name[name]: size for name, size in rows})
        return sizes
