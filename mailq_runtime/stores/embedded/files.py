"""The embedded store's files: checked before SQLite touches them, created private and whole.

Mail is private, as in Postfix's queue: the data dir is 0700 and the store's files (`mailq.db`, SQLite's
`-wal` and `-shm`, which SQLite creates with the mode of `mailq.db`, and the writers' lock) are 0600,
whatever the umask; an older store found looser is tightened at open. A data dir or store file of another
user is refused, as Postfix refuses a queue directory it does not own: running as root would otherwise
leave files the owner cannot open, and running as another user would read someone else's mail.

A new store is built under a temporary name and linked into place, so `mailq.db` is never seen half made:
an empty (zero-byte) one is damage, refused like any other, never re-initialised.
"""

from __future__ import annotations

import os
import pwd
import sqlite3
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from ...errors import NoStore, StoreUnusable

DATABASE_FILE = "mailq.db"
PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
_DATA_DIR = "mailq data dir"
_STORE = "mailq store"
# SQLite's companions of a database in WAL mode, and the writers' lock (writers.py).
_COMPANIONS = ("-wal", "-shm", "-writer")
# The SQLite result codes (primary, so extended ones match by prefix) that mean the store's files or
# disk failed, as opposed to a statement mailq got wrong.
_FAILURES = (
    "SQLITE_FULL",
    "SQLITE_IOERR",
    "SQLITE_CORRUPT",
    "SQLITE_NOTADB",
    "SQLITE_READONLY",
    "SQLITE_CANTOPEN",
    "SQLITE_PERM",
    "SQLITE_BUSY",
    "SQLITE_NOLFS",
    "SQLITE_PROTOCOL",
)


def store_failure(path: Path, error: sqlite3.Error) -> StoreUnusable | None:
    """The error naming the store and its problem, if `error` is one of the store's files or disk."""
    name = getattr(error, "sqlite_errorname", None) or ""
    if not name.startswith(_FAILURES):
        return None
    if name.startswith("SQLITE_NOTADB"):
        problem = "not an SQLite database (damaged, or another kind of file)"
    elif name.startswith("SQLITE_CORRUPT"):
        problem = f"damaged ({error})"
    else:
        problem = str(error)
    return StoreUnusable(f"{_STORE} {path}: {problem}")


def prepare(
    data_dir: Path, create: bool, initialise: Callable[[sqlite3.Connection], None]
) -> tuple[Path, bool]:
    """Check the data dir and its store file and return the store's path, and whether this call made
    the store; with `create`, make what is missing (the data dir, then a store set up by `initialise`).
    Raises NoStore when there is no store and `create` is False, StoreUnusable when what is there cannot
    be used; nothing is written then. An existing store's modes are left to `make_private`, once SQLite
    has found it a mailq store."""
    path = data_dir / DATABASE_FILE
    created_dir = _check_data_dir(data_dir, create)
    try:
        found = _check_store_file(path, create)
        if not found:
            _create_store(path, initialise)
    except BaseException:
        if created_dir:
            _remove_created(data_dir, created_dir)
        raise
    return path, not found


def _no_store(data_dir: Path) -> NoStore:
    return NoStore(f"no mailq data in {data_dir}: nothing was enqueued there yet (check MAILQ_URL)")


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _stat(path: Path, what: str) -> os.stat_result | None:
    try:
        return path.stat()
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise StoreUnusable(f"{what} {path}: a part of its path is not a directory") from None
    except OSError as error:
        raise StoreUnusable(f"{what} {path} cannot be reached: {error.strerror}") from None


def _check_owner(path: Path, status: os.stat_result, what: str) -> None:
    running = os.geteuid()
    if status.st_uid != running:
        raise StoreUnusable(
            f"{what} {path} is owned by {_user(status.st_uid)}, not by {_user(running)} who runs mailq: "
            f"run mailq as its owner"
        )


def _check_writable(path: Path, status: os.stat_result, what: str, access: int) -> None:
    if os.statvfs(path).f_flag & os.ST_RDONLY:
        raise StoreUnusable(f"{what} {path} is on a read-only file system")
    if not os.access(path, access):
        raise StoreUnusable(
            f"{what} {path} is not writable by {_user(os.geteuid())} "
            f"(mode {stat.S_IMODE(status.st_mode):04o})"
        )


