"""The `mailq` command, run in-process on a temporary data dir: output shapes, exit codes, one-line errors."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from mailq_runtime import Runtime
from mailq_runtime.cli import main, progress_bar

ALICE, BOB, CAROL, DAVE = "alice@example.com", "bob@example.org", "carol@example.net", "dave@example.org"
MESSAGE = (
    b"From: Alice <alice@example.com>\r\nTo: bob@example.org\r\nSubject: Lunch\r\n"
    b"Message-ID: <1@example.com>\r\n\r\nTomorrow at noon?\r\n"
)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"embedded://{tmp_path / 'data'}"


@pytest.fixture
def eml(tmp_path: Path) -> Path:
    path = tmp_path / "lunch.eml"
    path.write_bytes(MESSAGE)
    return path


@pytest.fixture
def mailq(url: str, capsys: pytest.CaptureFixture[str]):
    """Run `mailq --url <tmp> ...`; returns (exit status, stdout, stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        status = main(["--url", url, *args])
        captured = capsys.readouterr()
        return status, captured.out, captured.err

    return run


@pytest.fixture
def mailq_json(mailq):
    """Run `mailq --url <tmp> --json ...`, check it succeeded, and parse its one JSON document."""

    def run(*args: str):
        status, out, err = mailq("--json", *args)
        assert (status, err) == (0, "")
        return json.loads(out)

    return run


def enqueue(mailq, eml: Path, *extra: str, sender: str = ALICE, rcpt: tuple[str, ...] = (BOB,)) -> str:
    """Enqueue `eml` in the queue 'spool'; returns the enqueue id."""
    recipients = [arg for address in rcpt for arg in ("--rcpt", address)]
    status, out, err = mailq("--json", "enqueue", "spool", str(eml), "--sender", sender, *recipients, *extra)
    assert (status, err) == (0, ""), err
    return json.loads(out)["enqueue_id"]


def assert_bad_input(result: tuple[int, str, str], *words: str) -> None:
    status, out, err = result
    assert status == 2
    assert out == ""
    assert err.startswith("mailq: error: ") and err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for word in words:
        assert word in err


def test_enqueue_then_size_and_queues(mailq, mailq_json, eml):
    enqueue_id = enqueue(mailq, eml)
    enqueue(mailq, eml, sender="<>", rcpt=(BOB, CAROL))

    assert len(enqueue_id) == 32
    assert mailq_json("size", "spool") == {"name": "spool", "size": 2}
    assert mailq_json("queues") == [{"name": "spool", "size": 2}]
    status, out, _ = mailq("size", "spool")
    assert (status, out) == (0, "spool: 2 mails\n")


def test_enqueued_content_is_the_file(mailq, eml, url):
    enqueue(mailq, eml, "--priority", "7")

    with Runtime.open(url) as runtime:
        item = runtime.queue("spool").dequeue(timeout=0)
        assert item.mail.message == MESSAGE
        assert (item.mail.sender, item.mail.recipients) == (ALICE, (BOB,))
        item.done()


def test_browse_json_shape_and_human_table(mailq, mailq_json, eml):
    enqueue_id = enqueue(mailq, eml, "--name", "m1")
    enqueue(mailq, eml, "--name", "m2", sender="")

    mails = mailq_json("browse", "spool")

    assert [m["name"] for m in mails] == ["m1", "m2"]
    first = mails[0]
    assert set(first) == {
        "enqueue_id",
        "name",
        "sender",
        "recipients",
        "enqueued_time",
        "next_delivery",
        "delayed",
    }
    assert (first["enqueue_id"], first["sender"], first["recipients"]) == (enqueue_id, ALICE, [BOB])
    assert first["delayed"] is False
    assert first["next_delivery"] == first["enqueued_time"]
    assert mails[1]["sender"] is None
    assert mailq_json("browse", "spool", "--limit", "1") == mails[:1]
    status, out, _ = mailq("browse", "spool")
    assert status == 0
    assert out.splitlines()[0].split() == ["ENQUEUED", "NEXT", "DELIVERY", "SENDER", "RECIPIENTS", "NAME"]
    assert "<>" in out and out.endswith("2 mails shown\n")


def test_browse_delayed_then_flush(mailq, mailq_json, eml):
    enqueue(mailq, eml, "--name", "now")
    enqueue(mailq, eml, "--name", "later", "--delay", "10m")

    delayed = mailq_json("browse", "spool", "--delayed")

    assert [(m["name"], m["delayed"]) for m in delayed] == [("later", True)]
    assert mailq_json("flush", "spool") == {"queue": "spool", "flushed": 1}
    assert mailq_json("browse", "spool", "--delayed") == []
    assert mailq_json("size", "spool")["size"] == 2


@pytest.mark.parametrize(
    ("option", "value", "left"),
    [
        ("--sender", CAROL, {"m1", "m2"}),
        ("--name", "m2", {"m1", "m3"}),
        ("--recipient", DAVE, {"m1"}),  # any matching recipient removes the whole mail
    ],
)
def test_remove_by_each_criterion(mailq, mailq_json, eml, option, value, left):
    enqueue(mailq, eml, "--name", "m1")
    enqueue(mailq, eml, "--name", "m2", rcpt=(DAVE,))
    enqueue(mailq, eml, "--name", "m3", sender=CAROL, rcpt=(BOB, DAVE))

    report = mailq_json("remove", "spool", option, value)

    assert report == {
        "queue": "spool",
        option[2:]: value,
        "removed": 3 - len(left),
        "initial_count": 3,
        "remaining_count": len(left),
    }
    assert {m["name"] for m in mailq_json("browse", "spool")} == left


def test_remove_needs_exactly_one_criterion(mailq, mailq_json, eml):
    enqueue(mailq, eml)

    assert_bad_input(mailq("remove", "spool"), "one of the arguments --sender --name --recipient is required")
    assert_bad_input(mailq("remove", "spool", "--name", "x", "--sender", ALICE), "not allowed")
    assert_bad_input(mailq("remove", "spool", "--sender", "not an address"), "invalid mail address")
    assert mailq_json("size", "spool")["size"] == 1


def test_clear(mailq, mailq_json, eml):
    for _ in range(3):
        enqueue(mailq, eml)

    cleared = mailq_json("clear", "spool")
    assert cleared == {"queue": "spool", "removed": 3, "initial_count": 3, "remaining_count": 0}
    assert mailq_json("browse", "spool") == []
    assert mailq_json("size", "spool")["size"] == 0


def test_republish_and_update_browse_start(mailq_json, mailq, eml):
    enqueue(mailq, eml)

    # The broker still holds the mail: nothing to republish.
    assert mailq_json("republish", "spool", "--older-than", "0s")["republished"] == 0
    starts = mailq_json("update-browse-start", "spool")
    assert set(starts) == {"queue", "browse_start", "content_start"}
    assert starts["content_start"] <= starts["browse_start"]


def test_config_show_and_set(mailq, mailq_json, eml):
    enqueue(mailq, eml)
    assert mailq_json("config", "show") == {
        "slice_window_seconds": 3600,
        "bucket_count": 1,
        "update_browse_start_pace": 1000,
        "changes": 0,
    }

    changed = mailq_json("config", "set", "--slice-window", "30m", "--bucket-count", "3")
    assert changed == {
        "slice_window_seconds": 1800,
        "bucket_count": 3,
        "update_browse_start_pace": 1000,
        "changes": 1,
        "changed": True,
    }
    # Unspecified values keep the current ones.
    assert mailq_json("config", "set", "--pace", "50")["bucket_count"] == 3
    assert mailq_json("config", "set", "--pace", "50")["changed"] is False
    status, out, _ = mailq("config", "show")
    assert status == 0 and "30m" in out and "50" in out


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--slice-window", "7m"], ["sliceWindow may only change to a divisor"]),
        (["--slice-window", "2h"], ["sliceWindow may only change to a divisor"]),
        (["--bucket-count", "1"], ["bucketCount may only grow"]),
        (["--pace", "0"], ["update_browse_start_pace"]),
        (["--slice-window", "soon"], ["invalid duration"]),
        (["--bucket-count", "many"], ["invalid int value"]),
        ([], ["at least one of"]),
    ],
)
def test_config_set_rejected_changes_nothing(mailq, mailq_json, args, words):
    mailq_json("config", "set", "--slice-window", "30m", "--bucket-count", "2")
    before = mailq_json("config", "show")

    assert_bad_input(mailq("config", "set", *args), *words)
    assert mailq_json("config", "show") == before


