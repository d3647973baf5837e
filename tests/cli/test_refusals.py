"""Every `mailq` command that writes, given bad input: one error line, exit status 2, and nothing changed,
checked on the store's row counts, its queues, and whether a data dir appeared at all."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from mailq_cli.main import main
from tests.runtime.backends import EmbeddedBackend
from tests.runtime.test_store_files import snapshot

from .test_store_errors import MESSAGE, RECIPIENT, SENDER, assert_one_line, mailq

ENQUEUE = ["enqueue", "fresh", "{eml}", "--sender", SENDER, "--rcpt", RECIPIENT]
# Each: the URL's options, the command, and a word of its error. {eml}, {big} and {missing} are files.
REFUSALS: dict[str, tuple[str, list[str], str]] = {
    "enqueue-too-big": (
        "max_message_size=100",
        ["enqueue", "fresh", "{big}", "--sender", SENDER, "--rcpt", RECIPIENT],
        "exceeds the maximum size",
    ),
    "enqueue-bad-sender": (
        "",
        ["enqueue", "fresh", "{eml}", "--sender", "alice", "--rcpt", RECIPIENT],
        "'alice'",
    ),
    "enqueue-bad-recipient": (
        "",
        ["enqueue", "fresh", "{eml}", "--sender", SENDER, "--rcpt", "bob@"],
        "'bob@'",
    ),
    "enqueue-bad-delay": ("", [*ENQUEUE, "--delay", "soon"], "invalid delay 'soon'"),
    "enqueue-bad-priority": ("", [*ENQUEUE, "--priority", "high"], "invalid priority 'high'"),
    "enqueue-bad-name": ("", [*ENQUEUE, "--name", "a\nb"], "invalid mail name"),
    "enqueue-bad-queue": ("", ["enqueue", "bad name!", *ENQUEUE[2:]], "invalid queue name"),
    "enqueue-missing-file": ("", ["enqueue", "fresh", "{missing}", *ENQUEUE[3:]], "No such file"),
    "worker-unknown-queue": (
        "",
        ["worker", "--queue", "fresh", "--domain", "example.org"],
        "unknown queue 'fresh': known queues are ['spool']",
    ),
    "worker-bad-domain": ("", ["worker", "--domain", "not a domain"], "invalid mail address"),
    "remove-unknown-queue": ("", ["remove", "fresh", "--name", "x"], "unknown queue 'fresh'"),
    "remove-bad-sender": ("", ["remove", "spool", "--sender", "not an address"], "invalid mail address"),
    "remove-two-criteria": ("", ["remove", "spool", "--name", "x", "--sender", SENDER], "not allowed with"),
    "clear-unknown-queue": ("", ["clear", "fresh"], "unknown queue 'fresh'"),
    "flush-unknown-queue": ("", ["flush", "fresh"], "unknown queue 'fresh'"),
    "republish-unknown-queue": ("", ["republish", "fresh", "--older-than", "1h"], "unknown queue 'fresh'"),
    "republish-bad-duration": (
        "",
        ["republish", "spool", "--older-than", "soon"],
        "invalid older_than 'soon'",
    ),
    "update-browse-start-unknown-queue": ("", ["update-browse-start", "fresh"], "unknown queue 'fresh'"),
    "config-set-not-a-divisor": (
        "",
        ["config", "set", "--slice-window", "7m"],
        "may only change to a divisor",
    ),
    "config-set-no-buckets": ("", ["config", "set", "--bucket-count", "0"], "invalid bucket_count"),
    "config-set-bad-pace": ("", ["config", "set", "--pace", "0"], "invalid update_browse_start_pace"),
    "config-set-bad-window": ("", ["config", "set", "--slice-window", "soon"], "invalid slice_window 'soon'"),
}


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "hello.eml").write_bytes(MESSAGE)
    (tmp_path / "big.eml").write_bytes(MESSAGE + b"x" * 200)
    return {
        name: str(tmp_path / f"{file}.eml")
        for name, file in (("eml", "hello"), ("big", "big"), ("missing", "missing"))
    }


def command(data: Path, case: str, files: dict[str, str]) -> list[str]:
    options, argv, _ = REFUSALS[case]
    url = f"embedded://{data}" + (f"?{options}" if options else "")
    return ["--url", url, *(argument.format(**files) for argument in argv)]


@pytest.fixture
def data(tmp_path: Path, files: dict[str, str]) -> Path:
    """A data dir whose one queue, spool, holds one mail."""
    path = tmp_path / "data"
    enqueue = ["enqueue", "spool", files["eml"], "--sender", SENDER, "--rcpt", RECIPIENT]
    assert mailq("--url", f"embedded://{path}", *enqueue)[0] == 0
    return path


@pytest.mark.parametrize("case", list(REFUSALS))
def test_bad_input_on_existing_data_changes_nothing_and_creates_no_queue(data, files, case):
    backend = EmbeddedBackend(data)
    before = backend.state()
    assert_one_line(mailq(*command(data, case, files)), REFUSALS[case][2])
    assert backend.state() == before
    assert mailq("--url", f"embedded://{data}", "queues")[1].splitlines()[1].split()[:2] == ["spool", "1"]


@pytest.mark.parametrize("case", list(REFUSALS))
def test_bad_input_creates_no_data_dir(tmp_path, files, case):
    data = tmp_path / "nowhere" / "data"
    status, out, err = mailq(*command(data, case, files))
    assert_one_line((status, out, err))
    # enqueue and config set may create a data dir, so refuse their input first; every other command
    # works on existing data, so may say either that it has none or what else is wrong.
    if case.startswith(("enqueue", "config")):
        assert REFUSALS[case][2] in err
    else:
        assert REFUSALS[case][2] in err or f"no mailq data in {data}" in err
    assert not (tmp_path / "nowhere").exists()


def test_config_set_on_a_new_data_dir_creates_it_with_the_change(tmp_path):
    url = f"embedded://{tmp_path / 'data'}"
    assert_one_line(mailq("--url", url, "config", "show"), f"no mailq data in {tmp_path / 'data'}")
    assert not (tmp_path / "data").exists()
    status, out, err = mailq("--url", url, "config", "set", "--slice-window", "30m")
    assert (status, err) == (0, "") and "configuration changed" in out
    assert "slice window:             30m" in mailq("--url", url, "config", "show")[1]


def test_a_refused_demo_leaves_its_data_dir_as_it_was(data, capsys):
    cases = [
        (["demo", "--mails", "5", "--data-dir", str(data)], "at least 10 mails"),
        (["demo", "--data-dir", str(data / "mailq.db")], "is not a directory"),
    ]
    for argv, word in cases:
        before = snapshot(data)
        assert main(argv) == 2
        assert word in capsys.readouterr().err
        assert snapshot(data) == before
    os.chown(data, pwd.getpwnam("nobody").pw_uid, -1)
    before = snapshot(data)
    assert main(["demo", "--data-dir", str(data)]) == 2
    assert f"mailq data dir {data} is owned by nobody" in capsys.readouterr().err
    assert snapshot(data) == before
