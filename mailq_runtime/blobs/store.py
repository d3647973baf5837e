"""The low-level blob store: put, get, delete and test content by blob id, with no notion of owners."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

from ..model import BlobId


class BlobStore(Protocol):
    def put(self, blob_id: BlobId | str, data: bytes) -> None: ...

    def put_many(self, contents: Sequence[tuple[BlobId, bytes]]) -> None:
        """`put` each content: a store may write them in one call."""
        ...

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
