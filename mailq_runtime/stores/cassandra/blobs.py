"""Record 39's tables on Cassandra: generations, blobs, blob_references and blob_deletions, one small DAO a
table behind `CassandraBlobTables`, which has the methods of the embedded store's blob tables.

Each method is one step that commits on its own: `blobs/dedup.py` orders them (content, then `blobs` rows,
then references on a save; deletions, then the removal of references on a release; content, then rows
on a collection), so that none needs another's transaction, which Cassandra does not have across tables.

- generations: `emit` is a lightweight transaction (INSERT ... IF NOT EXISTS) and returns whether this
  call emitted the number, so of two processes rotating at once one emits generation n+1 and the
  other learns that it did not. It is the only lightweight transaction of these tables.
- add_blobs is a plain INSERT a blob, all at once. The caller writes only the blobs that `sizes` did
  not find, so a row present already is rewritten only when two processes save the same new content at
  once: with the same size (a blob id is its content's hash) and the later `created_at`, which nothing
  reads. That is why it needs no IF NOT EXISTS.
- add_references writes the owner's references in one batch, a single mutation of one partition.
- add_deletions appends a row a blob id, naming the owner that released it. A repeated release (after a
  crash between its deletions and its references' removal) appends them again at its own time, counted
  again as on the embedded store; the GC counts blob ids, not deletions, either way. Two releases of one
  blob in the same microsecond share a row (its key ends with the time), which names the later owner.
- remove_references deletes exactly the blob ids given, one statement in the owner's partition: a
  reference saved meanwhile, which has no deletion, is kept.
- blob_deletions is partitioned by (generation, shard): the deletions of one generation are its
  DELETION_SHARDS partitions, read without touching any other generation's.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence

from ...model import BlobId
from .schema import DELETION_SHARDS
from .store import CassandraStore

_IN_CHUNK = 100


def shard_of(blob_id: BlobId | str) -> int:
    return zlib.crc32(str(blob_id).encode()) % DELETION_SHARDS


def _chunks(items: list, size: int = _IN_CHUNK) -> Iterable[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class GenerationsDAO:
    def __init__(self, store: CassandraStore) -> None:
        self.store = store

    def current(self, kind: str) -> int | None:
        row = self.store.execute("SELECT number FROM generations WHERE kind = ? LIMIT 1", (kind,)).one()
        return None if row is None else row.number

    def emit(self, kind: str, number: int, now: int) -> bool:
        return self.store.applied(
            "INSERT INTO generations (kind, number, started_at) VALUES (?, ?, ?) IF NOT EXISTS",
            (kind, number, now),
        ).applied

    def history(self, kind: str) -> list[tuple[int, int]]:
        rows = self.store.execute(
            "SELECT number, started_at FROM generations WHERE kind = ? ORDER BY number ASC", (kind,)
        )
        return [(row.number, row.started_at) for row in rows]


class BlobsDAO:
    def __init__(self, store: CassandraStore) -> None:
        self.store = store

    def sizes(self, blob_ids: list[str]) -> dict[str, int]:
        results = self.store.execute_all(
            "SELECT blob_id, size FROM blobs WHERE blob_id IN ?", [(chunk,) for chunk in _chunks(blob_ids)]
        )
        return {row.blob_id: row.size for rows in results for row in rows}

    def add(self, blobs: Sequence[tuple[BlobId, int]], now: int) -> None:
        self.store.execute_all(
            "INSERT INTO blobs (blob_id, generation, size, created_at) VALUES (?, ?, ?, ?)",
            [(str(blob_id), blob_id.generation, size, now) for blob_id, size in blobs],
        )

    def delete(self, blob_ids: list[str]) -> None:
        self.store.execute_all("DELETE FROM blobs WHERE blob_id = ?", [(blob_id,) for blob_id in blob_ids])


class BlobReferencesDAO:
    def __init__(self, store: CassandraStore) -> None:
        self.store = store

    def add(self, owner: str, blob_ids: Sequence[BlobId]) -> None:
        if not blob_ids:
            return  # Cassandra refuses an empty batch
        # One partition: the batch is a single mutation, applied whole.
        self.store.batch(
            "INSERT INTO blob_references (owner, blob_id, generation) VALUES (?, ?, ?)",
            [(owner, str(blob_id), blob_id.generation) for blob_id in blob_ids],
        )

    def of(self, owner: str) -> list[str]:
        """The owner's references, by blob id."""
        rows = self.store.execute("SELECT blob_id FROM blob_references WHERE owner = ?", (owner,))
        return [row.blob_id for row in rows]

    def referenced(self, blob_ids: list[str]) -> set[str]:
        """Those of the blob ids with a reference, one indexed query a blob id, run concurrently."""
        results = self.store.execute_all(
            "SELECT blob_id FROM blob_references WHERE blob_id = ? LIMIT 1", [(b,) for b in blob_ids]
        )
        return {row.blob_id for rows in results for row in rows}

    def to(self, blob_id: str) -> list[tuple[str, int]]:
        """(owner, generation) of the blob's references, through the blob id's index."""
        rows = self.store.execute(
            "SELECT owner, generation FROM blob_references WHERE blob_id = ?", (blob_id,)
        )
        return sorted((row.owner, row.generation) for row in rows)

    def remove(self, owner: str, blob_ids: Sequence[BlobId]) -> None:
        self.store.execute(
            "DELETE FROM blob_references WHERE owner = ? AND blob_id IN ?",
            (owner, [str(blob_id) for blob_id in blob_ids]),
        )


