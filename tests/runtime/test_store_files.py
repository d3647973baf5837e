"""The embedded store's files: a damaged or unusable store is one StoreUnusable naming the place and the
problem, with nothing written; the data dir and the store's files are private to their owner whatever the
umask; a new store appears whole, even when processes create it at once; opening one writes nothing.
Embedded-only: these are the SQLite files of the embedded deployment, not the contract suite's backends."""

from __future__ import annotations

import os
import pwd
import re
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mailq_runtime import Runtime, StoreUnusable

from .backends import EmbeddedBackend
from .helpers import make_mail

NOBODY = pwd.getpwnam("nobody").pw_uid
ROOT_NAME = pwd.getpwuid(os.geteuid()).pw_name


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The usual umask, under which new files are readable by every user unless made private."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under `root` (and `root`) with its type, mode, owner and content: what a write changes."""
    paths = [root, *root.rglob("*")] if root.exists() else []
    return {
        str(path.relative_to(root)): (
            path.lstat().st_mode,
            path.lstat().st_uid,
            path.read_bytes() if path.is_file() else None,
        )
        for path in paths
    }


def a_store(data_dir: Path, mails: int = 50) -> Path:
    with Runtime.open(f"embedded://{data_dir}", create=True) as runtime:
        queue = runtime.queue("spool")
        for n in range(mails):
            queue.enqueue(make_mail(f"m{n}", body=os.urandom(2000).hex().encode()))
    return data_dir / "mailq.db"


def foreign_database(data: Path, script: str) -> None:
    data.mkdir()
    db = sqlite3.connect(data / "mailq.db")
    db.executescript(script)
    db.close()


def truncated(data: Path) -> None:
    store = a_store(data)
    os.truncate(store, store.stat().st_size // 2)


# Each: what to do to a data dir `data`, the path (in `data`) the error must name, the problem it must say.
DAMAGES: dict[str, tuple[Callable[[Path], object], str, str]] = {
    "garbage": (
        lambda data: a_store(data).write_bytes(os.urandom(8192)),
        "mailq.db",
        "not an SQLite database",
    ),
    "text": (lambda data: a_store(data).write_text("no\n" * 100), "mailq.db", "not an SQLite database"),
    "truncated": (truncated, "mailq.db", "damaged (database disk image is malformed)"),
    "header-cut": (lambda data: os.truncate(a_store(data), 50), "mailq.db", "damaged"),
    "zero-bytes": (lambda data: os.truncate(a_store(data), 0), "mailq.db", "is empty (0 bytes)"),
    "store-is-a-directory": (
        lambda data: (data / "mailq.db").mkdir(parents=True),
        "mailq.db",
        "is not a regular file",
    ),
    "data-dir-is-a-file": (lambda data: data.write_bytes(b"x"), ".", "is not a directory"),
    "foreign-database": (
        lambda data: foreign_database(data, "CREATE TABLE t (x);"),
        "mailq.db",
        "an SQLite database, but not a mailq store",
    ),
    "empty-database": (
        lambda data: foreign_database(data, "PRAGMA user_version = 1;"),
        "mailq.db",
        "not a mailq store",
    ),
    "data-dir-of-another-user": (
        lambda data: (a_store(data), os.chown(data, NOBODY, -1)),
        ".",
        f"is owned by nobody (uid {NOBODY}), not by {ROOT_NAME} (uid {os.geteuid()}) who runs mailq",
    ),
    "store-of-another-user": (
        lambda data: os.chown(a_store(data), NOBODY, -1),
        "mailq.db",
        f"is owned by nobody (uid {NOBODY})",
    ),
}


@pytest.mark.parametrize("case", list(DAMAGES))
def test_an_unusable_store_is_one_error_naming_it_and_nothing_is_written(tmp_path, case):
    damage, place, problem = DAMAGES[case]
    data = tmp_path / "data"
    damage(data)
    before = snapshot(tmp_path)
    for create in (True, False):
        with pytest.raises(StoreUnusable) as raised:
            Runtime.open(f"embedded://{data}", create=create)
        assert re.search(f"{re.escape(str((data / place).resolve()))}[: ]", str(raised.value))
        assert problem in str(raised.value)
        assert "\n" not in str(raised.value)
    assert snapshot(tmp_path) == before


def test_a_data_dir_under_a_file_is_refused_and_nothing_is_created(tmp_path):
    (tmp_path / "file").write_bytes(b"x")
    before = snapshot(tmp_path)
    with pytest.raises(StoreUnusable, match="a part of its path is not a directory"):
        Runtime.open(f"embedded://{tmp_path / 'file' / 'data'}", create=True)
    assert snapshot(tmp_path) == before


def test_a_full_disk_in_the_middle_of_an_enqueue_is_the_store_error_and_changes_nothing(tmp_path):
    backend = EmbeddedBackend(tmp_path / "data")
    runtime = backend.open()
    queue = runtime.queue("spool")
    queue.enqueue(make_mail("first"))
    before = backend.state()
    # SQLite's own limit on the file's pages: a real "database or disk is full", on the connection of the
    # runtime only, which its grouped writes hand out.
    with runtime.work.writes() as connection:
        (pages,) = connection.execute("PRAGMA page_count").fetchone()
        connection.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(StoreUnusable, match=r"mailq store .*mailq\.db: database or disk is full"):
        queue.enqueue(make_mail("big", body=os.urandom(200_000)))
    assert backend.state() == before
    with runtime.work.writes() as connection:
        connection.execute("PRAGMA max_page_count = 4294967294")  # the disk has room again
    queue.enqueue(make_mail("after"))
    assert [item.name for item in queue.browse()] == ["first", "after"]
    backend.close()


def modes(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): f"{stat.S_IMODE(path.stat().st_mode):04o}"
        for path in [root, *root.rglob("*")]
    }


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_a_new_store_is_private_to_its_owner_whatever_the_umask(tmp_path, umask):
    previous = os.umask(umask)
    try:
        with Runtime.open(f"embedded://{tmp_path / 'data'}", create=True) as runtime:
            runtime.queue("spool").enqueue(make_mail())
            # While it is open SQLite's companions exist: they take the mode of mailq.db; the writers'
            # lock is made private by mailq.
            assert modes(tmp_path / "data") == {
                ".": "0700",
                "mailq.db": "0600",
                "mailq.db-wal": "0600",
                "mailq.db-shm": "0600",
                "mailq.db-writer": "0600",
            }
    finally:
        os.umask(previous)


