"""The `mailq` command, run in-process on a temporary data dir: output shapes, exit codes, one-line errors."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tomllib
from datetime import UTC
from pathlib import Path

import pytest

from mailq_cli.main import main
from mailq_cli.output import progress_bar
from mailq_runtime import Runtime
from mailq_runtime.clock import to_datetime
from mailq_runtime.errors import shown
from tests.runtime.backends import EmbeddedBackend

from .conftest import MESSAGE

ALICE, BOB, CAROL, DAVE = "alice@example.com", "bob@example.org", "carol@example.net", "dave@example.org"
HUGE = "1" * 310  # past a float's range, in any unit
LONG = "x" * 10_000


def worker(mailq, idle_exit: str = "0.3") -> dict:
    """`mailq --json worker` for example.org until idle; its stats. Its stderr holds only its log lines."""
    status, out, err = mailq("--json", "worker", "--domain", "example.org", "--idle-exit", idle_exit)
    assert status == 0 and all(" mailq/worker[" in line for line in err.splitlines()), err
    return json.loads(out)


def enqueue(mailq, eml: Path, *extra: str, sender: str = ALICE, rcpt: tuple[str, ...] = (BOB,)) -> str:
    """Enqueue `eml` in the queue 'spool', its recipients of example.org made local users (`mailq users
    add`) unless they are; returns the enqueue id."""
    recipients = [arg for address in rcpt for arg in ("--rcpt", address)]
    status, out, err = mailq("--json", "enqueue", "spool", str(eml), "--sender", sender, *recipients, *extra)
    assert (status, err) == (0, ""), err
    add_users(mailq, *rcpt)
    return json.loads(out)["enqueue_id"]


def add_users(mailq, *addresses: str) -> None:
    """`mailq users add` for each of `addresses` in example.org that is not a user yet."""
    users = json.loads(mailq("--json", "users", "list")[1])
    for address in addresses:
        if address.lower().endswith("@example.org") and address.lower() not in users:
            assert mailq("users", "add", address)[0] == 0
            users.append(address.lower())


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
    assert [(q["name"], q["size"]) for q in mailq_json("queues")] == [("spool", 2)]
    status, out, _ = mailq("size", "spool")
    assert (status, out) == (0, "spool: 2 mails\n")


def _enqueued_at(enqueue_id: str) -> str:
    return to_datetime(int(enqueue_id[:16], 16)).astimezone(UTC).isoformat(timespec="seconds")


def test_queues_shows_each_state_with_its_oldest(mailq, mailq_json, eml, url):
    held = enqueue(mailq, eml)
    enqueue(mailq, eml)
    ready = enqueue(mailq, eml)
    delayed = enqueue(mailq, eml, "--delay", "1h")
    with Runtime.open(url) as runtime:
        queue = runtime.queue("spool")
        item = queue.dequeue(timeout=0)
        assert item.enqueue_id == held
        queue.dequeue(timeout=0).reject("550 no such user")
        (entry,) = mailq_json("queues")
        status, out, err = mailq("queues")
        item.done()
    assert {key: entry[key] for key in ("name", "size", "ready", "in_flight", "delayed", "dead_letters")} == {
        "name": "spool",
        "size": 3,
        "ready": 1,
        "in_flight": 1,
        "delayed": 1,
        "dead_letters": 1,
    }
    assert (entry["oldest_ready"], entry["oldest_in_flight"], entry["oldest_delayed"]) == (
        _enqueued_at(ready),
        _enqueued_at(held),
        _enqueued_at(delayed),
    )
    assert entry["next_due"] > entry["oldest_delayed"] and entry["oldest_dead_letter"] is not None
    assert entry["unknown"] == []
    header, row, legend = out.splitlines()
    assert (status, err) == (0, "")
    assert header.split("  ")[:3] == ["QUEUE", "SIZE", "READY"]
    assert re.fullmatch(
        r"spool +3 +1 \(\d+s\) +1 \(\d+s\) +1 \(\d+s\) next in (59m\d\ds|1h00m) +1 \(\d+s\) +0", row
    )
    assert legend.startswith("(the age of the oldest")
    assert [(q["name"], q["ready"], q["in_flight"]) for q in mailq_json("queues")] == [("spool", 1, 0)]


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
        (["--slice-window", "soon"], ["invalid slice_window 'soon'"]),
        (["--slice-window", HUGE], ["invalid slice_window", "longer than 8000 years"]),
        (["--slice-window", "inf"], ["invalid slice_window 'inf'"]),
        (["--slice-window=-30m"], ["invalid slice_window '-30m': must not be negative"]),
        (["--bucket-count", "many"], ["invalid bucket_count 'many'"]),
        (["--bucket-count", HUGE], ["invalid bucket_count", "expected a positive integer"]),
        (["--bucket-count", "1e3"], ["invalid bucket_count '1e3'"]),
        (["--pace", HUGE], ["invalid update_browse_start_pace"]),
        (["--pace", "nan"], ["invalid update_browse_start_pace 'nan'"]),
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
    assert_bad_input(mailq(*command, "--sender", ALICE, "--rcpt", BOB, "--delay", "soon"), "invalid delay")

    # Not even the queue was created.
    assert mailq_json("queues") == []


def test_missing_file(mailq, mailq_json, tmp_path):
    missing = tmp_path / "missing.eml"

    assert_bad_input(
        mailq("enqueue", "spool", str(missing), "--sender", ALICE, "--rcpt", BOB),
        shown(str(missing)),  # a long path is shortened in the one line
        "No such file",
    )
    assert mailq_json("queues") == []


def test_usage_errors_are_one_line(mailq):
    assert_bad_input(mailq("size"), "required: QUEUE")
    assert_bad_input(mailq("frobnicate"), "invalid choice")
    assert_bad_input(mailq("browse", "spool", "--limit", "0"), "invalid limit")
    assert_bad_input(mailq("size", "bad name!"), "invalid queue name")


def test_bad_url_is_bad_input(capsys, monkeypatch):
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(variable, raising=False)
    assert main(["--url", "redis://nowhere", "queues"]) == 2
    assert capsys.readouterr().err.startswith("mailq: error: unsupported mailq URL scheme")
    assert main(["--url", "cassandra://nowhere", "queues"]) == 2
    assert "names no keyspace" in capsys.readouterr().err
    # Built, but the first link it looks at (the bucket, before the keyspace) cannot be reached: named, one
    # line, and nothing of the others opened.
    assert (
        main(
            [
                "--url",
                "cassandra://db1.invalid/mailq?s3=mail-blobs&broker=embedded:/var/lib/mailq",
                "size",
                "q",
            ]
        )
        == 2
    )
    assert capsys.readouterr().err.startswith(
        "mailq: error: S3 bucket 'mail-blobs' at AWS S3: no credentials found"
    )


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
    delivered = enqueue(mailq, eml, rcpt=(BOB, DAVE))
    dead_lettered = enqueue(mailq, eml, rcpt=(CAROL,))

    status, out, err = mailq("--json", "worker", "--domain", "example.org", "--idle-exit", "0.3")

    assert (status, json.loads(out)) == (
        0,
        {
            "delivered": 1,
            "retried": 0,
            "dead_lettered": 1,
            "appended": 2,
            "lease_expired": 0,
            "bounced": 0,
            "throttled": 0,
        },
    )
    # The log on stderr, one line per mail as Postfix's, the JSON document alone on stdout.
    sent, dead = err.splitlines()
    assert f"mailq/worker[{os.getpid()}]: {delivered}: to=<{BOB}>,<{DAVE}>, delay=" in sent
    assert sent.endswith(", attempts=1, status=sent (delivered to INBOX)")
    assert f": {dead_lettered}: to=<{CAROL}>, " in dead
    assert dead.endswith(f"status=dead-letter (unknown recipients: {CAROL})")
    assert mailq_json("size", "spool")["size"] == 0
    with Runtime.open(url) as runtime:
        inboxes = {m.user: runtime.mailboxes.counters(m.id).count for m in runtime.mailboxes.list()}
        assert inboxes == {BOB: 1, DAVE: 1}
        (dead,) = runtime.queue("spool").dead_letters.list()
        assert CAROL in dead.reason


def test_worker_threads_deliver_every_mail_once_and_add_up_their_stats(mailq, eml, url):
    ids = {enqueue(mailq, eml, rcpt=(BOB,)) for _ in range(12)}

    status, out, err = mailq(
        "--json", "worker", "--domain", "example.org", "--idle-exit", "0.5", "--threads", "4"
    )

    assert status == 0, err
    assert json.loads(out) == {
        "delivered": 12,
        "retried": 0,
        "dead_lettered": 0,
        "appended": 12,
        "lease_expired": 0,
        "bounced": 0,
        "throttled": 0,
    }
    assert {line.split(": ")[1] for line in err.splitlines()} == ids  # one delivery line per mail
    with Runtime.open(url) as runtime:
        (inbox,) = runtime.mailboxes.list()
        assert runtime.mailboxes.counters(inbox.id).count == 12


def test_worker_needs_a_local_domain(mailq):
    assert_bad_input(mailq("worker"), "--domain")


def test_worker_refuses_no_threads(mailq):
    assert_bad_input(mailq("worker", "--domain", "example.org", "--threads", "0"), "threads")


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


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--delay", HUGE], ["invalid delay", "(310 characters): longer than 8000 years"]),
        (["--delay", HUGE + "y"], ["invalid delay", "longer than 8000 years"]),
        (["--delay", "1e308"], ["invalid delay '1e308'"]),
        (["--delay", "inf"], ["invalid delay 'inf'"]),
        (["--delay", "nan"], ["invalid delay 'nan'"]),
        (["--delay", "-5"], ["invalid delay '-5': must not be negative"]),
        (["--delay=-1h"], ["invalid delay '-1h': must not be negative"]),
        (["--delay", "7990y"], ["invalid delay '7990y': the mail would be due after 9999-12-31"]),
        (["--priority", "10"], ["invalid priority 10: expected an integer 0..9"]),
        (["--priority", "-1"], ["invalid priority -1"]),
        (["--priority", HUGE], ["invalid priority", "digits"]),
        (["--priority", "1.5"], ["invalid priority '1.5'"]),
        (["--priority", "high"], ["invalid priority 'high'"]),
    ],
)
def test_enqueue_refuses_bad_numbers_and_creates_nothing(mailq, mailq_json, eml, args, words):
    assert_bad_input(mailq("enqueue", "spool", str(eml), "--sender", ALICE, "--rcpt", BOB, *args), *words)
    assert mailq_json("queues") == []


def test_a_delay_of_centuries_is_accepted(mailq, mailq_json, eml):
    enqueue(mailq, eml, "--delay", "1000y")
    (mail,) = mailq_json("browse", "spool")
    assert int(mail["next_delivery"][:4]) - int(mail["enqueued_time"][:4]) == 1000


@pytest.mark.parametrize(
    "command",
    [
        ["republish", "spool", "--older-than", HUGE],
        ["republish", "spool", "--older-than", "nan"],
        ["republish", "spool", "--older-than=-1h"],
        ["browse", "spool", "--limit", HUGE],
        ["browse", "spool", "--limit", "0"],
        ["worker", "--domain", "example.org", "--idle-exit", "nan"],
        ["worker", "--domain", "example.org", "--idle-exit", "inf"],
        ["worker", "--domain", "example.org", "--idle-exit", HUGE],
        ["worker", "--domain", "example.org", "--idle-exit=-1"],
        ["worker", "--domain", "example.org", "--retry-delay", HUGE],
        ["worker", "--domain", "example.org", "--retry-delay", "1e308"],
        ["worker", "--domain", "example.org", "--max-attempts", HUGE],
        ["worker", "--domain", "example.org", "--max-attempts", "0"],
    ],
)
def test_bad_numbers_are_one_line_errors_that_change_nothing(mailq, mailq_json, eml, command):
    enqueue(mailq, eml)
    before = (mailq_json("queues"), mailq_json("browse", "spool"), mailq_json("config", "show"))

    assert_bad_input(mailq(*command), "invalid")
    assert (mailq_json("queues"), mailq_json("browse", "spool"), mailq_json("config", "show")) == before


@pytest.mark.parametrize(
    "option",
    [
        f"visibility_timeout={HUGE}",
        "visibility_timeout=1e308",
        "visibility_timeout=nan",
        "clock_skew_grace=inf",
        f"max_message_size={HUGE}",
        f"slice_window={HUGE}",
        f"bucket_count={HUGE}",
        "update_browse_start_pace=nan",
    ],
)
def test_bad_numbers_in_the_url_are_one_line_errors(tmp_path, capsys, eml, option):
    data_dir = tmp_path / "data"
    for command in (["queues"], ["enqueue", "spool", str(eml), "--sender", ALICE, "--rcpt", BOB]):
        status = main(["--url", f"embedded://{data_dir}?{option}", *command])
        captured = capsys.readouterr()
        assert_bad_input((status, captured.out, captured.err), "invalid " + option.split("=")[0])
    assert not data_dir.exists()


SECRET_URLS = [
    "redis://admin:secret@host/0",
    "embedded://admin:secret@/tmp/mailq-cli-test",
    "embedded://admin:secret@data",
    "embedded://admin:secret@data?durability=fsync",
]


@pytest.mark.parametrize("url", SECRET_URLS)
@pytest.mark.parametrize(
    "command",
    [
        ["queues"],
        ["--json", "queues"],
        ["--json", "size", "spool"],
        ["enqueue", "spool", "EML", "--sender", ALICE, "--rcpt", BOB],
        ["--json", "enqueue", "spool", "EML", "--sender", ALICE, "--rcpt", BOB],
        ["config", "show"],
        ["worker", "--domain", "example.org", "--idle-exit", "0"],
    ],
)
def test_a_url_with_a_password_is_refused_and_never_shown(tmp_path, monkeypatch, capsys, eml, url, command):
    monkeypatch.chdir(tmp_path)  # where the relative data dirs would be created
    files = sorted(p.name for p in tmp_path.iterdir())
    command = [str(eml) if arg == "EML" else arg for arg in command]
    for argv, environment in ((["--url", url, *command], None), (command, url)):
        if environment is None:
            monkeypatch.delenv("MAILQ_URL", raising=False)
        else:
            monkeypatch.setenv("MAILQ_URL", environment)
        status = main(argv)
        captured = capsys.readouterr()
        assert_bad_input((status, captured.out, captured.err), "carries a password", "environment", ":***@")
        assert "secret" not in captured.out + captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == files
    assert not Path("/tmp/mailq-cli-test").exists()


def test_the_embedded_url_takes_no_user(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert_bad_input(
        (main(["--url", "embedded://admin@data", "config", "show"]), *capsys.readouterr()), "no user"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_url_in_a_usage_error_is_redacted(mailq):
    result = mailq("size", "spool", "redis://admin:secret@host/0")
    assert_bad_input(result, "unrecognized arguments: 'redis://admin:***@host/0'")
    assert "secret" not in result[2]


@pytest.mark.parametrize(
    "command",
    [
        [LONG],
        ["size", LONG],
        ["size", "spool", LONG],
        ["browse", "spool", "--limit", LONG],
        ["browse", "spool", f"--delayed={LONG}"],
        ["enqueue", LONG, "EML", "--sender", ALICE, "--rcpt", BOB],
        ["enqueue", "spool", "EML", "--sender", LONG, "--rcpt", BOB],
        ["enqueue", "spool", "EML", "--sender", ALICE, "--rcpt", LONG + "@example.org"],
        ["enqueue", "spool", "EML", "--sender", ALICE, "--rcpt", BOB, "--name", LONG],
        ["enqueue", "spool", "EML", "--sender", ALICE, "--rcpt", BOB, "--delay", LONG],
        ["enqueue", "spool", "EML", "--sender", ALICE, "--rcpt", BOB, "--priority", LONG],
        ["enqueue", "spool", LONG + ".eml", "--sender", ALICE, "--rcpt", BOB],
        ["remove", "spool", "--recipient", LONG],
        ["config", "set", "--bucket-count", LONG],
    ],
)
def test_a_long_value_is_echoed_cut_short(mailq, mailq_json, eml, command):
    enqueue(mailq, eml)
    command = [str(eml) if arg == "EML" else arg for arg in command]
    status, out, err = mailq(*command)

    assert_bad_input((status, out, err), "x" * 64, "(100")
    assert "x" * 65 not in err and len(err) < 500
    assert [(q["name"], q["size"]) for q in mailq_json("queues")] == [("spool", 1)]


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"just a body, no header\r\n", ["malformed message: no header section"]),
        (b"\r\nSubject: after a blank line\r\n\r\nbody\r\n", ["malformed message"]),
        (
            b"From alice@example.com Thu Jan  1 00:00:00 2024\nSubject: x\n\nbody\n",
            ["an mbox 'From ' separator"],
        ),
    ],
)
def test_enqueue_refuses_what_the_worker_would_dead_letter(mailq, mailq_json, tmp_path, content, words):
    path = tmp_path / "bad.eml"
    path.write_bytes(content)

    assert_bad_input(mailq("enqueue", "spool", str(path), "--sender", ALICE, "--rcpt", BOB), *words)
    assert mailq_json("queues") == []


def test_enqueue_keeps_accepting_real_world_mail(mailq, mailq_json, tmp_path):
    path = tmp_path / "lf.eml"
    path.write_bytes(b"Subject: bare LF\nContent-Transfer-Encoding: 8bit\n\nd\xc3\xa9j\xc3\xa0 vu \xff\n")
    enqueue(mailq, path)
    stats = worker(mailq, "300ms")
    assert stats == {
        "delivered": 1,
        "retried": 0,
        "dead_lettered": 0,
        "appended": 1,
        "lease_expired": 0,
        "bounced": 0,
        "throttled": 0,
    }


# The console script: the runtime's commands start without Dagster or Spark ---------------------------------

_IMPORTED = """
import json, sys
from mailq_cli.main import main
status = main(sys.argv[1:])
print(json.dumps({"status": status, "heavy": sorted(
    name for name in sys.modules if name.split(".")[0] in ("dagster", "pyspark", "assets", "resources")
)}), file=sys.stderr)
"""


def imported_by(*argv: str) -> tuple[int, list[str], str]:
    """`mailq ARGV` in a fresh interpreter: its exit status, the heavy modules it imported, its stdout."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTED, *argv], capture_output=True, text=True, timeout=120, env=environment
    )
    report = json.loads(done.stderr.splitlines()[-1])
    return report["status"], report["heavy"], done.stdout


