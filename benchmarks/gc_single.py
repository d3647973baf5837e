"""James's BloomFilterGCAlgorithm in one Python process, the single-process peer of gc.py's Spark marks:
stream the generation's references into a Bloom filter (harness.NumpyBloom, vectorised), then test each
concerned blob. Embedded: from SQLite, a chunk of rowids a statement, with a plain version (fetchmany,
built-in hash) timed once for scale. Cassandra: with the cassandra-driver, one paged scan of
blob_references (the next page fetched while this one is hashed), then the generation's deletion
partitions.

Not a benchmark itself; imported by gc.py.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import numpy as np
from cassandra.cluster import EXEC_PROFILE_DEFAULT
from cassandra.query import tuple_factory
from deployments import Deployment
from gc_data import GENERATION
from harness import NumpyBloom

from mailq_runtime.stores.cassandra import CassandraStore
from mailq_runtime.stores.cassandra.schema import DELETION_SHARDS
from mailq_runtime.stores.embedded import DATABASE_FILE

_WIDTH = len(f"g{GENERATION}_") + 64


def single_process_mark(deployment: Deployment, expected: int, fpp: float) -> tuple[set[str], dict]:
    """The blob ids the filter does not contain, and the seconds of its stages (build, probe, total)."""
    if deployment.distributed:
        return _cassandra_mark(deployment.cassandra, expected, fpp)
    return _sqlite_mark(deployment.data_dir / DATABASE_FILE, expected, fpp)


_CHUNK_ROWIDS = 65_536


def _matrix(data: bytes, rows: int) -> np.ndarray:
    """The concatenated ids of one generation as an (n, width) matrix: a generation's ids all have the
    `g<generation>_<64 hex>` form of BlobId, so one width; anything else is refused, not misread."""
    if len(data) != rows * _WIDTH:
        raise ValueError(f"{rows} blob ids of generation {GENERATION} should take {rows * _WIDTH} bytes")
    return np.frombuffer(data, np.uint8).reshape(rows, _WIDTH)


def _sqlite_mark(database: Path, expected: int, fpp: float) -> tuple[set[str], dict]:
    """Fill the filter from the references, stream by stream, then keep the concerned blobs it does not
    contain. Each statement returns a chunk of rowids as one concatenated string (group_concat), so SQLite
    walks the rows in C and Python touches one object a chunk: 0.25 us a row against 0.6 us for fetchmany
    alone, before any hashing."""
    stages: dict[str, float] = {}
    start = time.perf_counter()
    bloom = NumpyBloom(expected, fpp)
    with closing(sqlite3.connect(f"{database.as_uri()}?mode=ro", uri=True)) as connection:
        connection.text_factory = bytes
        low, high = connection.execute("SELECT min(rowid), max(rowid) FROM blob_references").fetchone()
        for first in range(low or 0, (high or -1) + 1, _CHUNK_ROWIDS):
            rows, data = connection.execute(
                "SELECT count(*), group_concat(blob_id, '') FROM blob_references "
                "WHERE rowid >= ? AND rowid < ? AND generation = ?",
                (first, first + _CHUNK_ROWIDS, GENERATION),
            ).fetchone()
            if rows:
                bloom.put(bloom.hash_rows(_matrix(data, rows)))
        stages["build"] = time.perf_counter() - start
        rows, data = connection.execute(
            "SELECT count(*), group_concat(blob_id, '') FROM "
            "(SELECT DISTINCT blob_id FROM blob_deletions WHERE generation = ?)",
            (GENERATION,),
        ).fetchone()
    concerned = _matrix(data or b"", rows)
    absent = concerned[~bloom.might_contain(bloom.hash_rows(concerned))]
    stages["probe"] = time.perf_counter() - start - stages["build"]
    stages["total"] = time.perf_counter() - start
    return {row.tobytes().decode() for row in absent}, stages


def single_process_plain(deployment: Deployment, expected: int, fpp: float) -> tuple[int, dict]:
    """The straightforward version for scale: fetchmany, Python's hash of salt + id, the same numpy
    filter. Embedded only."""
    database = deployment.data_dir / DATABASE_FILE
    start = time.perf_counter()
    bloom = NumpyBloom(expected, fpp)
    salt = uuid.uuid4().hex

    def hashes(ids: list[tuple[str]]) -> np.ndarray:
        return np.fromiter((hash(salt + blob_id) for (blob_id,) in ids), np.int64, len(ids)).view(np.uint64)

    with closing(sqlite3.connect(f"{database.as_uri()}?mode=ro", uri=True)) as connection:
        cursor = connection.execute("SELECT blob_id FROM blob_references WHERE generation = ?", (GENERATION,))
        while batch := cursor.fetchmany(_CHUNK_ROWIDS):
            bloom.put(hashes(batch))
        build = time.perf_counter() - start
        concerned = connection.execute(
            "SELECT DISTINCT blob_id FROM blob_deletions WHERE generation = ?", (GENERATION,)
        ).fetchall()
    absent = int((~bloom.might_contain(hashes(concerned))).sum())
    total = time.perf_counter() - start
    return absent, {"build": build, "probe": total - build, "total": total}


_FETCH = 5_000


def _pages(store: CassandraStore, cql: str, parameters: tuple = ()) -> Iterator[list[tuple]]:
    """The rows of a statement page by page, the next page asked for before this one is handed over, so
    that the server and the driver's I/O thread work while the caller hashes."""
    statement = store.statement(cql).bind(parameters)
    statement.fetch_size = _FETCH
    profile = store.session.execution_profile_clone_update(EXEC_PROFILE_DEFAULT, row_factory=tuple_factory)
    future = store.session.execute_async(statement, execution_profile=profile)
    while True:
        rows = future.result().current_rows
        more = future.has_more_pages
        if more:
            future.start_fetching_next_page()
        yield rows
        if not more:
            return


def _id_matrix(ids: list[str]) -> np.ndarray:
    return _matrix("".join(ids).encode(), len(ids))


def _cassandra_mark(store: CassandraStore, expected: int, fpp: float) -> tuple[set[str], dict]:
    stages: dict[str, float] = {}
    start = time.perf_counter()
    bloom = NumpyBloom(expected, fpp)
    batch: list[str] = []
    for rows in _pages(store, "SELECT blob_id, generation FROM blob_references"):
        batch.extend(blob for blob, generation in rows if generation == GENERATION)
        if len(batch) >= 65_536:
            bloom.put(bloom.hash_rows(_id_matrix(batch)))
            batch = []
    if batch:
        bloom.put(bloom.hash_rows(_id_matrix(batch)))
    stages["build"] = time.perf_counter() - start
    concerned: set[str] = set()
    for shard in range(DELETION_SHARDS):
        cql = "SELECT blob_id FROM blob_deletions WHERE generation = ? AND shard = ?"
        for rows in _pages(store, cql, (GENERATION, shard)):
            concerned.update(blob for (blob,) in rows)
    ordered = sorted(concerned)
    absent = (
        {ordered[i] for i in np.flatnonzero(~bloom.might_contain(bloom.hash_rows(_id_matrix(ordered))))}
        if ordered
        else set()
    )
    stages["probe"] = time.perf_counter() - start - stages["build"]
    stages["total"] = time.perf_counter() - start
    return absent, stages
