"""Record 39's tables on Cassandra: generations, blobs, blob_references and blob_deletions, in
`CassandraBlobTables`, which has the methods of the embedded store's blob tables (stores/embedded/blobs.py),
grouped by table.

Each method is one step that commits on its own: `blobs/dedup.py` orders them (content, then `blobs` rows,
then references on a save; deletions, then the removal of references on a release; content, then rows
on a collection), so that none needs another's transaction, which Cassandra does not have across tables.

- generations: `emit` is a lightweight transaction (INSERT ... IF NOT EXISTS) and returns whether this
  call emitted the number, so of two processes rotating at once one emits generation n+1 and the
  other learns that it did not. It is the only lightweight transaction of these tables.
- add_blobs is a plain INSERT a blob, sent as one unlogged batch (one request for a message's header
  and body; each partition's row applied on its own, so a crash may leave some, which the same save run
  again completes). The caller writes only the blobs that `sizes` did not find, so a row present
  already is rewritten only when two processes save the same new content at once: with the same size
  (a blob id is its content's hash) and the later `created_at`, which nothing reads. That is why it
  needs no IF NOT EXISTS.
- add_references writes the owner's references in one batch, a single mutation of one partition.
- add_deletions appends a row a blob id, naming the owner that released it, the rows sent as one
  unlogged batch (one request; a crash may leave some, which the release run again appends). A repeated
  release (after a crash between its deletions and its references' removal) appends them again at its
  own time, counted again as on the embedded store; the GC counts blob ids, not deletions, either way.
  Two releases of one blob in the same microsecond share a row (its key ends with the time), which names
  the later owner.
- remove_references deletes exactly the blob ids given, one statement in the owner's partition: a
  reference saved meanwhile, which has no deletion, is kept.
- blob_deletions is partitioned by (generation, shard): the deletions of one generation are its
  DELETION_SHARDS partitions, read without touching any other generation's.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence

from ...model import BlobId
from ..records import BlobDeletion, BlobReference, DeletionRow, DeletionSpan, GenerationStart, SizedBlob
from .schema import DELETION_SHARDS
from .store import CassandraStore

_IN_CHUNK = 100
# The most rows written as one batch: beyond, concurrent writes (Cassandra warns from ten partitions).
_BATCH_ROWS = 8


def shard_of(blob_id: BlobId | str) -> int:
    return zlib.crc32(str(blob_id).encode()) % DELETION_SHARDS


def _chunks(items: list, size: int = _IN_CHUNK) -> Iterable[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _write_all(store: CassandraStore, cql: str, parameter_sets: list[tuple]) -> None:
    """Run one write per parameter set: a few (a mail's two blobs) as one unlogged batch, a single
    request whose rows are applied partition by partition, no more atomic than separate writes; many
    (a clean-up's) concurrently, as a batch of many partitions would load its coordinator."""
    if len(parameter_sets) <= 1 or len(parameter_sets) > _BATCH_ROWS:
        store.execute_all(cql, parameter_sets)
        return
    store.batch(cql, parameter_sets)


class CassandraBlobTables:
    def __init__(self, store: CassandraStore) -> None:
        self.store = store

    # generations: an append-only event log of reference generations and GC iterations
    def current(self, kind: str) -> int | None:
        row = self.store.execute("SELECT number FROM generations WHERE kind = ? LIMIT 1", (kind,)).one()
        return None if row is None else row.number

    def emit(self, kind: str, number: int, now: int) -> bool:
        """Emit `number`; False if it was emitted already (another process's rotation got there first)."""
        return self.store.applied(
            "INSERT INTO generations (kind, number, started_at) VALUES (?, ?, ?) IF NOT EXISTS",
            (kind, number, now),
        ).applied

    def history(self, kind: str) -> list[GenerationStart]:
        rows = self.store.execute(
            "SELECT number, started_at FROM generations WHERE kind = ? ORDER BY number ASC", (kind,)
        )
        return [GenerationStart(row.number, row.started_at) for row in rows]

    # blobs
    def sizes(self, blob_ids: Iterable[BlobId]) -> dict[BlobId, int]:
        """The size of each blob that has a row in `blobs`."""
        by_name = {str(blob_id): blob_id for blob_id in blob_ids}
        results = self.store.execute_all(
            "SELECT blob_id, size FROM blobs WHERE blob_id IN ?",
            [(chunk,) for chunk in _chunks(list(by_name))],
        )
        return {by_name[row.blob_id]: row.size for rows in results for row in rows}

    def add_blobs(self, blobs: Sequence[SizedBlob], now: int) -> None:
        """Rows in `blobs` (see the module's docstring for a row present already)."""
        _write_all(
            self.store,
            "INSERT INTO blobs (blob_id, generation, size, created_at) VALUES (?, ?, ?, ?)",
            [(str(blob_id), blob_id.generation, size, now) for blob_id, size in blobs],
        )

    def forget(self, blob_ids: Iterable[BlobId]) -> None:
        """Drop collected blobs from `blob_deletions` and `blobs` (their content is already gone)."""
        blob_ids = list(blob_ids)
        self.store.execute_all(
            "DELETE FROM blob_deletions WHERE generation = ? AND shard = ? AND blob_id = ?",
            [(blob_id.generation, shard_of(blob_id), str(blob_id)) for blob_id in blob_ids],
        )
        self.store.execute_all(
            "DELETE FROM blobs WHERE blob_id = ?", [(str(blob_id),) for blob_id in blob_ids]
        )

    # blob_references
    def add_references(self, owner: str, blob_ids: Sequence[BlobId]) -> None:
        """The owner's references to the blobs; those present already are kept (rewritten as they were)."""
        if not blob_ids:
            return  # Cassandra refuses an empty batch
        # One partition: the batch is a single mutation, applied whole.
        self.store.batch(
            "INSERT INTO blob_references (owner, blob_id, generation) VALUES (?, ?, ?)",
            [(owner, str(blob_id), blob_id.generation) for blob_id in blob_ids],
        )

    def add_references_of(self, references: Sequence[tuple[str, Sequence[BlobId]]]) -> None:
        # A batch a partition, as `add_references` writes one.
        for owner, blob_ids in references:
            self.add_references(owner, blob_ids)

    def references_of(self, owner: str) -> list[BlobId]:
        rows = self.store.execute("SELECT blob_id FROM blob_references WHERE owner = ?", (owner,))
        return [BlobId.parse(row.blob_id) for row in rows]

    def referenced(self, blob_ids: Sequence[BlobId]) -> set[BlobId]:
        """Those of the blob ids with a reference, one indexed query a blob id, run concurrently."""
        by_name = {str(blob_id): blob_id for blob_id in blob_ids}
        results = self.store.execute_all(
            "SELECT blob_id FROM blob_references WHERE blob_id = ? LIMIT 1", [(name,) for name in by_name]
        )
        return {by_name[row.blob_id] for rows in results for row in rows}

    def references_to(self, blob_id: BlobId) -> list[BlobReference]:
        """The blob's references, by owner, through the blob id's index."""
        rows = self.store.execute(
            "SELECT owner, generation FROM blob_references WHERE blob_id = ?", (str(blob_id),)
        )
        return sorted(BlobReference(row.owner, row.generation) for row in rows)

    def remove_references(self, owner: str, blob_ids: Sequence[BlobId]) -> None:
        self.store.execute(
            "DELETE FROM blob_references WHERE owner = ? AND blob_id IN ?",
            (owner, [str(blob_id) for blob_id in blob_ids]),
        )

    # blob_deletions
    def add_deletions(self, owner: str, blob_ids: Sequence[BlobId], gc_iteration: int, now: int) -> None:
        """Append one deletion a blob id, in its generation's partitions."""
        _write_all(
            self.store,
            "INSERT INTO blob_deletions (generation, shard, blob_id, deleted_at, gc_iteration, owner) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [
                (blob_id.generation, shard_of(blob_id), str(blob_id), now, gc_iteration, owner)
                for blob_id in blob_ids
            ],
        )

    def retire_deletions(self, rows: Sequence[DeletionRow]) -> None:
        """Drop exactly these deletion rows, by their full primary key: a blob's other deletions stay."""
        self.store.execute_all(
            "DELETE FROM blob_deletions "
            "WHERE generation = ? AND shard = ? AND blob_id = ? AND deleted_at = ?",
            [
                (blob_id.generation, shard_of(blob_id), str(blob_id), deleted_at)
                for blob_id, deleted_at in rows
            ],
        )

    def deletions_of(self, blob_id: BlobId) -> list[BlobDeletion]:
        """The blob's deletions: one clustering range of one partition."""
        rows = self.store.execute(
            "SELECT deleted_at, gc_iteration, owner FROM blob_deletions "
            "WHERE generation = ? AND shard = ? AND blob_id = ?",
            (blob_id.generation, shard_of(blob_id), str(blob_id)),
        )
        return [BlobDeletion(row.deleted_at, row.gc_iteration, row.owner) for row in rows]

    def deletion_backlog(self, max_generation: int, newly_eligible_above: int, since: int) -> DeletionSpan:
        """The deletions of generations up to `max_generation` that were appended after `since`, or all
        of a generation above `newly_eligible_above`: summed over the partitions of those generations."""
        spans = [
            self._deletion_span(generation, shard, None if generation > newly_eligible_above else since)
            for generation, shard in self._deletion_partitions()
            if generation <= max_generation
        ]
        counted = [span for span in spans if span.count]
        if not counted:
            return DeletionSpan(0, None, None)
        return DeletionSpan(
            sum(span.count for span in counted),
            min(span.oldest for span in counted),
            max(span.newest for span in counted),
        )

    def _deletion_partitions(self) -> list:
        """The (generation, shard) rows of every partition: a few per generation, read from the partition
        keys."""
        return list(self.store.execute("SELECT DISTINCT generation, shard FROM blob_deletions"))

    def _deletion_span(self, generation: int, shard: int, after: int | None) -> DeletionSpan:
        """The deletions in one partition after `after` (all of them when None)."""
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
        return DeletionSpan(row[0], row[1], row[2])