def test_an_older_store_readable_by_others_is_made_private_at_open(tmp_path, umask_022):
    data = tmp_path / "data"
    with Runtime.open(f"embedded://{data}", create=True) as runtime:
        runtime.queue("spool").enqueue(make_mail())
        data.chmod(0o755)
        for path in data.iterdir():
            path.chmod(0o644)
        with Runtime.open(f"embedded://{data}", create=False) as again:
            assert again.queue("spool").size() == 1
            assert set(modes(data).values()) == {"0700", "0600"} and modes(data)["."] == "0700"


_CREATE_AT_ONCE = """
import sys, time
from pathlib import Path
from mailq_runtime import Mail, Runtime
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.001)
with Runtime.open(sys.argv[1], create=True) as runtime:
    runtime.queue("spool").enqueue(Mail(recipients=("r@example.com",), message=b"Subject: x\\r\\n\\r\\nhi"))
"""


def test_processes_creating_one_store_at_once_all_use_the_same_whole_store(tmp_path):
    url, go = f"embedded://{tmp_path / 'data'}", tmp_path / "go"
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    creators = [
        subprocess.Popen(
            [sys.executable, "-c", _CREATE_AT_ONCE, url, str(go)],
            stderr=subprocess.PIPE,
            text=True,
            env=environment,
        )
        for _ in range(6)
    ]
    time.sleep(2)  # every interpreter started and waiting
    go.touch()
    errors = [creator.communicate(timeout=60)[1] for creator in creators]
    assert [creator.returncode for creator in creators] == [0] * 6, errors
    with Runtime.open(url, create=False) as runtime:
        assert runtime.queue("spool").size() == 6
    # The writers' lock stays: removed, it could let two processes lock two different files.
    assert sorted(path.name for path in (tmp_path / "data").iterdir()) == ["mailq.db", "mailq.db-writer"]


def test_opening_an_existing_store_writes_nothing_to_its_files(tmp_path):
    data = tmp_path / "data"
    a_store(data, mails=3)
    before = snapshot(tmp_path)
    with Runtime.open(f"embedded://{data}") as runtime:
        queue = runtime.queue("spool", create=False)
        assert queue.size() == 3 and len(list(queue.browse())) == 3
        assert runtime.configuration.history() and runtime.generations.current() == 1
    assert snapshot(tmp_path) == before