class BlobDeletionsDAO:
    def __init__(self, store: CassandraStore) -> None:
        self.store = store

    def add(self, owner: str, blob_ids: Sequence[BlobId], gc_iteration: int, now: int) -> None:
        self.store.execute_all(
            "INSERT INTO blob_deletions (generation, shard, blob_id, deleted_at, gc_iteration, owner) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [
                (blob_id.generation, shard_of(blob_id), str(blob_id), now, gc_iteration, owner)
                for blob_id in blob_ids
            ],
        )

    def delete(self, blob_ids: list[BlobId]) -> None:
        self.store.execute_all(
            "DELETE FROM blob_deletions WHERE generation = ? AND shard = ? AND blob_id = ?",
            [(blob_id.generation, shard_of(blob_id), str(blob_id)) for blob_id in blob_ids],
        )

    def retire(self, rows: Sequence[tuple[BlobId, int]]) -> None:
        """Delete rows by their full primary key: a blob's other deletions stay."""
        self.store.execute_all(
            "DELETE FROM blob_deletions "
            "WHERE generation = ? AND shard = ? AND blob_id = ? AND deleted_at = ?",
            [
                (blob_id.generation, shard_of(blob_id), str(blob_id), deleted_at)
                for blob_id, deleted_at in rows
            ],
        )

    def of(self, blob_id: BlobId) -> list[tuple[int, int, str | None]]:
        """(deleted_at, gc_iteration, owner) of the blob's deletions: one clustering range of one
        partition."""
        rows = self.store.execute(
            "SELECT deleted_at, gc_iteration, owner FROM blob_deletions "
            "WHERE generation = ? AND shard = ? AND blob_id = ?",
            (blob_id.generation, shard_of(blob_id), str(blob_id)),
        )
        return [(row.deleted_at, row.gc_iteration, row.owner) for row in rows]

    def partitions(self) -> list[tuple[int, int]]:
        """(generation, shard) of every partition: a few per generation, read from the partition keys."""
        rows = self.store.execute("SELECT DISTINCT generation, shard FROM blob_deletions")
        return [(row.generation, row.shard) for row in rows]

    def summary(self, generation: int, shard: int, after: int | None) -> tuple[int, int | None, int | None]:
        """Count, oldest and newest deletion time in one partition, of the deletions after `after`
        (all of them when None)."""
        if after is None:
            row = self.store.execute(
                "SELECT COUNT(*), MIN(deleted_at), MAX(deleted_at) FROM blob_deletions "
                "WHERE generation = ? AND shard = ?",
                (generation, shard),
            ).one()
        else:
            # Filtering inside one partition: it reads that partition only.
            row = self.store.execute(
                "SELECT COUNT(*), MIN(deleted_at), MAX(deleted_at) FROM blob_deletions "
                "WHERE generation = ? AND shard = ? AND deleted_at > ? ALLOW FILTERING",
                (generation, shard, after),
            ).one()
        return row[0], row[1], row[2]


