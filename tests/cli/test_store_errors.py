"""A damaged or unusable store on the command line: one `mailq: error: ...` line naming the place and the
problem, exit status 2, nothing written. The permission cases run the command as the user nobody (root
would pass every permission check), the read-only one on a read-only bind mount, the full disk on a
small tmpfs, both in a mount namespace of their own (`unshare -m`), so nothing outlives the test."""

from __future__ import annotations

import io
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from mailq_cli.main import main
from tests.runtime.test_store_files import DAMAGES, a_store, snapshot

NOBODY = pwd.getpwnam("nobody")
ME = pwd.getpwuid(os.geteuid())
WORKTREE = Path(__file__).resolve().parents[2]
SENDER, RECIPIENT = "alice@example.com", "bob@example.org"
MESSAGE = b"From: alice@example.com\r\nSubject: hello\r\n\r\nHello.\r\n"


def assert_one_line(result: tuple[int, str, str], *words: str) -> None:
    status, out, err = result
    assert (status, out) == (2, ""), result
    assert err.startswith("mailq: error: ") and err.count("\n") == 1 and err.endswith("\n"), err
    for word in words:
        assert word in err, err


def mailq(*argv: str, command: Callable[[list[str]], int] = main) -> tuple[int, str, str]:
    """`mailq ARGV` in this process; returns the exit status, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = command(list(argv))
    return status, out.getvalue(), err.getvalue()


def mailq_as_nobody(*argv: str) -> tuple[int, str, str]:
    """`mailq ARGV` in a forked child that became the user nobody, for whom the kernel enforces the
    permissions root bypasses. (A child forked from this interpreter, since nobody cannot start this
    interpreter from where it is installed.)"""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(NOBODY.pw_gid)
            os.setuid(NOBODY.pw_uid)
            result = mailq(*argv)
        except BaseException as error:  # reported to the parent: the child must never return into pytest
            result = (70, "", f"the child failed: {error!r}")
        os.write(write_end, json.dumps(result).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        payload = reader.read()
    os.waitpid(child, 0)
    return tuple(json.loads(payload))


@pytest.fixture
def eml(tmp_path: Path) -> Path:
    path = tmp_path / "hello.eml"
    path.write_bytes(MESSAGE)
    path.chmod(0o644)
    return path


def enqueue_args(url: str, eml: Path) -> list[str]:
    return ["--url", url, "enqueue", "spool", str(eml), "--sender", SENDER, "--rcpt", RECIPIENT]


COMMANDS = {
    "size": ["size", "spool"],
    "queues": ["queues"],
    "enqueue": None,  # enqueue_args
    "worker": ["worker", "--domain", "example.org", "--idle-exit", "0"],
    "config-show": ["config", "show"],
    "config-set": ["config", "set", "--pace", "7"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("case", list(DAMAGES))
def test_an_unusable_store_is_one_line_exit_2_and_nothing_written(tmp_path, eml, case, command):
    damage, place, problem = DAMAGES[case]
    data = tmp_path / "data"
    damage(data)
    before = snapshot(data)
    url = f"embedded://{data}"
    argv = enqueue_args(url, eml) if COMMANDS[command] is None else ["--url", url, *COMMANDS[command]]
    assert_one_line(mailq(*argv), str((data / place).resolve()), problem)
    assert snapshot(data) == before


@pytest.mark.parametrize(
    "command", [["gc"], ["counters", "recompute"], ["queue", "cleanup"], ["generation", "rotate"]]
)
@pytest.mark.parametrize(
    "case", ["garbage", "zero-bytes", "store-is-a-directory", "data-dir-of-another-user"]
)
def test_the_pipeline_commands_refuse_an_unusable_store_in_one_line_before_they_start(
    tmp_path, case, command
):
    damage, place, problem = DAMAGES[case]
    data = tmp_path / "data"
    damage(data)
    before = snapshot(data)
    result = mailq("--url", f"embedded://{data}", *command)
    assert_one_line(result, str((data / place).resolve()), problem)
    assert snapshot(data) == before


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every user can reach (pytest's own temporary directories are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="mailq-users-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@pytest.fixture
def shared_eml(shared: Path) -> Path:
    path = shared / "hello.eml"
    path.write_bytes(MESSAGE)
    path.chmod(0o644)
    return path


def nobodys(path: Path, mode: int) -> Path:
    os.chown(path, NOBODY.pw_uid, NOBODY.pw_gid)
    path.chmod(mode)
    return path


def test_nobody_uses_its_own_store(shared, shared_eml):
    """The control: what the cases below refuse is their condition, not nobody as such."""
    data = shared / "data"
    data.mkdir()
    nobodys(data, 0o700)
    url = f"embedded://{data}"
    assert mailq_as_nobody(*enqueue_args(url, shared_eml))[0] == 0
    assert mailq_as_nobody("--url", url, "size", "spool")[:2] == (0, "spool: 1 mails\n")
    assert {path.stat().st_uid for path in data.iterdir()} == {NOBODY.pw_uid}


def test_a_data_dir_of_another_user_is_refused_saying_who_owns_it(shared, shared_eml):
    data = shared / "data"
    a_store(data)  # root's, 0700 like every data dir
    before = snapshot(data)
    for argv in (
        ["--url", f"embedded://{data}", "size", "spool"],
        enqueue_args(f"embedded://{data}", shared_eml),
    ):
        assert_one_line(
            mailq_as_nobody(*argv),
            f"mailq data dir {data} is owned by {ME.pw_name} (uid {ME.pw_uid}), "
            f"not by nobody (uid {NOBODY.pw_uid})",
        )
    assert snapshot(data) == before


def test_a_read_only_data_dir_is_refused_and_no_wal_or_shm_is_created(shared, shared_eml):
    data = shared / "data"
    a_store(data)
    for path in [data, *data.iterdir()]:
        os.chown(path, NOBODY.pw_uid, NOBODY.pw_gid)
    data.chmod(0o500)
    before = snapshot(data)
    for argv in (
        ["--url", f"embedded://{data}", "size", "spool"],
        enqueue_args(f"embedded://{data}", shared_eml),
    ):
        assert_one_line(
            mailq_as_nobody(*argv), f"mailq data dir {data} is not writable by nobody", "(mode 0500)"
        )
    assert snapshot(data) == before
    # The store's own writers' lock, made by its first write (a_store): no SQLite -wal or -shm.
    assert sorted(path.name for path in data.iterdir()) == ["mailq.db", "mailq.db-writer"]


def test_a_read_only_store_file_is_refused(shared):
    data = shared / "data"
    store = a_store(data)
    os.chown(data, NOBODY.pw_uid, NOBODY.pw_gid)
    nobodys(store, 0o400)
    before = snapshot(data)
    assert_one_line(
        mailq_as_nobody("--url", f"embedded://{data}", "size", "spool"),
        f"mailq store {store} is not writable by nobody",
        "(mode 0400)",
    )
    assert snapshot(data) == before


def test_a_data_dir_that_cannot_be_created_is_one_line_and_nothing_is_created(shared, shared_eml):
    parent = shared / "root-only"
    parent.mkdir(mode=0o755)
    data = parent / "data" / "deeper"
    assert_one_line(
        mailq_as_nobody(*enqueue_args(f"embedded://{data}", shared_eml)),
        f"cannot create mailq data dir {data}: Permission denied",
    )
    assert list(parent.iterdir()) == []


def in_mount_namespace(script: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    """`script` (sh) in a mount namespace of its own, with $PYTHON able to run `-m mailq_cli`."""
    environment = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(WORKTREE)}
    environment.pop("MAILQ_URL", None)
    return subprocess.run(
        ["unshare", "--mount", "sh", "-ec", script, "sh", *arguments],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
    )


def test_a_data_dir_on_a_read_only_file_system_is_refused_even_for_root(tmp_path, eml):
    data = tmp_path / "data"
    a_store(data)
    before = snapshot(data)
    for command in (
        ["size", "spool"],
        ["enqueue", "spool", str(eml), "--sender", SENDER, "--rcpt", RECIPIENT],
    ):
        ran = in_mount_namespace(
            "data=$1; shift\n"
            'mount --bind -o ro "$data" "$data"\n'
            'exec "$PYTHON" -m mailq_cli --url "embedded://$data" "$@"',
            str(data),
            *command,
        )
        assert_one_line(
            (ran.returncode, ran.stdout, ran.stderr), f"mailq data dir {data} is on a read-only file system"
        )
    assert snapshot(data) == before


def test_a_full_disk_in_the_middle_of_an_enqueue_is_one_line_and_loses_nothing(tmp_path, eml):
    big = tmp_path / "big.eml"
    big.write_bytes(b"Subject: big\r\n\r\n" + os.urandom(750_000).hex().encode())
    disk = tmp_path / "disk"
    disk.mkdir()
    ran = in_mount_namespace(
        'mount -t tmpfs -o size=1m tmpfs "$1"\n'
        'data="$1/data"\n'
        'mailq() { "$PYTHON" -m mailq_cli --url "embedded://$data" "$@"; }\n'
        'mailq enqueue spool "$2" --sender a@example.com --rcpt b@example.org > /dev/null\n'
        'mailq enqueue spool "$3" --sender a@example.com --rcpt b@example.org || echo "status $?"\n'
        "mailq size spool\n"
        'mailq enqueue spool "$2" --sender a@example.com --rcpt b@example.org > /dev/null\n'
        "mailq size spool\n",
        str(disk),
        str(eml),
        str(big),
    )
    assert ran.stderr == f"mailq: error: mailq store {disk / 'data' / 'mailq.db'}: database or disk is full\n"
    # The refused mail is not there, the first one is, and the store goes on working.
    assert ran.stdout == "status 2\nspool: 1 mails\nspool: 2 mails\n"
