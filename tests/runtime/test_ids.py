"""Generated ids: unique, and in creation order even within one microsecond and across a fork."""

from __future__ import annotations

import os

from mailq_runtime import EnqueueId


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