class CassandraBlobTables:
    def __init__(self, store: CassandraStore) -> None:
        self.generations = GenerationsDAO(store)
        self.blobs = BlobsDAO(store)
        self.references = BlobReferencesDAO(store)
        self.deletions = BlobDeletionsDAO(store)

    # generations: an append-only event log of reference generations and GC iterations
    def current(self, kind: str) -> int | None:
        return self.generations.current(kind)

    def emit(self, kind: str, number: int, now: int) -> bool:
        """Emit `number`; False if it was emitted already (another process's rotation got there first)."""
        return self.generations.emit(kind, number, now)

    def history(self, kind: str) -> list[tuple[int, int]]:
        return self.generations.history(kind)

    # blobs and references
    def sizes(self, blob_ids: Iterable[BlobId]) -> dict[BlobId, int]:
        """The size of each blob that has a row in `blobs`."""
        by_name = {str(blob_id): blob_id for blob_id in blob_ids}
        return {by_name[name]: size for name, size in self.blobs.sizes(list(by_name)).items()}

    def add_blobs(self, blobs: Sequence[tuple[BlobId, int]], now: int) -> None:
        """Rows in `blobs` for (blob id, size) (see the module's docstring for a row present already)."""
        self.blobs.add(blobs, now)

    def add_references(self, owner: str, blob_ids: Sequence[BlobId]) -> None:
        """The owner's references to the blobs; those present already are kept (rewritten as they were)."""
        self.references.add(owner, blob_ids)

    def references_of(self, owner: str) -> list[BlobId]:
        return [BlobId.parse(blob_id) for blob_id in self.references.of(owner)]

    def referenced(self, blob_ids: Sequence[BlobId]) -> set[BlobId]:
        by_name = {str(blob_id): blob_id for blob_id in blob_ids}
        return {by_name[name] for name in self.references.referenced(list(by_name))}

    def add_deletions(self, owner: str, blob_ids: Sequence[BlobId], gc_iteration: int, now: int) -> None:
        """Append one deletion a blob id, in its generation's partitions."""
        self.deletions.add(owner, blob_ids, gc_iteration, now)

    def remove_references(self, owner: str, blob_ids: Sequence[BlobId]) -> None:
        self.references.remove(owner, blob_ids)

    def forget(self, blob_ids: Iterable[BlobId]) -> None:
        """Drop collected blobs from `blobs` and `blob_deletions` (their content is already gone)."""
        blob_ids = list(blob_ids)
        self.deletions.delete(blob_ids)
        self.blobs.delete([str(blob_id) for blob_id in blob_ids])

    def retire_deletions(self, rows: Sequence[tuple[BlobId, int]]) -> None:
        """Drop exactly the deletion rows (blob id, deleted_at) of blobs found still referenced."""
        self.deletions.retire(rows)

    def references_to(self, blob_id: BlobId) -> list[tuple[str, int]]:
        return self.references.to(str(blob_id))

    def deletions_of(self, blob_id: BlobId) -> list[tuple[int, int, str | None]]:
        return self.deletions.of(blob_id)

    def deletion_backlog(self, max_generation: int, newly_eligible_above: int, since: int) -> tuple:
        """(count, oldest, newest) of the deletions of generations up to `max_generation` that were
        appended after `since`, or all of a generation above `newly_eligible_above`."""
        summaries = [
            self.deletions.summary(generation, shard, None if generation > newly_eligible_above else since)
            for generation, shard in self.deletions.partitions()
            if generation <= max_generation
        ]
        counted = [summary for summary in summaries if summary[0]]
        if not counted:
            return 0, None, None
        return (
            sum(count for count, _, _ in counted),
            min(oldest for _, oldest, _ in counted),
            max(newest for _, _, newest in counted),
        )
