"""The embedded store's group commit: the turns of threads that wait for each other share one commit, a
member that fails undoes only its own writes, and no member returns before its writes are committed, or
returns at all when they are lost. Embedded-only, on the store itself."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from mailq_runtime.errors import StoreUnusable
from mailq_runtime.stores.embedded import EmbeddedStore


@pytest.fixture
def store(tmp_path) -> Iterator[EmbeddedStore]:
    store = EmbeddedStore(tmp_path / "data")
    with store.transaction() as db:
        db.execute("CREATE TABLE rows (name TEXT, content BLOB)")
    yield store
    store.close()


def _insert(store: EmbeddedStore, name: str, content: bytes = b"", then_fail: bool = False) -> None:
    with store.transaction() as db:
        db.execute("INSERT INTO rows VALUES (?, ?)", (name, content))
        if then_fail:
            raise ValueError(f"{name} fails after its insert")


def _committed(tmp_path) -> set[str]:
    """The rows another connection sees: only what was committed."""
    reader = sqlite3.connect(tmp_path / "data" / "mailq.db")
    try:
        return {name for (name,) in reader.execute("SELECT name FROM rows")}
    finally:
        reader.close()


def _while_others_wait(store: EmbeddedStore, members: dict[str, Callable[[], None]]) -> dict[str, object]:
    """Hold the turn until every member waits for it, write `held`, then end the turn: the members form one
    group with it. Returns each member's outcome, `held` included: None, or the exception it raised."""
    outcomes: dict[str, object] = {}

    def run(name: str, member: Callable[[], None]) -> None:
        try:
            member()
            outcomes[name] = None
        except Exception as error:
            outcomes[name] = error

    def hold() -> None:
        with store.turn():
            _insert(store, "held")
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + 10
            while store.turn().waiting < len(members):
                assert time.monotonic() < deadline, "the members never waited for the turn"
                time.sleep(0.001)

    threads = [threading.Thread(target=run, args=item) for item in members.items()]
    run("held", hold)
    for thread in threads:
        thread.join(10)
    return outcomes


def test_waiting_turns_share_one_commit(store, tmp_path):
    statements: list[str] = []
    store._connection.set_trace_callback(statements.append)
    outcomes = _while_others_wait(store, {name: lambda name=name: _insert(store, name) for name in "abc"})
    assert outcomes == {"held": None, "a": None, "b": None, "c": None}
    assert _committed(tmp_path) == {"held", "a", "b", "c"}
    assert statements.count("COMMIT") == 1
    assert statements.count("BEGIN IMMEDIATE") == 1


def test_a_failing_member_undoes_only_its_own_writes(store, tmp_path):
    outcomes = _while_others_wait(
        store,
        {
            "a": lambda: _insert(store, "a"),
            "b": lambda: _insert(store, "b", then_fail=True),
            "c": lambda: _insert(store, "c"),
        },
    )
    assert isinstance(outcomes["b"], ValueError)
    assert outcomes["held"] is None and outcomes["a"] is None and outcomes["c"] is None
    assert _committed(tmp_path) == {"held", "a", "c"}


def test_a_member_returns_only_if_its_writes_are_committed(store, tmp_path):
    # A store that fills up in the middle of a group: whatever SQLite keeps of the group, every member
    # that returned has its row committed, and every member whose row is not committed got an error.
    page_size = store.read_one("PRAGMA page_size")[0]
    used = store.read_one("PRAGMA page_count")[0]
    store._connection.execute(f"PRAGMA max_page_count={used + 8}")
    members = {"a": lambda: _insert(store, "a"), "big": lambda: _insert(store, "big", b"x" * page_size * 64)}
    members["c"] = lambda: _insert(store, "c")
    outcomes = _while_others_wait(store, members)
    committed = _committed(tmp_path)
    assert "big" not in committed and isinstance(outcomes["big"], StoreUnusable)
    for name in ("held", "a", "c"):
        assert (outcomes[name] is None) == (name in committed), (name, outcomes[name], committed)


def test_a_reader_in_a_group_returns_after_the_commit(store, tmp_path):
    # It may have read the group's uncommitted rows: it must not answer before they are durable.
    seen: list[int] = []

    def read() -> None:
        seen.append(store.read_one("SELECT COUNT(*) FROM rows")[0])
        seen.append(len(_committed(tmp_path)))

    outcomes = _while_others_wait(store, {"reader": read})
    assert outcomes == {"held": None, "reader": None}
    assert seen == [1, 1]


def _handed_over(store: EmbeddedStore, members: dict[str, Callable[[], object]]) -> dict[str, object]:
    """Run `held` in the turn (`in_turn`) until every member has handed its operation over, so that the
    holder runs them all in its own turn. Returns each one's outcome: its result, or the exception it
    raised."""
    outcomes: dict[str, object] = {}

    def run(name: str, member: Callable[[], object]) -> None:
        try:
            outcomes[name] = store.in_turn(member)
        except Exception as error:
            outcomes[name] = error

    def hold() -> str:
        _insert(store, "held")
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 10
        while len(store._combiner._pending) < len(members):
            assert time.monotonic() < deadline, "the members never handed their operations over"
            time.sleep(0.001)
        return "held"

    threads = [threading.Thread(target=run, args=item) for item in members.items()]
    run("held", hold)
    for thread in threads:
        thread.join(10)
    return outcomes