def test_the_console_script_is_mailq_cli():
    scripts = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"mailq": "mailq_cli.main:main"}


def test_mailq_size_on_existing_data_imports_neither_dagster_nor_pyspark(mailq, eml, url):
    enqueue(mailq, eml)
    status, heavy, out = imported_by("--url", url, "size", "spool")
    assert (status, out) == (0, "spool: 1 mails\n")
    assert heavy == []
    status, heavy, out = imported_by("--help")
    assert status == 0 and heavy == []
    assert "    gc " in out and "    demo " in out  # listed, not imported


def test_a_pipeline_command_is_imported_once_named(url):
    status, heavy, out = imported_by("--url", url, "gc", "--help")
    assert status == 0 and "--dry-run" in out
    assert "assets.definitions" in heavy and "dagster" in heavy


# mailq schema create ----------------------------------------------------------------------------------------


def test_schema_create_makes_the_store_then_is_idempotent(mailq_json, mailq, url, tmp_path):
    assert mailq_json("schema", "create") == {"url": url, "created": True}
    assert mailq_json("schema", "create") == {"url": url, "created": False}
    assert mailq_json("queues") == []
    assert mailq_json("config", "show")["changes"] == 0


def test_a_store_lacking_tables_of_this_version_is_refused_until_schema_create(mailq, eml, url, tmp_path):
    enqueue(mailq, eml)
    newest = "blob_content"  # the newest table of the embedded store
    EmbeddedBackend(tmp_path / "data").as_older_version(lacking=newest)
    assert_bad_input(mailq("size", "spool"), f"lacks {newest} of this version", "`mailq schema create`")
    status, out, err = mailq("schema", "create")
    assert (status, err) == (0, "") and "already there; anything it lacked added" in out
    assert mailq("size", "spool")[:2] == (0, "spool: 1 mails\n")


