"""Local delivery: workers (threads or processes) drain a queue into INBOXes exactly once per recipient,
dead-letter what can never be delivered, retry what failed, survive redelivery, and stop gracefully."""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import fields

import pytest

from mailq_demo.mailboxes import deliver_and_maintain
from mailq_runtime import Counters, InvalidInput, Mail, Runtime, WorkerStats, run_worker, worker
from mailq_runtime.faults import APPEND_AFTER_SOURCE_OF_TRUTH, InjectedFault
from mailq_runtime.mailbox import INBOX
from mailq_runtime.queue import MailQueueItem
from mailq_runtime.stores.embedded.store import EmbeddedStore
from mailq_runtime.worker import deliver, delivery_message_id

from .backends import Backend
from .helpers import FakeClock
from .mailbox_checks import agent, assert_message_blobs_referenced, inconsistencies, results

QUEUE = "spool"
DOMAIN = "example.org"
USERS = ("alice@example.org", "bob@example.org", "carol@example.org")


def message(subject: str) -> bytes:
    return f"Subject: {subject}\r\nFrom: sender@example.net\r\n\r\nHello {subject}.\r\n".encode()


def add_users(runtime: Runtime, *users: str) -> None:
    """The local users among `users` (those of DOMAIN), as `mailq users add` makes them, unless they are."""
    for user in users:
        if user.lower().endswith(f"@{DOMAIN}") and not runtime.mailboxes.has_user(user):
            runtime.mailboxes.create(user, INBOX)


def enqueue(runtime: Runtime, *recipients: str, raw: bytes | None = None, subject: str = "hello") -> str:
    """A mail from sender@example.net to `recipients`, the local ones made local users first."""
    add_users(runtime, *recipients)
    mail = Mail(recipients=recipients, message=raw or message(subject), sender="sender@example.net")
    return runtime.queue(QUEUE).enqueue(mail)


