"""Generated ids: unique, and in creation order even within one microsecond and across a fork. Blob ids:
one spelling each."""

from __future__ import annotations

import os

import pytest

from mailq_runtime import BlobId, EnqueueId, InvalidInput

HASH = "0123456789abcdef" * 4


def test_ids_of_one_microsecond_sort_in_creation_order():
    ids = [EnqueueId.generate(1_700_000_000_000_000) for _ in range(1000)]
    assert len(set(ids)) == 1000
    descents = sum(1 for a, b in zip(ids, ids[1:], strict=False) if a > b)
    assert descents <= 1  # in order, but for the counter wrapping (once in 2**64)


def test_a_forked_child_does_not_repeat_its_parents_ids():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next id and leave without running any test machinery
        os.write(write, EnqueueId.generate(1).encode())
        os._exit(0)
    os.close(write)
    child_id = os.read(read, 64).decode()
    os.waitpid(pid, 0)
    os.close(read)
    assert child_id != EnqueueId.generate(1)


@pytest.mark.parametrize("text", [f"g0_{HASH}", f"g1_{HASH}", f"g10_{HASH}", f"g{10**18 - 1}_{HASH}"])
def test_a_blob_id_has_one_spelling_that_round_trips(text):
    parsed = BlobId.parse(text)
    assert str(parsed) == text
    generation, digest = text[1:].split("_")
    built = BlobId(int(generation), digest)
    assert (parsed, hash(parsed), parsed <= built, {parsed: 1}[built]) == (built, hash(built), True, 1)


@pytest.mark.parametrize(
    "text", [f"g01_{HASH}", f"g{10**18}_{HASH}", f"g1_{HASH.upper()}", f"g1_{HASH}0", "g1_"]
)
def test_a_blob_id_spelled_otherwise_is_refused(text):
    with pytest.raises(InvalidInput, match="invalid blob id"):
        BlobId.parse(text)


@pytest.mark.parametrize(
    ("generation", "digest"), [(-1, HASH), (10**18, HASH), (True, HASH), (1.0, HASH), (1, HASH.upper())]
)
def test_a_blob_id_that_would_not_round_trip_cannot_be_built(generation, digest):
    with pytest.raises(InvalidInput, match="invalid blob"):
        BlobId(generation, digest)
