"""One contract for every BlobStore (file system, SQLite, S3): put, get, exists, delete, delete_many and
list_ids behave the same, a missing blob is BlobNotFound, an id that is not a blob id changes nothing."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from mailq_runtime import BlobNotFound, InvalidInput
from mailq_runtime.blobs.s3_store import MULTIPART_THRESHOLD

from .conftest import blob_id


def test_put_then_get(store):
    content = b"hello \x00 world"
    store.put(blob_id(content), content)
    assert store.get(blob_id(content)) == content
    assert store.get(str(blob_id(content))) == content
    assert store.exists(blob_id(content))
    assert list(store.list_ids()) == [blob_id(content)]


def test_empty_content(store):
    store.put(blob_id(b""), b"")
    assert store.get(blob_id(b"")) == b""
    assert store.exists(blob_id(b""))


def test_a_blob_above_the_multipart_threshold(store):
    large = os.urandom(MULTIPART_THRESHOLD + 1024 * 1024 + 1)
    store.put(blob_id(large), large)
    assert store.get(blob_id(large)) == large


def test_put_is_idempotent(store):
    content = b"written twice"
    store.put(blob_id(content), content)
    store.put(blob_id(content), content)
    assert store.get(blob_id(content)) == content
    assert list(store.list_ids()) == [blob_id(content)]


def test_a_missing_blob_is_not_found(store):
    missing = blob_id(b"never put")
    with pytest.raises(BlobNotFound, match=str(missing)):
        store.get(missing)
    assert not store.exists(missing)


def test_delete_says_whether_the_blob_existed(store):
    content = b"short-lived"
    store.put(blob_id(content), content)
    assert store.delete(blob_id(content)) is True
    assert store.delete(blob_id(content)) is False
    assert store.delete(blob_id(b"never put")) is False
    with pytest.raises(BlobNotFound):
        store.get(blob_id(content))
    assert list(store.list_ids()) == []


def test_generations_are_distinct_blobs(store):
    content = b"same content"
    store.put(blob_id(content, 1), content)
    assert not store.exists(blob_id(content, 2))
    store.put(blob_id(content, 2), content)
    store.delete(blob_id(content, 1))
    assert store.get(blob_id(content, 2)) == content
    assert list(store.list_ids()) == [blob_id(content, 2)]


def test_delete_many_counts_the_distinct_ids_given(store):
    contents = [f"blob {n}".encode() for n in range(5)]
    for content in contents:
        store.put(blob_id(content), content)
    doomed = [blob_id(c) for c in contents[:3]]
    given = [*doomed, str(doomed[0]), blob_id(b"never put")]
    assert store.delete_many(given) == 4
    assert sorted(store.list_ids()) == sorted(blob_id(c) for c in contents[3:])
    assert not any(store.exists(b) for b in doomed)
    assert store.delete_many(given) == 4
    assert store.delete_many([]) == 0
    assert sorted(store.list_ids()) == sorted(blob_id(c) for c in contents[3:])


def test_list_ids_and_delete_many_go_past_a_thousand_blobs(store):
    """More than one page of list_ids and one batch of delete_many (1000 each on S3 and SQLite)."""
    contents = [f"blob {n}".encode() for n in range(1100)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda content: store.put(blob_id(content, 1 + len(content) % 3), content), contents))
    ids = [blob_id(content, 1 + len(content) % 3) for content in contents]
    listed = list(store.list_ids())
    assert len(listed) == len(set(listed)) == len(ids)
    assert set(listed) == set(ids)
    assert store.delete_many(ids[:1050]) == 1050
    assert sorted(store.list_ids()) == sorted(ids[1050:])


def test_a_store_is_shared_by_threads(store):
    contents = [os.urandom(10 * 1024) for _ in range(64)]

    def round_trip(content: bytes) -> bool:
        store.put(blob_id(content), content)
        return store.get(blob_id(content)) == content and store.exists(blob_id(content))

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(round_trip, contents))
    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(lambda content: store.delete(blob_id(content)), contents))
    assert list(store.list_ids()) == []


@pytest.mark.parametrize(
    "bad_id",
    [
        "../../etc/passwd",
        "g1_../../../../tmp/x",
        "g1_" + "a" * 63 + "/",
        "g1_" + "A" * 64,
        "g-1_" + "a" * 64,
        "g01_" + "a" * 64,  # one spelling per blob: no leading zeros
        "g00_" + "a" * 64,
        "g" + "9" * 19 + "_" + "a" * 64,
        "/g1_" + "a" * 64,
        "g1_" + "a" * 64 + "\x00",
        "",
        None,
        42,
    ],
)
def test_an_id_that_is_not_a_blob_id_changes_nothing(store, bad_id):
    kept = blob_id(b"kept")
    store.put(kept, b"kept")
    before = store.everything_stored()
    for operation in (
        lambda: store.put(bad_id, b"x"),
        lambda: store.get(bad_id),
        lambda: store.delete(bad_id),
        lambda: store.exists(bad_id),
        lambda: store.delete_many([kept, bad_id]),
    ):
        with pytest.raises(InvalidInput, match="invalid blob id"):
            operation()
    assert store.everything_stored() == before
    assert list(store.list_ids()) == [kept]


def test_list_ids_starting_with_a_prefix_lists_exactly_those(store):
    """The orphan sweep lists `g<generation>_<hex digit>` prefixes in parallel: together they are the
    generation's blobs, each once, and no other."""
    contents = [f"blob {n}".encode() for n in range(60)]
    for content in contents:
        store.put(blob_id(content, 1 + len(content) % 2), content)
        store.put(blob_id(content, 12), content)  # g12_ starts like g1
    first_generation = {blob_id(c, 1) for c in contents if 1 + len(c) % 2 == 1}
    by_digit = [list(store.list_ids(f"g1_{digit}")) for digit in "0123456789abcdef"]
    listed = [b for part in by_digit for b in part]
    assert len(listed) == len(set(listed))
    assert set(listed) == first_generation == set(store.list_ids("g1_"))
    assert len(set(store.list_ids("g12_"))) == len(contents)
    assert list(store.list_ids("g99_")) == []
