"""Blob content inside the embedded store's SQLite file: for mail-sized blobs SQLite reads and writes
faster than one file per blob, and a put joins the caller's group of writes (one commit for a save)."""

from __future__ import annotations

from ..errors import BlobNotFound
from ..model import BlobId
from ..stores.embedded import EmbeddedStore


class SqliteBlobStore:
    def __init__(self, store: EmbeddedStore) -> None:
        self.store = store

    def put(self, blob_id: BlobId | str, data: bytes) -> None:
        with self.store.transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO blob_content (blob_id, data) VALUES (?, ?)",
                (str(BlobId.parse(blob_id)), data),
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