def test_first_change_from_the_default_configuration_is_checked(mailq, mailq_json, eml):
    enqueue(mailq, eml)  # a slice of the default 1h window now holds a mail

    assert_bad_input(mailq("config", "set", "--slice-window", "7m"), "may only change to a divisor")
    assert mailq_json("config", "show")["slice_window_seconds"] == 3600


@pytest.mark.parametrize(
    "command",
    [
        ["size", "nope"],
        ["browse", "nope"],
        ["remove", "nope", "--name", "x"],
        ["clear", "nope"],
        ["flush", "nope"],
        ["republish", "nope", "--older-than", "1h"],
        ["update-browse-start", "nope"],
    ],
)
def test_unknown_queue(mailq, mailq_json, eml, command):
    enqueue(mailq, eml)

    assert_bad_input(mailq(*command), "unknown queue 'nope'")
    assert [q["name"] for q in mailq_json("queues")] == ["spool"]


def test_invalid_address_enqueues_nothing(mailq, mailq_json, eml):
    command = ["enqueue", "spool", str(eml)]
    assert_bad_input(mailq(*command, "--sender", "alice", "--rcpt", BOB), "invalid mail address 'alice'")
    assert_bad_input(mailq(*command, "--sender", ALICE, "--rcpt", "bob@"), "invalid mail address 'bob@'")
    assert_bad_input(mailq(*command, "--sender", ALICE, "--rcpt", BOB, "--delay", "soon"), "invalid duration")

    # Not even the queue was created.
    assert mailq_json("queues") == []


