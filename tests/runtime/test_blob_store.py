"""What the SQLite blob store adds to the contract of every store (tests/blobs): a put that dies half-way
leaves nothing torn behind."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from mailq_runtime import BlobId, BlobNotFound
from mailq_runtime.blobs.sqlite_store import SqliteBlobStore
from mailq_runtime.stores.embedded.store import EmbeddedStore, _Transaction


def blob_id(content: bytes, generation: int = 1) -> BlobId:
    return BlobId(generation, hashlib.sha256(content).hexdigest())


class Crash(Exception):
    """The process dying half-way through a put."""


@pytest.fixture
def store(tmp_path, monkeypatch) -> Iterator:
    """The store under test, with `.crash_next_put()`: a context in which a put dies after writing."""
    embedded = EmbeddedStore(tmp_path / "db")
    blobs = SqliteBlobStore(embedded)
    exit_transaction = _Transaction.__exit__

    def crash_before_commit(self, kind, error, trace):
        exit_transaction(self, Crash, Crash(), None)  # the commit never happens: rolled back
        raise Crash("died before committing")

    @contextmanager
    def crash_next_put():
        monkeypatch.setattr(_Transaction, "__exit__", crash_before_commit)
        try:
            yield
        finally:
            monkeypatch.setattr(_Transaction, "__exit__", exit_transaction)

    blobs.crash_next_put = crash_next_put
    yield blobs
    embedded.close()


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_put_that_dies_leaves_nothing_behind(store, tmp_path):
    content = b"never stored"
    before = tree(tmp_path)
    with store.crash_next_put(), pytest.raises(Crash):
        store.put(blob_id(content), content)
    assert not store.exists(blob_id(content))
    with pytest.raises(BlobNotFound):
        store.get(blob_id(content))
    new_files = set(tree(tmp_path)) - set(before)
    assert not [
        f for f in new_files if Path(tmp_path, f).is_file() and not f.endswith(("-wal", "-shm", "-writer"))
    ]


def test_a_put_that_dies_keeps_the_previous_content(store):
    target = blob_id(b"the id")
    store.put(target, b"first")
    with store.crash_next_put(), pytest.raises(Crash):
        store.put(target, b"second, never complete")
    assert store.get(target) == b"first"


def test_a_reader_never_sees_a_torn_write(store):
    target = blob_id(b"contended")
    versions = [bytes([n]) * (256 * 1024) for n in (1, 2)]
    store.put(target, versions[0])
    stop = threading.Event()
    errors = []

    def rewrite():
        n = 0
        while not stop.is_set() and n < 200:
            n += 1
            store.put(target, versions[n % 2])

    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        for _ in range(200):
            if store.get(target) not in versions:
                errors.append("torn")
    finally:
        stop.set()
        writer.join(30)
    assert not errors
