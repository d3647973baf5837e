"""The low-level blob store: put, get, delete and test content by blob id, with no notion of owners."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Protocol

from ..errors import BlobNotFound, InvalidInput
from ..model import BlobId
from ..stores.embedded.files import PRIVATE_DIR


class BlobStore(Protocol):
    def put(self, blob_id: BlobId | str, data: bytes) -> None: ...

    def get(self, blob_id: BlobId | str) -> bytes: ...

    def delete(self, blob_id: BlobId | str) -> bool:
        """Remove the content; True if it existed. Deleting a missing blob is not an error."""
        ...

    def exists(self, blob_id: BlobId | str) -> bool: ...

    def delete_many(self, blob_ids: Iterable[BlobId | str]) -> int:
        """Remove the content of every blob id; returns how many distinct ids were given. Every id is
        checked before anything is deleted; a missing blob is not an error (S3's DeleteObjects does not
        tell it apart either), so the count is of ids whose content is now gone, not of those that existed."""
        ...

    def list_ids(self, starting: str = "") -> Iterator[BlobId]:
        """Every stored blob id that starts with `starting` once, read page by page (the orphan sweep's
        input, which lists `g<generation>_<hex digit>` prefixes in parallel), in no promised order.
        Anything in the storage that is not a blob id this store wrote is left out."""
        ...


def distinct_ids(blob_ids: Iterable[BlobId | str]) -> list[BlobId]:
    """The ids of a batch operation, parsed all before any is used: a bad one changes nothing."""
    return list(dict.fromkeys(BlobId.parse(blob_id) for blob_id in blob_ids))


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

    def delete_many(self, blob_ids: Iterable[BlobId | str]) -> int:
        chosen = distinct_ids(blob_ids)
        for blob_id in chosen:
            self.delete(blob_id)
        return len(chosen)

    def list_ids(self, starting: str = "") -> Iterator[BlobId]:
        for generation in _entries(self.root):
            for shard in _entries(generation):
                for blob in _entries(shard):
                    name = f"{generation.name}_{blob.name}"
                    try:
                        blob_id = BlobId.parse(name)
                    except InvalidInput:
                        continue  # a put's temporary file, or something this store never wrote
                    if (
                        str(blob_id) == name
                        and name.startswith(starting)
                        and blob.name[:2] == shard.name
                        and blob.is_file()
                    ):
                        yield blob_id


def _entries(directory: Path) -> list[os.DirEntry]:
    try:
        return sorted(os.scandir(directory), key=lambda entry: entry.name)
    except (FileNotFoundError, NotADirectoryError):
        return []