def _named(
    store: EmbeddedStore, name: str, content: bytes = b"", then_fail: bool = False
) -> Callable[[], str]:
    def insert() -> str:
        _insert(store, name, content, then_fail)
        return name

    return insert


def test_operations_handed_over_run_in_the_holders_turn_and_commit(store, tmp_path):
    statements: list[str] = []
    store._connection.set_trace_callback(statements.append)
    outcomes = _handed_over(store, {name: _named(store, name) for name in "abc"})
    assert outcomes == {"held": "held", "a": "a", "b": "b", "c": "c"}
    assert _committed(tmp_path) == {"held", "a", "b", "c"}
    assert statements.count("COMMIT") == 1
    assert statements.count("BEGIN IMMEDIATE") == 1


def test_a_failing_operation_handed_over_undoes_only_its_own_writes(store, tmp_path):
    outcomes = _handed_over(
        store,
        {"a": _named(store, "a"), "b": _named(store, "b", then_fail=True), "c": _named(store, "c")},
    )
    assert isinstance(outcomes["b"], ValueError)
    assert (outcomes["held"], outcomes["a"], outcomes["c"]) == ("held", "a", "c")
    assert _committed(tmp_path) == {"held", "a", "c"}


def test_an_operation_handed_over_returns_only_if_its_writes_are_committed(store, tmp_path):
    # As for the members of a group: the store fills up in the middle of the holder's turn, and SQLite
    # may roll back the writes of operations that ran before the one that failed.
    page_size = store.read_one("PRAGMA page_size")[0]
    used = store.read_one("PRAGMA page_count")[0]
    store._connection.execute(f"PRAGMA max_page_count={used + 8}")
    outcomes = _handed_over(
        store,
        {
            "a": _named(store, "a"),
            "big": _named(store, "big", b"x" * page_size * 64),
            "c": _named(store, "c"),
        },
    )
    committed = _committed(tmp_path)
    assert "big" not in committed and isinstance(outcomes["big"], StoreUnusable)
    for name in ("held", "a", "c"):
        assert (outcomes[name] == name) == (name in committed), (name, outcomes[name], committed)


def test_operations_past_the_group_limit_are_handed_back_and_run_in_turns_of_their_own(
    store, tmp_path, monkeypatch
):
    monkeypatch.setattr("mailq_runtime.stores.embedded.combining.GROUP_LIMIT", 1)
    statements: list[str] = []
    store._connection.set_trace_callback(statements.append)
    outcomes = _handed_over(store, {name: _named(store, name) for name in "abc"})
    assert outcomes == {"held": "held", "a": "a", "b": "b", "c": "c"}
    assert _committed(tmp_path) == {"held", "a", "b", "c"}
    assert statements.count("COMMIT") >= 2


