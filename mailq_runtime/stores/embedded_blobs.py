"""Record 39's tables on the embedded store: generations, blobs, blob_references, blob_deletions."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..model import BlobId
from .embedded import EmbeddedStore


class EmbeddedBlobTables:
    def __init__(self, store: EmbeddedStore) -> None:
        self.store = store

    def transaction(self):
        return self.store.transaction()

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

    def history(self, kind: str) -> list[tuple[int, int]]:
        return self.store.read(
            "SELECT number, started_at FROM generations WHERE kind = ? ORDER BY number", (kind,)
        )

    # blobs and references
    def add_references(self, owner: str, blobs: Sequence[tuple[BlobId, int]], now: int) -> set[str]:
        """Record the blobs (those not yet known) and the owner's references to them; returns the ids of
        the blobs that were new. (A statement a row: in SQLite, cheaper than multi-row ... RETURNING.)"""
        new = set()
        with self.store.transaction() as db:
            for blob_id, size in blobs:
                if db.execute(
                    "INSERT OR IGNORE INTO blobs (blob_id, generation, size, created_at) VALUES (?, ?, ?, ?)",
                    (str(blob_id), blob_id.generation, size, now),
                ).rowcount:
                    new.add(str(blob_id))
                db.execute(
                    "INSERT OR IGNORE INTO blob_references (owner, blob_id, generation) VALUES (?, ?, ?)",
                    (owner, str(blob_id), blob_id.generation),
                )
        return new

    def references_of(self, owner: str) -> list[BlobId]:
        rows = self.store.read(
            "SELECT blob_id FROM blob_references WHERE owner = ? ORDER BY blob_id", (owner,)
        )
        return [BlobId.parse(blob_id) for (blob_id,) in rows]

    def release(self, owner: str, blob_ids: Iterable[BlobId] | None, gc_iteration: int, now: int) -> int:
        """Remove the owner's references (to `blob_ids`, or all of them) and append one deletion for each
        reference removed."""
        with self.store.transaction() as db:
            if blob_ids is None:
                removed = db.execute(
                    "DELETE FROM blob_references WHERE owner = ? RETURNING blob_id, generation", (owner,)
                ).fetchall()
            else:
                ids = [str(blob_id) for blob_id in blob_ids]
                removed = db.execute(
                    "DELETE FROM blob_references WHERE owner = ? AND blob_id IN "
                    f"({', '.join('?' * len(ids))}) RETURNING blob_id, generation",
                    [owner, *ids],
                ).fetchall()
            if removed:
                db.executemany(
                    "INSERT INTO blob_deletions (blob_id, generation, deleted_at, gc_iteration) "
                    "VALUES (?, ?, ?, ?)",
                    [(blob_id, generation, now, gc_iteration) for blob_id, generation in removed],
                )
        return len(removed)

    def forget(self, blob_ids: Iterable[BlobId]) -> None:
        """Drop collected blobs from `blobs` and `blob_deletions` (their content is already gone)."""
        blob_ids = list(blob_ids)
        with self.store.transaction() as db:
            db.executemany("DELETE FROM blob_deletions WHERE blob_id = ?", [(str(b),) for b in blob_ids])
            db.executemany("DELETE FROM blobs WHERE blob_id = ?", [(str(b),) for b in blob_ids])

    def deletion_backlog(self, max_generation: int, newly_eligible_above: int, since: int) -> tuple:
        return self.store.read_one(
            "SELECT COUNT(*), MIN(deleted_at), MAX(deleted_at) FROM blob_deletions "
            "WHERE generation <= ? AND (deleted_at > ? OR generation > ?)",
            (max_generation, since, newly_eligible_above),
        )

    def sizes(self, blob_ids: Iterable[BlobId]) -> dict[BlobId, int]:
        sizes = {}
        for blob_id in blob_ids:
            row = self.store.read_one("SELECT size FROM blobs WHERE blob_id = ?", (str(blob_id),))
            if row is not None:
                sizes[blob_id] = row[0]
        return sizes
