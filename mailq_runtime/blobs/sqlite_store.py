"""Blob content inside the embedded store's SQLite file: for mail-sized blobs SQLite reads and writes
faster than one file per blob, and a put joins the caller's group of writes (one commit for a save)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from ..errors import BlobNotFound
from ..model import BlobId
from ..stores.embedded import EmbeddedStore
from .store import distinct_ids

#: Rows per page of `list_ids`: each page is one short read, so no read stays open between pages.
LIST_PAGE = 1000


class SqliteBlobStore:
    def __init__(self, store: EmbeddedStore) -> None:
        self.store = store

    def put(self, blob_id: BlobId | str, data: bytes) -> None:
        with self.store.transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO blob_content (blob_id, data) VALUES (?, ?)",
                (str(BlobId.parse(blob_id)), data),
            )

    def put_many(self, contents: Sequence[tuple[BlobId, bytes]]) -> None:
        with self.store.transaction() as db:
            db.executemany(
                "INSERT OR REPLACE INTO blob_content (blob_id, data) VALUES (?, ?)",
                [(str(blob_id), data) for blob_id, data in contents],
            )

    def get(self, blob_id: BlobId | str) -> bytes:
        row = self.store.read_one(
            "SELECT data FROM blob_content WHERE blob_id = ?", (str(BlobId.parse(blob_id)),)
        )
        if row is None:
            raise BlobNotFound(f"blob {blob_id} not found in {self.store.path}")
        return row[0]

    def delete(self, blob_id: BlobId | str) -> bool:
        with self.store.transaction() as db:
            deleted = db.execute("DELETE FROM blob_content WHERE blob_id = ?", (str(BlobId.parse(blob_id)),))
            return bool(deleted.rowcount)

    def exists(self, blob_id: BlobId | str) -> bool:
        row = self.store.read_one(
            "SELECT 1 FROM blob_content WHERE blob_id = ?", (str(BlobId.parse(blob_id)),)
        )
        return row is not None

    def delete_many(self, blob_ids: Iterable[BlobId | str]) -> int:
        chosen = distinct_ids(blob_ids)
        with self.store.transaction() as db:
            db.executemany("DELETE FROM blob_content WHERE blob_id = ?", [(str(b),) for b in chosen])
        return len(chosen)

    def list_ids(self, starting: str = "") -> Iterator[BlobId]:
        after = starting  # not an id itself: ids are longer than any prefix of theirs
        # Above every id that starts with `starting`: ids are ASCII, U+10FFFF sorts after all of it.
        before = starting + "\U0010ffff"
        while True:
            page = self.store.read(
                "SELECT blob_id FROM blob_content WHERE blob_id > ? AND blob_id < ? ORDER BY blob_id LIMIT ?",
                (after, before, LIST_PAGE),
            )
            for (blob_id,) in page:
                yield BlobId.parse(blob_id)
            if len(page) < LIST_PAGE:
                return
            after = page[-1][0]
