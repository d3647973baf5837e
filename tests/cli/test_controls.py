"""`mailq hold`, `release` and `held`, and the held column of `mailq queues`, run in-process on a
temporary data dir: one-line refusals that change nothing."""

from __future__ import annotations

import pytest

from .test_cli import assert_bad_input, enqueue


def test_hold_release_and_held(mailq, mailq_json, eml):
    one = enqueue(mailq, eml, rcpt=("bob@dest.test",))
    enqueue(mailq, eml, rcpt=("carol@other.test",))

    assert mailq_json("hold", "spool", "--domain", "dest.test") == {
        "queue": "spool",
        "domain": "dest.test",
        "held": 1,
    }
    assert [m["enqueue_id"] for m in mailq_json("held", "spool")] == [one]
    (queue,) = mailq_json("queues")
    assert (queue["held"], queue["size"]) == (1, 2)
    status, out, _ = mailq("queues")
    assert status == 0 and out.splitlines()[0].split()[-1] == "HELD"
    dest = by_domain(mailq_json)["dest.test"]
    assert (dest["queued"]["0-5"], dest["held"]["0-5"]) == (0, 1)
    status, out, _ = mailq("queues", "--by-domain")
    assert ["spool", "dest.test", "held", "1", "1"] in [row.split()[:5] for row in out.splitlines()]
    status, out, _ = mailq("release", "spool", one)
    assert (status, out) == (0, f"released 1 mails of spool (enqueue id {one})\n")
    assert mailq_json("held", "spool") == []
    dest = by_domain(mailq_json)["dest.test"]
    assert (dest["queued"]["0-5"], dest["held"]["0-5"]) == (1, 0)


def by_domain(mailq_json) -> dict[str, dict[str, dict[str, int]]]:
    return {entry["domain"]: entry["states"] for entry in mailq_json("queues", "--by-domain")}


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["hold", "spool"], ["name one mail"]),
        (["hold", "spool", "--domain", "bad..test"], ["invalid domain"]),
        (["hold", "spool", "0" * 32], ["holds no mail"]),
        (["hold", "spool", "--sender", "a@b.test", "--domain", "b.test"], ["not allowed"]),
        (["release", "spool", "--recipient", "nobody"], ["invalid mail address"]),
        (["hold", "nosuchqueue", "--domain", "b.test"], ["nosuchqueue"]),
    ],
)
def test_bad_input_is_one_line_and_changes_nothing(mailq, mailq_json, eml, args, words):
    kept = enqueue(mailq, eml, rcpt=("bob@b.test",))
    mailq_json("hold", "spool", kept)
    assert_bad_input(mailq(*args), *words)
    assert [m["enqueue_id"] for m in mailq_json("held", "spool")] == [kept]
    assert_bad_input(mailq("release", "spool", "--sender", "x@y.test", "--domain", "y.test"), "not allowed")


def test_queues_by_domain(mailq, mailq_json, eml):
    status, out, _ = mailq("queues", "--by-domain")
    assert (status, out) == (0, "no queues\n")
    enqueue(mailq, eml, rcpt=("bob@dest.test", "carol@other.test"))
    enqueue(mailq, eml, "--delay", "1h", rcpt=("dave@other.test",))
    report = mailq_json("queues", "--by-domain")
    assert [(e["queue"], e["domain"]) for e in report] == [("spool", "dest.test"), ("spool", "other.test")]
    other = report[1]
    assert (other["states"]["queued"]["0-5"], other["states"]["deferred"]["0-5"]) == (1, 1)
    assert other["last_error"] is None and other["next_attempt"] is None
    status, out, _ = mailq("queues", "--by-domain")
    header, *rows, legend = out.splitlines()
    assert header.split()[:5] == ["QUEUE", "DOMAIN", "STATE", "TOTAL", "0-5"] and "160+" in header
    assert [row.split()[:4] for row in rows] == [
        ["spool", "dest.test", "queued", "1"],
        ["spool", "dest.test", "deferred", "0"],
        ["spool", "dest.test", "held", "0"],
        ["spool", "other.test", "queued", "1"],
        ["spool", "other.test", "deferred", "1"],
        ["spool", "other.test", "held", "0"],
    ]
    assert legend.startswith("(mails per destination domain")


def test_suspend_resume_and_retry_a_domain(mailq, mailq_json, eml):
    enqueue(mailq, eml, "--delay", "1h", rcpt=("bob@dest.test",))
    report = mailq_json("suspend", "spool", "Dest.test", "--until", "2999-01-01T00:00Z")
    assert report == {"queue": "spool", "domain": "dest.test", "until": "2999-01-01T00:00:00+00:00"}
    (shape,) = mailq_json("queues", "--by-domain")
    assert shape["suspended_until"] == "2999-01-01T00:00:00+00:00"
    assert mailq_json("retry-domain", "spool", "dest.test")["retried"] == 1
    assert mailq_json("resume", "spool", "dest.test") == {
        "queue": "spool",
        "domain": "dest.test",
        "retried": 0,
    }
    status, out, _ = mailq("suspend", "spool", "dest.test", "--for", "2h")
    assert status == 0 and out.startswith("suspended dest.test in spool until ")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["suspend", "spool", "dest.test", "--until", "2020-01-01T00:00Z"], ["in the past"]),
        (["suspend", "spool", "dest.test", "--until", "2999-01-01T00:00"], ["time zone"]),
        (["suspend", "spool", "dest.test", "--until", "soon"], ["invalid time"]),
        (["suspend", "spool", "dest.test", "--for", "0s"], ["longer than zero"]),
        (["suspend", "spool", "dest.test"], ["--until", "--for"]),
        (["suspend", "spool", "bad..test", "--for", "1h"], ["invalid domain"]),
        (["resume", "spool", "other.test"], ["not suspended"]),
        (["retry-domain", "spool", "x y"], ["invalid domain"]),
    ],
)
def test_domain_controls_refuse_bad_input_and_change_nothing(mailq, mailq_json, eml, args, words):
    enqueue(mailq, eml, rcpt=("bob@dest.test",))
    mailq_json("suspend", "spool", "dest.test", "--until", "2999-01-01T00:00Z")
    assert_bad_input(mailq(*args), *words)
    (shape,) = mailq_json("queues", "--by-domain")
    assert shape["suspended_until"] == "2999-01-01T00:00:00+00:00"


def test_bounce_a_domain(mailq, mailq_json, eml):
    enqueue(mailq, eml, "--delay", "1h", rcpt=("bob@dest.test",))
    report = mailq_json("bounce", "spool", "Dest.test", "--reason", "gone for good", "--window", "1h")
    assert (report["domain"], report["reason"], report["retried"]) == ("dest.test", "gone for good", 1)
    status, out, _ = mailq("bounce", "spool", "dest.test", "--reason", "gone")
    assert status == 0 and out.startswith("bouncing the mails for dest.test in spool enqueued until ")
    assert_bad_input(mailq("bounce", "spool", "dest.test"), "--reason")
    assert_bad_input(mailq("bounce", "spool", "dest.test", "--reason", " "), "invalid bounce reason")
    assert_bad_input(mailq("bounce", "spool", "x..test", "--reason", "r"), "invalid domain")
    assert_bad_input(mailq("bounce", "spool", "x.test", "--reason", "r", "--window", "soon"), "--window")
