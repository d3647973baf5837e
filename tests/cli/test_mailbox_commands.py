"""`mailq mailbox list/show/expunge` on every deployment: what the worker delivered, as an operator reads it;
an expunge in record 23's write order (the counters stay right, the content goes to the GC); unknown users,
mailboxes and uids refused in one line, changing nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from mailq_runtime import Runtime
from mailq_servers.s3 import remove_bucket
from mailq_servers.urls import distributed_url
from tests.runtime.backends import CassandraBackend
from tests.servers.fixtures import fresh_bucket_name, fresh_keyspace

from .test_store_errors import assert_one_line, mailq

USER, OTHER = "bob@example.org", "carol@example.org"
MESSAGE = (
    b"From: Alice <alice@example.com>\r\nTo: bob@example.org\r\nSubject: =?utf-8?q?Caf=C3=A9?= at noon\r\n"
    b"\r\nSee you there.\r\n"
)


@pytest.fixture(params=["embedded", "distributed"])
def url(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A store with the local user bob: the embedded one, or Cassandra and S3 (the harness's servers)."""
    if request.param == "embedded":
        yield f"embedded://{tmp_path / 'data'}"
        return
    servers = request.getfixturevalue("cassandra_s3")
    for variable, value in servers.s3_server.env().items():
        monkeypatch.setenv(variable, value)
    with fresh_keyspace(servers.cassandra_server) as keyspace:
        bucket = fresh_bucket_name()
        deployment = CassandraBackend(tmp_path / "broker", servers, keyspace, bucket)
        yield distributed_url(
            servers.cassandra_server, servers.s3_server, keyspace, bucket, f"embedded:{deployment.broker_dir}"
        )
        remove_bucket(servers.s3, bucket)


def run(url: str, *argv: str) -> tuple[int, str, str]:
    return mailq("--url", url, *argv)


def deliver(url: str, tmp_path: Path, count: int) -> None:
    """`count` mails to bob through the queue and `mailq worker`, as an operator's walk-through does."""
    eml = tmp_path / "lunch.eml"
    eml.write_bytes(MESSAGE)
    assert run(url, "schema", "create")[0] == 0
    assert run(url, "users", "add", USER)[0] == 0
    for _ in range(count):
        assert run(url, "enqueue", "spool", str(eml), "--sender", "alice@example.com", "--rcpt", USER)[0] == 0
    status, out, err = run(url, "--json", "worker", "--domain", "example.org", "--idle-exit", "0.5")
    assert status == 0 and json.loads(out)["appended"] == count, err


def test_list_show_and_expunge_what_the_worker_delivered(url: str, tmp_path: Path) -> None:
    deliver(url, tmp_path, 3)

    status, out, _ = run(url, "mailbox", "list", USER)
    assert status == 0 and out.splitlines() == [
        "MAILBOX  MESSAGES  UNSEEN",
        "INBOX    3         3",
        f"1 mailboxes of {USER}",
    ]
    status, out, _ = run(url, "mailbox", "list", USER, "INBOX")
    lines = out.splitlines()
    assert status == 0 and lines[0].split() == ["UID", "FLAGS", "SIZE", "DATE", "SUBJECT"]
    assert [line.split()[:3] for line in lines[1:4]] == [
        [str(uid), "-", str(len(MESSAGE))] for uid in (1, 2, 3)
    ]
    assert all(line.endswith("Café at noon") for line in lines[1:4])
    assert lines[4] == f"3 messages in INBOX of {USER}"
    listed = json.loads(run(url, "--json", "mailbox", "list", USER, "INBOX")[1])
    assert [(m["uid"], m["flags"], m["size"], m["subject"]) for m in listed] == [
        (uid, [], len(MESSAGE), "Café at noon") for uid in (1, 2, 3)
    ]
    assert all(m["date"].startswith("20") and m["date"].endswith("+00:00") for m in listed)

    status, out, _ = run(url, "mailbox", "show", USER, "INBOX", "2")
    assert (status, out) == (0, MESSAGE.decode("utf-8").rstrip("\r\n") + "\n")
    status, out, _ = run(url, "mailbox", "show", USER, "INBOX", "2", "--headers")
    assert status == 0 and out.startswith("From: Alice") and "See you there" not in out
    shown = json.loads(run(url, "--json", "mailbox", "show", USER, "INBOX", "2")[1])
    assert (shown["uid"], shown["size"], shown["message"]) == (2, len(MESSAGE), MESSAGE.decode())

    message_id = listed[1]["message_id"]
    status, out, _ = run(url, "mailbox", "expunge", USER, "INBOX", "1", "2")
    assert (status, out) == (0, f"expunged 2 messages from INBOX of {USER}: 1 left\n")
    with Runtime.open(url) as runtime:
        inbox = runtime.mailboxes.get(USER, "INBOX")
        assert [m.uid for m in runtime.mailboxes.list_messages(inbox)] == [3]
        # The counters follow (record 23's order), and the expunged copy's content is released for the GC.
        assert runtime.mailboxes.counters(inbox) == runtime.mailboxes.recount(inbox)
        assert runtime.mailboxes.counters(inbox).count == 1
        assert not runtime.blobs.references_of(message_id)
    assert json.loads(run(url, "--json", "mailbox", "list", USER)[1]) == [
        {"mailbox": "INBOX", "count": 1, "unseen": 1}
    ]


def test_unknown_users_mailboxes_and_uids_get_one_line_and_change_nothing(url: str, tmp_path: Path) -> None:
    deliver(url, tmp_path, 2)
    before = run(url, "--json", "mailbox", "list", USER, "INBOX")[1]

    for argv, words in (
        (("list", OTHER), ("unknown user carol@example.org", "mailq users add")),
        (("list", OTHER, "INBOX"), ("unknown user carol@example.org",)),
        (("show", OTHER, "INBOX", "1"), ("unknown user carol@example.org",)),
        (("expunge", OTHER, "INBOX", "1"), ("unknown user carol@example.org",)),
        (("list", USER, "Archive"), ("unknown mailbox 'Archive' of bob@example.org",)),
        (("show", USER, "Sent", "1"), ("unknown mailbox 'Sent'",)),
        (("show", USER, "INBOX", "7"), ("no message with uid 7 in INBOX of bob@example.org",)),
        # One unknown uid among them: none is expunged.
        (("expunge", USER, "INBOX", "1", "7"), ("no message with uid 7 in INBOX of bob@example.org",)),
        (("show", USER, "INBOX", "one"), ("invalid uid 'one'",)),
        (("expunge", USER, "INBOX", "0"), ("invalid uid 0",)),
        (("list", "not an address"), ("invalid mail address",)),
        (("list", USER, "a*"), ("invalid mailbox name",)),
    ):
        assert_one_line(run(url, "mailbox", *argv), *words)
    assert run(url, "--json", "mailbox", "list", USER, "INBOX")[1] == before