def test_a_store_whose_deletions_name_no_owner_gains_the_column_at_schema_create(
    mailq, mailq_json, eml, url, tmp_path
):
    enqueue(mailq, eml)
    with Runtime.open(url) as runtime:  # a release this version records with its owner
        released = str(runtime.blobs.save("leaver", b"released content"))
        runtime.blobs.release("leaver")
    EmbeddedBackend(tmp_path / "data").as_older_version(lacking="blob_deletions.owner")
    assert_bad_input(
        mailq("size", "spool"), "lacks blob_deletions.owner of this version", "`mailq schema create`"
    )
    status, _, err = mailq("schema", "create")
    assert (status, err) == (0, "")
    assert mailq("size", "spool")[:2] == (0, "spool: 1 mails\n")
    (deletion,) = mailq_json("blobs", "explain", released)["deletions"]
    assert (deletion["owner"], deletion["gc_iteration"]) == (None, 1)  # the older row kept, its owner unknown
    status, out, _ = mailq("blobs", "explain", released)
    assert status == 0 and "released by an unrecorded owner" in out


# mailq dead-letters --------------------------------------------------------------------------------------


def test_dead_letters_list_show_requeue_and_purge(mailq, mailq_json, eml, url):
    dead = enqueue(mailq, eml, rcpt=(CAROL,))
    worker(mailq)
    (entry,) = mailq_json("dead-letters", "list", "spool")
    assert (entry["enqueue_id"], entry["sender"], entry["recipients"]) == (dead, ALICE, [CAROL])
    assert entry["name"].startswith("mail-")
    assert entry["reason"] == f"unknown recipients: {CAROL}"
    status, out, _ = mailq("dead-letters", "list", "spool")
    assert status == 0 and dead in out and out.rstrip().endswith("1 dead letters in spool")
    shown = mailq_json("dead-letters", "show", "spool", dead)
    assert (shown["message"].encode(), shown["size"]) == (MESSAGE, len(MESSAGE))
    status, out, _ = mailq("dead-letters", "show", "spool", dead)
    assert status == 0 and "Tomorrow at noon?" in out and f"recipients: {CAROL}" in out

    (requeued,) = mailq_json("dead-letters", "requeue", "spool", dead)["requeued"]
    assert requeued != dead
    assert mailq_json("dead-letters", "list", "spool") == []
    assert [m["enqueue_id"] for m in mailq_json("browse", "spool")] == [requeued]

    worker(mailq)
    assert mailq_json("dead-letters", "requeue", "spool", "--all")["requeued"] != []
    worker(mailq)
    assert mailq_json("dead-letters", "purge", "spool", "--older-than", "0s") == {
        "queue": "spool",
        "purged": 1,
    }
    assert mailq_json("dead-letters", "list", "spool") == []


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        (("requeue", "spool"), ("ENQUEUE_ID", "--all", "required")),
        (("requeue", "spool", "0" * 32, "--all"), ("not allowed with",)),
        (("purge", "spool"), ("ENQUEUE_ID", "--older-than", "required")),
        (("purge", "spool", "--older-than=-1h"), ("older_than",)),
        (("show", "spool", "zz"), ("invalid enqueue id",)),
        (("show", "spool", "0" * 32), ("holds no dead letter",)),
        (("purge", "spool", "0" * 32), ("holds no dead letter",)),
        (("list", "nowhere"), ("unknown queue",)),
    ],
)
def test_dead_letters_refuse_bad_input(mailq, eml, arguments, words):
    enqueue(mailq, eml)
    assert_bad_input(mailq("dead-letters", *arguments), *words)
