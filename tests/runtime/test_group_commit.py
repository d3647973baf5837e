"""The embedded store's group commit: concurrent work shares commits, and a failing piece of work rolls
back alone while the rest of its group commits."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from mailq_runtime.stores.embedded import EmbeddedStore


@pytest.fixture
def store(tmp_path):
    opened = EmbeddedStore(tmp_path)
    opened._connection().execute("CREATE TABLE items (n INTEGER PRIMARY KEY)")
    yield opened
    opened.close()


def insert(store: EmbeddedStore, n: int) -> int:
    with store.transaction() as db:
        db.execute("INSERT INTO items VALUES (?)", (n,))
    if n % 7 == 0:
        raise ValueError(f"refused {n}")
    return n


def test_concurrent_work_commits_once_each_and_failures_roll_back_alone(store, tmp_path):
    results: dict[int, object] = {}

    def lane(start: int) -> None:
        for n in range(start, 400, 8):
            try:
                results[n] = store.atomically(lambda n=n: insert(store, n))
            except ValueError as error:
                results[n] = error

    threads = [threading.Thread(target=lane, args=(start,)) for start in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(results) == 400
    assert all(isinstance(results[n], ValueError) == (n % 7 == 0) for n in range(400))
    with sqlite3.connect(tmp_path / "mailq.db") as db:
        stored = {n for (n,) in db.execute("SELECT n FROM items")}
    assert stored == {n for n in range(400) if n % 7}


def test_work_inside_a_transaction_joins_it(store, tmp_path):
    with pytest.raises(RuntimeError):
        with store.transaction():
            store.atomically(lambda: insert(store, 1))
            raise RuntimeError("abort the outer transaction")
    with sqlite3.connect(tmp_path / "mailq.db") as db:
        assert db.execute("SELECT COUNT(*) FROM items").fetchone()[0] == 0