def test_an_operation_run_in_the_turn_from_inside_the_turn_runs_at_once(store, tmp_path):
    # Another thread holds the hand-over and waits for the turn this thread holds: handing the operation
    # over to it would wait for ever.
    outcomes: dict[str, object] = {}
    other = threading.Thread(
        target=lambda: outcomes.setdefault("other", store.in_turn(_named(store, "other"))), daemon=True
    )

    def inside() -> None:
        with store.turn():
            other.start()
            deadline = time.monotonic() + 10
            while store.turn().waiting < 1:
                assert time.monotonic() < deadline, "the other thread never waited for the turn"
                time.sleep(0.001)
            outcomes["inner"] = store.in_turn(_named(store, "inner"))

    thread = threading.Thread(target=inside, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "the operation waited for the turn its own thread held"
    other.join(10)
    assert outcomes == {"inner": "inner", "other": "other"}
    assert _committed(tmp_path) == {"inner", "other"}


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The WAL syncs the store makes, by descriptor, each still made."""
    made: list[int] = []
    sync = os.fdatasync

    def counted(descriptor: int) -> None:
        made.append(descriptor)
        sync(descriptor)

    monkeypatch.setattr(os, "fdatasync", counted)
    return made


def _wal_synced(store: EmbeddedStore, syncs: list[int], tmp_path) -> bool:
    wal = os.stat(tmp_path / "data" / "mailq.db-wal")
    return bool(syncs) and all(os.fstat(fd).st_ino == wal.st_ino for fd in syncs)


def test_a_commit_is_synced_unless_it_promises_nothing(store, tmp_path, syncs):
    assert store._connection.execute("PRAGMA synchronous").fetchone() == (1,)  # NORMAL: the store syncs
    _insert(store, "acknowledged")
    assert len(syncs) == 1 and _wal_synced(store, syncs, tmp_path)
    with store.transaction(synced=False) as db:
        db.execute("INSERT INTO rows VALUES ('claimed', NULL)")
    assert len(syncs) == 1
    _insert(store, "next")
    assert len(syncs) == 2 and _committed(tmp_path) == {"acknowledged", "claimed", "next"}


def test_a_group_with_one_member_promising_durability_is_synced_once(store, tmp_path, syncs):
    def unsynced(name: str) -> None:
        with store.transaction(synced=False) as db:
            db.execute("INSERT INTO rows VALUES (?, NULL)", (name,))

    outcomes = _while_others_wait(store, {"a": lambda: unsynced("a"), "b": lambda: _insert(store, "b")})
    assert outcomes == {"held": None, "a": None, "b": None}
    assert len(syncs) == 1 and _committed(tmp_path) == {"held", "a", "b"}


def test_a_failed_sync_fails_every_member_of_its_group(store, tmp_path, monkeypatch):
    def failing(descriptor: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing)
    outcomes = _while_others_wait(store, {"a": lambda: _insert(store, "a")})
    assert isinstance(outcomes["held"], StoreUnusable) and isinstance(outcomes["a"], StoreUnusable)
    assert "syncing its WAL failed" in str(outcomes["a"])


@pytest.mark.parametrize("durability", ["power", "process"])
def test_the_weaker_durabilities_make_no_sync(tmp_path, syncs, durability):
    store = EmbeddedStore(tmp_path / "weaker", durability=durability)
    try:
        with store.transaction() as db:
            db.execute("CREATE TABLE rows (name TEXT)")
            db.execute("INSERT INTO rows VALUES ('a')")
    finally:
        store.close()
    assert syncs == []


def test_closing_twice_leaves_other_descriptors_alone(tmp_path):
    store = EmbeddedStore(tmp_path / "twice")
    with store.transaction() as db:
        db.execute("CREATE TABLE rows (name TEXT)")
    store.close()
    reused = os.open(tmp_path / "other", os.O_CREAT | os.O_RDWR)
    try:
        store.close()
        os.fstat(reused)
    finally:
        os.close(reused)


def _grouped(
    store: EmbeddedStore, items: dict[str, bytes], failing: str | None = None
) -> tuple[dict[str, object], list[list[str]]]:
    """Enqueue-like items through `in_group`: `held` holds the turn until every other item has been handed
    over, so the holder writes them in one call of the writer. Returns each one's outcome (its name, or
    the exception it raised) and the writer's calls, by the names they wrote."""
    outcomes: dict[str, object] = {}
    calls: list[list[str]] = []

    def write(names: list[str]) -> list[str]:
        calls.append(sorted(names))
        if names == ["held"]:
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + 10
            while len(store._combiner._pending) < len(items):
                assert time.monotonic() < deadline, "the items were never handed over"
                time.sleep(0.001)
        with store.transaction() as db:
            db.executemany("INSERT INTO rows VALUES (?, ?)", [(name, items.get(name, b"")) for name in names])
            if failing in names:
                raise ValueError(f"{failing} fails after its insert")
        return names

    def run(name: str) -> None:
        try:
            outcomes[name] = store.in_group(name, write)
        except Exception as error:
            outcomes[name] = error

    threads = [threading.Thread(target=run, args=(name,)) for name in items]
    run("held")
    for thread in threads:
        thread.join(10)
    return outcomes, calls


def test_items_handed_over_are_written_in_one_call_and_one_commit(store, tmp_path):
    statements: list[str] = []
    store._connection.set_trace_callback(statements.append)
    outcomes, calls = _grouped(store, dict.fromkeys("abc", b""))
    assert outcomes == {"held": "held", "a": "a", "b": "b", "c": "c"}
    assert calls == [["held"], ["a", "b", "c"]]
    assert _committed(tmp_path) == {"held", "a", "b", "c"}
    assert statements.count("COMMIT") == 1


def test_a_group_whose_call_fails_is_written_item_by_item_each_with_its_own_outcome(store, tmp_path):
    outcomes, calls = _grouped(store, dict.fromkeys("abc", b""), failing="b")
    assert calls[:2] == [["held"], ["a", "b", "c"]]
    assert sorted(calls[2:]) == [["a"], ["b"], ["c"]]
    assert isinstance(outcomes["b"], ValueError)
    assert (outcomes["held"], outcomes["a"], outcomes["c"]) == ("held", "a", "c")
    assert _committed(tmp_path) == {"held", "a", "c"}


def test_an_item_of_a_group_returns_only_if_its_writes_are_committed(store, tmp_path):
    # The store fills up in the group's call: SQLite may roll back the writes made before it, the holder's
    # own included, and every item hears of it or is written again alone.
    page_size = store.read_one("PRAGMA page_size")[0]
    used = store.read_one("PRAGMA page_count")[0]
    store._connection.execute(f"PRAGMA max_page_count={used + 8}")
    outcomes, _ = _grouped(store, {"a": b"", "big": b"x" * page_size * 64, "c": b""})
    committed = _committed(tmp_path)
    assert "big" not in committed and isinstance(outcomes["big"], StoreUnusable)
    for name in ("held", "a", "c"):
        assert (outcomes[name] == name) == (name in committed), (name, outcomes[name], committed)
