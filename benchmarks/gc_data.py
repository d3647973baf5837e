"""The data of the GC benchmark (gc.py), the same shape on both deployments: R references of generation 1
over 0.75 R live blobs (two blobs an owner, a third of the blobs shared by two owners), D deletions of
generation 1 of which half name a blob still referenced by another owner and half garbage (a tenth of the
garbage deleted twice, by two owners).

Embedded, it is generated inside SQLite, with the blobs of both and the current generation at 3, so
generation 1 is eligible. On Cassandra it is loaded with concurrent prepared inserts; the blobs table and
the content are not written there, as no method reads them to find the garbage. Content is never deleted,
so every method sees the same data.

Not a benchmark itself; imported by gc.py.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from deployments import Deployment
from harness import SEQUENCE, bulk_connection, insert, load

from mailq_runtime.stores.cassandra import CassandraStore
from mailq_runtime.stores.cassandra.blobs import shard_of

GENERATION = 1
CURRENT_GENERATION = 3
# Multipliers of the pseudo-random permutations below: primes, so coprime with any size they don't divide.
# Reference i names live blob (i * _SPREAD) % live, every one at least once.
_SPREAD = 1_000_003
_SHUFFLE = 999_983
_T0 = 1_700_000_000_000_000  # microseconds: the tables' time unit


@dataclass(frozen=True)
class Dataset:
    references: int
    deletions: int
    live_blobs: int  # distinct blobs the references name
    live_deleted: int  # concerned blobs still referenced
    garbage: int  # concerned blobs no longer referenced: what an exact mark finds
    garbage_ids: frozenset[str] | None  # the garbage's ids where the generation knows them (Cassandra)
    seconds: dict[str, float]  # generation (embedded) or load (Cassandra), per table

    @property
    def blobs(self) -> int:
        return self.live_blobs + self.garbage

    @property
    def concerned(self) -> int:
        return self.live_deleted + self.garbage


def generate(deployment: Deployment, references: int, deletions: int) -> Dataset:
    if deployment.distributed:
        return _in_cassandra(deployment.cassandra, references, deletions)
    return _in_sqlite(deployment.data_dir, references, deletions)


def blob_id(slot: int) -> str:
    """The id of blob `slot` as BlobId makes them (generation, then 64 hex digits of a hash)."""
    return f"g{GENERATION}_{hashlib.sha256(slot.to_bytes(8, 'big')).hexdigest()}"


def _in_sqlite(path: Path, references: int, deletions: int) -> Dataset:
    """All rows by INSERT ... SELECT inside SQLite (one transaction a table): per row, Python would cost
    more than the B-tree inserts, which are what generation time is made of."""
    live = references * 3 // 4
    live_deleted = deletions // 10 * 5 + min(deletions % 10, 5)
    garbage = deletions // 10 * 4 + max(deletions % 10 - 5, 0)
    blobs = live + garbage
    if not 0 < live_deleted <= live or references < 2:
        raise SystemExit("need at least 2 references and at most 1.5x as many deletions as references")
    if live % _SPREAD == 0 or blobs % _SHUFFLE == 0:
        raise SystemExit("pick sizes that the permutation primes do not divide")
    # Blob slot x (live: x < live; garbage: live <= x < blobs) lives at rowid (x * _SHUFFLE) % blobs + 1,
    # so live and garbage blobs interleave at random in the id order and in the table.
    slot = f"((%s) * {_SHUFFLE} %% {blobs} + 1)"
    seconds: dict[str, float] = {}
    print(f"generating {references:,} references, {deletions:,} deletions, {blobs:,} blobs ...")
    with bulk_connection(path) as db:
        db.executemany(
            "INSERT INTO generations (kind, number, started_at) VALUES (?, ?, ?)",
            [
                (kind, number, _T0 + number * 86_400_000_000)
                for kind in ("reference_generation", "gc_iteration")
                for number in range(1, CURRENT_GENERATION + 1)
            ],
        )
        # Inserted in id order (the sort is cheaper than random inserts into the primary key's index); the
        # rowid is then the rank of the id, and the slot permutation above decides live or garbage.
        seconds["blobs"] = insert(
            db,
            "blobs",
            "INSERT INTO blobs (blob_id, generation, size, created_at) SELECT * FROM ("
            f"SELECT 'g{GENERATION}_' || lower(hex(randomblob(32))) AS blob_id, {GENERATION}, "
            f"1024 + abs(random()) % 65536, {_T0} + i FROM {SEQUENCE}) ORDER BY blob_id",
            n=blobs,
        )
        # Owner i/2 holds the references 2(i/2) and 2(i/2)+1: a message's header and body. Reference i
        # names live slot (i * _SPREAD) % live: every live blob once, a third of them twice (deduplicated
        # content), in an order unrelated to the ids.
        seconds["blob_references"] = insert(
            db,
            "blob_references",
            "INSERT INTO blob_references (owner, blob_id, generation) "
            "SELECT printf('%032x', i / 2), "
            f"(SELECT blob_id FROM blobs WHERE rowid = {slot % f'i * {_SPREAD} % {live}'}), {GENERATION} "
            f"FROM {SEQUENCE}",
            n=references,
        )
        # Deletions in groups of ten: five name live blobs spread over all of them (another owner still
        # holds a reference), five name four garbage blobs (the last one released by two owners).
        stride = live // live_deleted
        deleted_slot = (
            f"CASE WHEN i % 10 < 5 THEN (i / 10 * 5 + i % 10) * {stride} "
            f"ELSE {live} + i / 10 * 4 + min(i % 10 - 5, 3) END"
        )
        seconds["blob_deletions"] = insert(
            db,
            "blob_deletions",
            "INSERT INTO blob_deletions (blob_id, generation, deleted_at, gc_iteration) "
            f"SELECT (SELECT blob_id FROM blobs WHERE rowid = {slot % deleted_slot}), {GENERATION}, "
            f"{_T0 + 2 * 86_400_000_000} + i * 1000, 2 + i % 2 FROM {SEQUENCE}",
            n=deletions,
        )
    print(f"generated in {sum(seconds.values()):.1f} s")
    return Dataset(references, deletions, live, live_deleted, garbage, None, seconds)


def _in_cassandra(store: CassandraStore, references: int, deletions: int) -> Dataset:
    live = references * 3 // 4
    live_deleted = deletions // 10 * 5 + min(deletions % 10, 5)
    if not 0 < live_deleted <= live or live % _SPREAD == 0:
        raise SystemExit("need at least 2 references and at most 1.5x as many deletions as references")
    stride = live // live_deleted
    print(f"loading {references:,} references and {deletions:,} deletions ...")
    seconds = {
        "blob_references": load(
            store,
            "blob_references",
            "INSERT INTO blob_references (owner, blob_id, generation) VALUES (?, ?, ?)",
            ((f"{i // 2:032x}", blob_id(i * _SPREAD % live), GENERATION) for i in range(references)),
        )
    }
    # In groups of ten: five name live blobs spread over all of them, five name four garbage blobs (the
    # last one released by two owners).
    deleted = [
        (i // 10 * 5 + i % 10) * stride if i % 10 < 5 else live + i // 10 * 4 + min(i % 10 - 5, 3)
        for i in range(deletions)
    ]
    ids = [blob_id(slot) for slot in deleted]
    seconds["blob_deletions"] = load(
        store,
        "blob_deletions",
        "INSERT INTO blob_deletions (generation, shard, blob_id, deleted_at, gc_iteration) "
        "VALUES (?, ?, ?, ?, ?)",
        ((GENERATION, shard_of(ids[i]), ids[i], _T0 + i * 1000, 2 + i % 2) for i in range(deletions)),
    )
    garbage = frozenset(ids[i] for i, slot in enumerate(deleted) if slot >= live)
    return Dataset(references, deletions, live, live_deleted, len(garbage), garbage, seconds)