def test_missing_file(mailq, mailq_json, tmp_path):
    missing = tmp_path / "missing.eml"

    assert_bad_input(
        mailq("enqueue", "spool", str(missing), "--sender", ALICE, "--rcpt", BOB),
        str(missing),
        "No such file",
    )
    assert mailq_json("queues") == []


def test_usage_errors_are_one_line(mailq):
    assert_bad_input(mailq("size"), "required: QUEUE")
    assert_bad_input(mailq("frobnicate"), "invalid choice")
    assert_bad_input(mailq("browse", "spool", "--limit", "0"), "invalid limit")
    assert_bad_input(mailq("size", "bad name!"), "invalid queue name")


def test_bad_url_is_bad_input(capsys):
    assert main(["--url", "cassandra://nowhere", "queues"]) == 2
    assert capsys.readouterr().err.startswith("mailq: error: unsupported mailq URL scheme")


def test_url_from_environment(monkeypatch, tmp_path, eml, capsys):
    monkeypatch.setenv("MAILQ_URL", f"embedded://{tmp_path / 'env'}")

    assert main(["enqueue", "spool", str(eml), "--sender", ALICE, "--rcpt", BOB]) == 0
    assert (tmp_path / "env" / "mailq.db").exists()


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_on_a_terminal():
    terminal, pipe = _Terminal(), io.StringIO()

    for stream in (terminal, pipe):
        with progress_bar("browse spool", 1000, stream) as advance:
            for _ in range(1000):
                advance(1)

    assert pipe.getvalue() == ""
    drawn = terminal.getvalue()
    assert "browse spool [" + "#" * 30 + "] 1000/1000" in drawn
    assert drawn.endswith("\r")  # erased, so the command's own output starts on a clean line


def test_worker_delivers_local_recipients_and_dead_letters_the_rest(mailq, mailq_json, eml, url):
    enqueue(mailq, eml, rcpt=(BOB, DAVE))
    enqueue(mailq, eml, rcpt=(CAROL,))

    stats = mailq_json("worker", "--domain", "example.org", "--idle-exit", "0.3")

    assert stats == {"delivered": 1, "retried": 0, "dead_lettered": 1, "appended": 2}
    assert mailq_json("size", "spool")["size"] == 0
    with Runtime.open(url) as runtime:
        inboxes = {m.user: runtime.mailboxes.counters(m.id).count for m in runtime.mailboxes.list()}
        assert inboxes == {BOB: 1, DAVE: 1}
        (dead,) = runtime.queue("spool").dead_letters()
        assert CAROL in dead.reason


def test_worker_needs_a_local_domain(mailq):
    assert_bad_input(mailq("worker"), "--domain")


def test_commands_on_existing_data_create_no_data_dir(mailq, mailq_json, tmp_path):
    assert mailq_json("queues") == []
    for command in (
        ["size", "spool"],
        ["browse", "spool"],
        ["flush", "spool"],
        ["remove", "spool", "--name", "x"],
    ):
        assert_bad_input(mailq(*command), "no mailq data in")
    assert not (tmp_path / "data").exists()