def check_data_dir(data_dir: Path) -> bool:
    """False if `data_dir` does not exist; StoreUnusable if it is not a directory that the running user
    owns and may write."""
    status = _stat(data_dir, _DATA_DIR)
    if status is None:
        return False
    if not stat.S_ISDIR(status.st_mode):
        raise StoreUnusable(f"{_DATA_DIR} {data_dir} is not a directory")
    _check_owner(data_dir, status, _DATA_DIR)
    _check_writable(data_dir, status, _DATA_DIR, os.R_OK | os.W_OK | os.X_OK)
    return True


def _check_data_dir(data_dir: Path, create: bool) -> Path | None:
    """Check the data dir, made if missing and `create`; returns the topmost directory it made, if any."""
    if check_data_dir(data_dir):
        return None
    if not create:
        raise _no_store(data_dir)
    created = _make_dirs(data_dir)
    check_data_dir(data_dir)
    return created


def _make_dirs(data_dir: Path) -> Path | None:
    topmost = data_dir
    while not topmost.parent.exists() and topmost.parent != topmost:
        topmost = topmost.parent
    try:
        data_dir.mkdir(mode=PRIVATE_DIR, parents=True)
    except FileExistsError:
        return None  # another process made it meanwhile: checked as found
    except OSError as error:
        raise StoreUnusable(f"cannot create {_DATA_DIR} {data_dir}: {error.strerror}") from None
    return topmost


def _remove_created(data_dir: Path, topmost: Path) -> None:
    # Only the empty directories this open made: another process may have put a store there meanwhile.
    directory = data_dir
    while True:
        try:
            directory.rmdir()
        except OSError:
            return
        if directory == topmost:
            return
        directory = directory.parent


def _check_store_file(path: Path, create: bool) -> bool:
    """Check the store file and its companions; False if there is none yet (and `create` allows one)."""
    status = _stat(path, _STORE)
    if status is None:
        if not create:
            raise _no_store(path.parent)
        return False
    if not stat.S_ISREG(status.st_mode):
        raise StoreUnusable(f"{_STORE} {path} is not a regular file")
    if status.st_size == 0:
        raise StoreUnusable(f"{_STORE} {path} is empty (0 bytes): restore it from a backup, or remove it")
    _check_owner(path, status, _STORE)
    _check_writable(path, status, _STORE, os.R_OK | os.W_OK)
    for suffix in _COMPANIONS:
        companion = path.with_name(path.name + suffix)
        companion_status = _stat(companion, _STORE)
        if companion_status is not None:
            _check_owner(companion, companion_status, _STORE)
    return True


def _create_store(path: Path, initialise: Callable[[sqlite3.Connection], None]) -> None:
    temporary = None
    try:
        descriptor, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".new")
        os.close(descriptor)
        temporary = Path(name)
        connection = sqlite3.connect(temporary, isolation_level=None)
        try:
            initialise(connection)
        finally:
            connection.close()
        # link() does not replace: if another process linked its store first, that one is used.
        try:
            os.link(temporary, path)
        except FileExistsError:
            pass
    except (OSError, sqlite3.Error) as error:
        problem = error.strerror if isinstance(error, OSError) else str(error)
        raise StoreUnusable(f"cannot create {_STORE} {path}: {problem}") from None
    finally:
        if temporary is not None:
            for suffix in ("", *_COMPANIONS):
                temporary.with_name(temporary.name + suffix).unlink(missing_ok=True)


def make_private(path: Path) -> None:
    """Tighten the data dir and the store's files to their owner, once the store is known to be one."""
    data_dir = path.parent
    for target, mode in (
        (data_dir, PRIVATE_DIR),
        (path, PRIVATE_FILE),
        *((path.with_name(path.name + suffix), PRIVATE_FILE) for suffix in _COMPANIONS),
    ):
        try:
            if stat.S_IMODE(target.stat().st_mode) != mode:
                target.chmod(mode)
        except FileNotFoundError:
            pass  # a companion SQLite has not made, or has just removed
        except OSError as error:
            raise StoreUnusable(f"cannot make {target} private to its owner: {error.strerror}") from None
