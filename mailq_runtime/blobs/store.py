"""The low-level blob store: put, get, delete and test content by blob id, with no notion of owners."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Protocol

from ..errors import BlobNotFound
from ..model import BlobId
from ..stores.embedded_files import PRIVATE_DIR


class BlobStore(Protocol):
    def put(self, blob_id: BlobId | str, data: bytes) -> None: ...

    def get(self, blob_id: BlobId | str) -> bytes: ...

    def delete(self, blob_id: BlobId | str) -> bool:
        """Remove the content; True if it existed. Deleting a missing blob is not an error."""
        ...

    def exists(self, blob_id: BlobId | str) -> bool: ...


class FileBlobStore:
    """Content-addressed files: `<root>/g<generation>/<hash[:2]>/<hash>`, written atomically. Mail is
    private: the directories are 0700 and the files 0600 (mkstemp's mode), whatever the umask."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
        root.chmod(PRIVATE_DIR)

    def _path(self, blob_id: BlobId | str) -> Path:
        # Parsing is the guard against path traversal: only g<digits>_<64 hex> ever reaches the filesystem.
        parsed = BlobId.parse(blob_id)
        return self.root / f"g{parsed.generation}" / parsed.hash[:2] / parsed.hash

    def put(self, blob_id: BlobId | str, data: bytes) -> None:
        path = self._path(blob_id)
        path.parent.parent.mkdir(mode=PRIVATE_DIR, exist_ok=True)
        path.parent.mkdir(mode=PRIVATE_DIR, exist_ok=True)
        # Temp file + rename: a reader sees either nothing or the whole content, never a torn write.
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".put-")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(temp, path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise

    def get(self, blob_id: BlobId | str) -> bytes:
        path = self._path(blob_id)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise BlobNotFound(f"blob {blob_id} not found in {self.root}") from None

    def delete(self, blob_id: BlobId | str) -> bool:
        try:
            self._path(blob_id).unlink()
            return True
        except FileNotFoundError:
            return False

    def exists(self, blob_id: BlobId | str) -> bool:
        return self._path(blob_id).is_file()