def run_threads(runtime: Runtime, count: int, **options: object) -> list[WorkerStats]:
    stats: list[WorkerStats] = []

    def work() -> None:
        stats.append(run_worker(runtime, QUEUE, local_domains=[DOMAIN], **options))

    threads = [threading.Thread(target=work) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(stats) == count, "a worker did not return"
    return stats


def total(stats: list[WorkerStats]) -> WorkerStats:
    return WorkerStats(*(sum(getattr(s, f.name) for s in stats) for f in fields(WorkerStats)))


def inbox_of(runtime: Runtime, user: str):
    return runtime.mailboxes.get(user, INBOX)


def assert_delivered_state(
    runtime: Runtime, backend: Backend, delivered_ids: list[str], dead_ids: list[str]
) -> None:
    assert not inconsistencies(backend), inconsistencies(backend)
    assert_message_blobs_referenced(backend)
    held = backend.blob_state().held()
    assert not held.keys() & set(delivered_ids), "a delivered mail's enqueue id still holds references"
    # Dead letters keep their content: their enqueue ids still hold their references.
    assert all(dead in held for dead in dead_ids)
    assert runtime.queue(QUEUE).size() == 0


def test_two_worker_threads_deliver_everything_once(runtime: Runtime, backend: Backend) -> None:
    plain = [enqueue(runtime, USERS[n % 3], subject=f"mail {n}") for n in range(12)]
    shared = enqueue(runtime, "Bob@Example.org", "carol@example.org", "BOB@example.org", subject="shared")
    mixed = enqueue(runtime, "alice@example.org", "eve@elsewhere.net", subject="mixed")
    unknown = enqueue(runtime, "dave@elsewhere.net", subject="unknown")
    queued = {
        str(b)
        for enqueue_id in [*plain, shared, mixed, unknown]
        for b in runtime.blobs.references_of(enqueue_id)
    }

    stats = total(run_threads(runtime, 2, idle_timeout=1.0))

    assert stats == WorkerStats(delivered=13, retried=0, dead_lettered=2, appended=12 + 2 + 1)
    dead = {letter.enqueue_id: letter.reason for letter in runtime.queue(QUEUE).dead_letters.list()}
    assert set(dead) == {mixed, unknown}
    assert dead[mixed] == "unknown recipients: eve@elsewhere.net"
    assert dead[unknown] == "unknown recipients: dave@elsewhere.net"
    expected = {"alice@example.org": 4 + 1, "bob@example.org": 4 + 1, "carol@example.org": 4 + 1}
    for user, count in expected.items():
        assert runtime.mailboxes.counters(inbox_of(runtime, user)) == Counters(count, count)
    assert [m.user for m in runtime.mailboxes.list()] == sorted(expected)  # no mailbox for unknown users
    # Each copy is named by (enqueue id, recipient) and holds the mail's bytes.
    carol = inbox_of(runtime, "carol@example.org")
    copy_id = delivery_message_id(shared, "carol@example.org")
    (copy,) = [m for m in runtime.mailboxes.list_messages(carol) if m.message_id == copy_id]
    assert runtime.mailboxes.read(carol, copy.uid) == message("shared")
    assert_delivered_state(runtime, backend, plain + [shared], [mixed, unknown])
    # Delivered in the generation it was enqueued in, the content is stored once: the copies add no blob
    # to those the queue saved, and share them with the dead letters' content where it is the same.
    assert set(backend.blob_state().blobs) == queued


def test_two_worker_processes_deliver_everything_once(runtime: Runtime, backend: Backend) -> None:
    users, mails = [f"user{n}@{DOMAIN}" for n in range(4)], 200
    ids = [enqueue(runtime, users[n % 4], subject=f"mail {n}") for n in range(mails)]
    processes = [agent(backend, "worker", QUEUE, DOMAIN, 1.0) for _ in range(2)]
    stats = [WorkerStats(**json.loads(out)) for out in results(processes, timeout=120)]
    assert total(stats) == WorkerStats(delivered=mails, retried=0, dead_lettered=0, appended=mails)
    if backend.name != "embedded":
        # Where the store is SQLite, its lock is not fair between processes: one that commits in a
        # fraction of a millisecond takes it again before the other's busy handler wakes, and may do all
        # the work (seen with the suite's files in memory). Elsewhere each process gets its share.
        assert all(s.delivered for s in stats), f"one process did all the work: {stats}"
    for user in users:
        inbox = inbox_of(runtime, user)
        assert [m.uid for m in runtime.mailboxes.list_messages(inbox)] == list(range(1, mails // 4 + 1))
    assert_delivered_state(runtime, backend, ids, [])


def test_a_mail_redelivered_after_a_crash_before_done_is_not_duplicated(
    runtime: Runtime, backend: Backend
) -> None:
    enqueue_id = enqueue(runtime, "alice@example.org", "bob@example.org")
    item = runtime.queue(QUEUE).dequeue(timeout=5)
    deliver(runtime.mailboxes, item.enqueue_id, item.mail, [DOMAIN])
    # Alice files her copy before the redelivery: it must not come back to her INBOX either.
    alice = inbox_of(runtime, "alice@example.org")
    runtime.mailboxes.move(alice, 1, runtime.mailboxes.create("alice@example.org", "Archive"))
    item.retry()  # the worker died before done(): the broker delivers the mail again

    (stats,) = run_threads(runtime, 1, idle_timeout=0.5)

    assert stats == WorkerStats(delivered=1, retried=0, dead_lettered=0, appended=0)
    assert runtime.mailboxes.counters(alice) == Counters(0, 0)
    assert runtime.mailboxes.counters(inbox_of(runtime, "bob@example.org")) == Counters(1, 1)
    assert len(backend.mailbox_state().messages) == 2
    assert_delivered_state(runtime, backend, [enqueue_id], [])


def failed_after_the_source_of_truth(runtime: Runtime) -> str:
    """A mail to alice whose delivery failed between the source of truth and the projection, given back to
    the queue; its enqueue id."""
    enqueue_id = enqueue(runtime, "alice@example.org")
    item = runtime.queue(QUEUE).dequeue(timeout=5)
    runtime.faults.arm(APPEND_AFTER_SOURCE_OF_TRUTH)
    with pytest.raises(InjectedFault):
        deliver(runtime.mailboxes, item.enqueue_id, item.mail, [DOMAIN])
    item.release()
    return enqueue_id


def test_a_mail_whose_append_failed_after_the_source_of_truth_is_listed_once_redelivered(
    backend: Backend,
) -> None:
    # A backend away between the source of truth and the projection: the redelivery finds the copy in
    # the source of truth, and must not leave it out of the INBOX's listing until a recomputation. Each
    # write commits alone, as on a store that cannot group them (Cassandra).
    runtime = backend.open(group_writes=False)
    enqueue_id = failed_after_the_source_of_truth(runtime)

    (stats,) = run_threads(runtime, 1, idle_timeout=0.5)

    assert stats == WorkerStats(delivered=1, retried=0, dead_lettered=0, appended=0)
    listed = runtime.mailboxes.list_messages(inbox_of(runtime, "alice@example.org"))
    assert [entry.message_id for entry in listed] == [delivery_message_id(enqueue_id, "alice@example.org")]
    assert runtime.queue(QUEUE).size() == 0


def test_a_delivery_that_fails_midway_leaves_all_of_it_or_none_on_a_grouping_store(
    runtime: Runtime, backend: Backend
) -> None:
    # A store that groups writes (the embedded one) commits none of a delivery that fails after the source
    # of truth, and the redelivery appends the copy anew; any other keeps the source of truth, which the
    # redelivery finds. Either way the copy is listed once.
    enqueue_id = failed_after_the_source_of_truth(runtime)
    message_id = delivery_message_id(enqueue_id, "alice@example.org")
    assert (not runtime.mailboxes.locate(message_id)) == backend.groups_writes

    (stats,) = run_threads(runtime, 1, idle_timeout=0.5)

    appended = 1 if backend.groups_writes else 0
    assert stats == WorkerStats(delivered=1, retried=0, dead_lettered=0, appended=appended)
    listed = runtime.mailboxes.list_messages(inbox_of(runtime, "alice@example.org"))
    assert [entry.message_id for entry in listed] == [message_id]


def test_a_failed_delivery_is_retried_then_dead_lettered_after_max_attempts(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    flaky, broken = enqueue(runtime, "alice@example.org"), enqueue(runtime, "bob@example.org")
    append = runtime.mailboxes.writes.append_unplaced
    failures = {"alice@example.org": 1, "bob@example.org": 99}

    def failing_append(mailbox, raw, message_id):
        owner = next(m.user for m in runtime.mailboxes.list() if m.id == mailbox)
        if failures[owner]:
            failures[owner] -= 1
            raise OSError("disk hiccup")
        return append(mailbox, raw, message_id)

    monkeypatch.setattr(runtime.mailboxes.writes, "append_unplaced", failing_append)
    with caplog.at_level(logging.INFO, logger="mailq_runtime.worker"):
        (stats,) = run_threads(runtime, 1, idle_timeout=0.5, retry_delay=0, max_attempts=3)

    assert stats == WorkerStats(delivered=1, retried=1 + 2, dead_lettered=1, appended=1)
    # One line per attempt, each naming the mail by its enqueue id, as Postfix's delivery lines do.
    lines = [record.getMessage() for record in caplog.records if record.name == "mailq_runtime.worker"]
    assert [line.split(", status=")[1] for line in lines if line.startswith(broken)] == [
        "deferred (attempt 1 of 3: OSError: disk hiccup)",
        "deferred (attempt 2 of 3: OSError: disk hiccup)",
        "dead-letter (gave up after 3 attempts: OSError: disk hiccup)",
    ]
    assert [line.split(", status=")[1] for line in lines if line.startswith(flaky)] == [
        "deferred (attempt 1 of 3: OSError: disk hiccup)",
        "sent (delivered to INBOX)",
    ]
    assert all(": to=<" in line and ", delay=" in line for line in lines)
    (letter,) = runtime.queue(QUEUE).dead_letters.list()
    assert letter.enqueue_id == broken
    assert letter.reason == "gave up after 3 attempts: OSError: disk hiccup"
    assert runtime.mailboxes.counters(inbox_of(runtime, "alice@example.org")) == Counters(1, 1)
    assert_delivered_state(runtime, backend, [flaky], [broken])


def test_a_delivery_slower_than_the_visibility_timeout_is_delivered_once(
    backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = backend.open(visibility_timeout="2s")
    enqueue_id = enqueue(runtime, "alice@example.org")
    append = runtime.mailboxes.writes.append_unplaced

    def slow_append(*arguments, **options):
        time.sleep(3)  # past the visibility timeout, while the other worker keeps asking for mail
        return append(*arguments, **options)

    monkeypatch.setattr(runtime.mailboxes.writes, "append_unplaced", slow_append)
    stats = run_threads(runtime, 2, idle_timeout=3.5)

    assert total(stats) == WorkerStats(delivered=1, appended=1)
    assert runtime.mailboxes.counters(inbox_of(runtime, "alice@example.org")) == Counters(1, 1)
    assert_delivered_state(runtime, backend, [enqueue_id], [])


def test_a_lost_lease_is_logged_and_counted_and_the_worker_goes_on(
    backend, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    runtime = backend.open(clock, visibility_timeout="10s")
    lost, kept = enqueue(runtime, "alice@example.org"), enqueue(runtime, "bob@example.org")
    append = runtime.mailboxes.writes.append_unplaced
    taken = []

    def append_after_the_lease(*arguments, **options):
        if not taken:  # the worker stalls past its lease, and another consumer takes the mail
            clock.advance(10)
            taken.append(runtime.queue(QUEUE).dequeue(timeout=0))
        return append(*arguments, **options)

    monkeypatch.setattr(runtime.mailboxes.writes, "append_unplaced", append_after_the_lease)
    # One mail in hand at a time: the second is taken after the stall, with a lease of its own.
    monkeypatch.setattr(worker, "BATCH", 1)
    with caplog.at_level(logging.WARNING, logger="mailq_runtime.worker"):
        (stats,) = run_threads(runtime, 1, idle_timeout=0.5)

    assert stats == WorkerStats(delivered=1, appended=2, lease_expired=1)
    assert f"mail {lost} is recorded as delivered, but its lease was lost" in caplog.text
    (other,) = taken
    assert other.enqueue_id == lost
    other.done()  # the other consumer finds the mail delivered and settles it
    for user in ("alice@example.org", "bob@example.org"):
        assert runtime.mailboxes.counters(inbox_of(runtime, user)) == Counters(1, 1)
    assert_delivered_state(runtime, backend, [lost, kept], [])


def test_stop_finishes_the_mail_in_hand_then_returns(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, backend: Backend
) -> None:
    first, second = enqueue(runtime, "alice@example.org"), enqueue(runtime, "bob@example.org")
    stop = threading.Event()
    append = runtime.mailboxes.writes.append_unplaced

    def append_then_stop(*arguments, **options):
        stop.set()  # SIGTERM arrives while the first mail is being delivered
        return append(*arguments, **options)

    monkeypatch.setattr(runtime.mailboxes.writes, "append_unplaced", append_then_stop)
    (stats,) = run_threads(runtime, 1, stop=stop)

    assert stats == WorkerStats(delivered=1, retried=0, dead_lettered=0, appended=1)
    assert runtime.queue(QUEUE).size() == 1
    assert [item.enqueue_id for item in runtime.queue(QUEUE).browse()] == [second]
    assert_message_blobs_referenced(backend)
    assert first not in backend.blob_state().held()


def test_an_idle_worker_stops_promptly(runtime: Runtime) -> None:
    enqueue(runtime, USERS[0])
    runtime.queue(QUEUE).dequeue(timeout=5).done()  # the queue exists, and is empty
    stop = threading.Event()
    stats: list[WorkerStats] = []
    worker = threading.Thread(
        target=lambda: stats.append(run_worker(runtime, QUEUE, local_domains=[DOMAIN], stop=stop))
    )
    worker.start()
    time.sleep(0.3)
    stopped_at = time.monotonic()
    stop.set()
    worker.join(timeout=5)
    assert not worker.is_alive() and time.monotonic() - stopped_at < 1.0
    assert stats == [WorkerStats()]


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"local_domains": DOMAIN}, "non-empty collection of domains"),
        ({"local_domains": []}, "non-empty collection of domains"),
        ({"local_domains": ["not a domain"]}, "invalid mail address"),
        ({"local_domains": [DOMAIN], "max_attempts": 0}, "invalid max_attempts"),
        ({"local_domains": [DOMAIN], "max_attempts": 10**400}, "invalid max_attempts"),
        ({"local_domains": [DOMAIN], "retry_delay": "soon"}, "invalid retry_delay 'soon'"),
        ({"local_domains": [DOMAIN], "retry_delay": -1}, "invalid retry_delay -1: must not be negative"),
        ({"local_domains": [DOMAIN], "retry_delay": "1" * 310}, "longer than 8000 years"),
        ({"local_domains": [DOMAIN], "retry_delay": 1e308}, "longer than 8000 years"),
        ({"local_domains": [DOMAIN], "idle_timeout": -1}, "invalid idle_timeout"),
        (
            {"local_domains": [DOMAIN], "idle_timeout": float("nan")},
            "invalid idle_timeout nan: must be finite",
        ),
        (
            {"local_domains": [DOMAIN], "idle_timeout": float("inf")},
            "invalid idle_timeout inf: must be finite",
        ),
        ({"local_domains": [DOMAIN], "idle_timeout": 1e308}, "invalid idle_timeout"),
    ],
)
def test_bad_worker_options_are_refused(runtime: Runtime, options: dict, match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        run_worker(runtime, QUEUE, **options)


@pytest.mark.parametrize(
    ("raw", "accepted"),
    [
        (b"Subject: crlf\r\n\r\nbody\r\n", True),
        (b"Subject: bare lf\nFrom: a@example.net\n\nbody\n", True),
        (b"Subject: 8bit\r\nContent-Transfer-Encoding: 8bit\r\n\r\nd\xc3\xa9j\xc3\xa0 vu \xff\r\n", True),
        (b"Subject: headers only", True),
        (b"X-Obsolete : blank before the colon\r\n\r\nbody\r\n", True),
        (b"not a header line\r\n\r\nbody\r\n", False),
        (b"just a body", False),
        (b"\r\nSubject: a blank line first\r\n\r\nbody\r\n", False),
        (b"From alice@example.net Thu Jan  1 00:00:00 2024\nSubject: mbox\n\nbody\n", False),
    ],
)
def test_the_queue_accepts_exactly_the_messages_the_worker_delivers(
    runtime: Runtime, raw: bytes, accepted: bool
):
    """One rule (model.check_message): enqueue refuses, at the edge, what the worker would dead-letter as
    malformed, and accepts real-world mail (bare LF line ends, 8-bit bodies) that it delivers."""
    mail = Mail(recipients=("alice@example.org",), message=raw, sender="sender@example.net")
    queue = runtime.queue(QUEUE)
    if accepted:
        add_users(runtime, "alice@example.org")
        enqueue_id = queue.enqueue(mail)
        assert deliver(runtime.mailboxes, enqueue_id, mail, [DOMAIN]).appended == 1
        assert runtime.mailboxes.read(inbox_of(runtime, "alice@example.org"), 1) == raw
    else:
        with pytest.raises(InvalidInput, match="malformed message") as refused:
            queue.enqueue(mail)
        with pytest.raises(InvalidInput, match="malformed message") as undeliverable:
            deliver(runtime.mailboxes, "0" * 32, mail, [DOMAIN])
        assert str(refused.value) == str(undeliverable.value)
        assert queue.size() == 0 and runtime.mailboxes.list() == []


def test_the_demo_delivers_then_flags_archives_expunges_and_rotates(
    runtime: Runtime, backend: Backend
) -> None:
    for n in range(9):
        enqueue(runtime, USERS[n % 3], subject=f"mail {n}")
    enqueue(runtime, "dave@elsewhere.net")
    lines: list[str] = []

    figures = deliver_and_maintain(runtime, QUEUE, USERS, lines.append)

    assert figures["worker"] == {
        "delivered": 9,
        "retried": 0,
        "dead_lettered": 1,
        "appended": 9,
        "lease_expired": 0,
        "bounced": 0,
        "throttled": 0,
    }
    assert (figures["seen"], figures["flagged"], figures["archived"], figures["expunged"]) == (3, 3, 3, 3)
    assert (figures["reference_generation"], figures["gc_iteration"]) == (2, 2)
    assert len(backend.mailbox_state().messages) == 9 - 3
    assert not inconsistencies(backend)
    assert_message_blobs_referenced(backend)
    assert any("alice@example.org: INBOX holds 1 message(s), 0 unseen" in line for line in lines)


def test_mails_ready_together_are_settled_in_one_commit(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A batch's mails are delivered one after the other; their acknowledgements share one commit (one
    # WAL sync), with no commit between them.
    commits: list[object] = []
    commit = EmbeddedStore._commit
    monkeypatch.setattr(EmbeddedStore, "_commit", lambda store: (commits.append(store), commit(store))[1])
    commits_at_done: list[int] = []
    done = MailQueueItem.done
    monkeypatch.setattr(
        MailQueueItem, "done", lambda item: (commits_at_done.append(len(commits)), done(item))[1]
    )
    with Runtime.open(f"embedded://{tmp_path / 'data'}", create=True) as runtime:
        for index in range(worker.BATCH + 1):
            enqueue(runtime, USERS[index % len(USERS)], subject=f"mail {index}")
        (stats,) = run_threads(runtime, 1, idle_timeout=0.5)
        assert stats.delivered == stats.appended == worker.BATCH + 1
        assert runtime.queue(QUEUE).size() == 0
    first_batch, second_batch = commits_at_done[: worker.BATCH], commits_at_done[worker.BATCH :]
    assert len(set(first_batch)) == 1 and len(second_batch) == 1 and second_batch[0] > first_batch[0]


def test_a_batch_past_its_time_gives_the_mails_not_yet_tried_back(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A slow first delivery: the mails behind it go back to the queue untried (for any worker), and are
    # delivered once.
    ids = [enqueue(runtime, user) for user in USERS]
    append = runtime.mailboxes.writes.append_unplaced
    slow = []

    def slow_first(*arguments, **options):
        if not slow:
            slow.append(True)
            time.sleep(worker.BATCH_SECONDS + 0.2)
        return append(*arguments, **options)

    released: list[str] = []
    release = MailQueueItem.release
    monkeypatch.setattr(
        MailQueueItem, "release", lambda item: (released.append(item.enqueue_id), release(item))[1]
    )
    monkeypatch.setattr(runtime.mailboxes.writes, "append_unplaced", slow_first)
    (stats,) = run_threads(runtime, 1, idle_timeout=0.5)
    assert released == ids[1:]
    assert stats == WorkerStats(delivered=3, appended=3)
    assert runtime.queue(QUEUE).size() == 0
    for user in USERS:
        assert runtime.mailboxes.counters(inbox_of(runtime, user)) == Counters(1, 1)


def test_a_local_address_without_a_mailbox_is_bounced_to_its_sender_with_5_1_1(
    runtime: Runtime, backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    # One definition of a local user, `mailq smtp`'s: a mailbox. carol sends to nobody (no mailbox) and
    # alice; dora has an Archive but no INBOX, so she is a user and gets a new INBOX.
    add_users(runtime, "carol@example.org", "alice@example.org")
    runtime.mailboxes.create("dora@example.org", "Archive")
    queue = runtime.queue(QUEUE)
    sent = queue.enqueue(
        Mail(("Nobody@example.org", "alice@example.org"), message("to nobody"), sender="carol@example.org")
    )
    from_null = queue.enqueue(Mail(("nobody@example.org",), message("a bounce"), sender=None))
    to_dora = queue.enqueue(Mail(("dora@example.org",), message("to dora"), sender="carol@example.org"))

    with caplog.at_level(logging.INFO, logger="mailq_runtime"):
        stats = run_worker(runtime, QUEUE, local_domains=[DOMAIN], idle_timeout=0.5, hostname="mx.test")

    # The three mails, then carol's notification, delivered to her INBOX; none for the null sender.
    assert stats == WorkerStats(delivered=4, appended=3, bounced=2)
    assert not queue.dead_letters.list() and queue.size() == 0
    assert {m.user for m in runtime.mailboxes.list()} == {
        "alice@example.org",
        "carol@example.org",
        "dora@example.org",
    }
    assert runtime.mailboxes.counters(inbox_of(runtime, "dora@example.org")) == Counters(1, 1)
    carol = inbox_of(runtime, "carol@example.org")
    (notice,) = runtime.mailboxes.list_messages(carol)
    # Header lines unfolded: a long Diagnostic-Code is folded.
    report = " ".join(runtime.mailboxes.read(carol, notice.uid).decode().split())
    for line in (
        "Subject: Undelivered Mail Returned to Sender",
        "From: MAILER-DAEMON@mx.test (Mail Delivery System)",
        "To: carol@example.org",
        'Content-Type: multipart/report; report-type="delivery-status"',
        "Reporting-MTA: dns; mx.test",
        f"X-Mailq-Enqueue-Id: {sent}",
        "Final-Recipient: rfc822; nobody@example.org",
        "Action: failed",
        "Status: 5.1.1",
        "Diagnostic-Code: smtp; 550 5.1.1 <nobody@example.org>: Recipient address rejected: User unknown "
        "in local recipient table",
        "<nobody@example.org>: 550 5.1.1 <nobody@example.org>: Recipient address rejected: User unknown in "
        "local recipient table",
        "Subject: to nobody",  # the original's headers
    ):
        assert line in report, line
    assert "Remote-MTA" not in report and "alice@example.org>: " not in report
    lines = [record.getMessage() for record in caplog.records]
    assert (
        f"{sent}: to=<nobody@example.org>, status=bounced (550 5.1.1 <nobody@example.org>: Recipient "
        "address rejected: User unknown in local recipient table)" in lines
    )
    (null_line,) = [
        line for line in lines if line.startswith(from_null) and "status=" in line and "delay=" in line
    ]
    assert null_line.endswith("status=bounced (returned to its sender: no such local user)")
    assert not [line for line in lines if "notification" in line and from_null in line]
    assert any(line.startswith(to_dora) and "status=sent" in line for line in lines)
    assert_delivered_state(runtime, backend, [sent, from_null, to_dora], [])
