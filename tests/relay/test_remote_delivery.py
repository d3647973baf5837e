"""Remote delivery against real servers on loopback: dnsmasq for the routes, smtp-sink as the mail
exchangers: each scenario of delivery, deferral and bounce, on Postfix's schedule shrunk to seconds."""

from __future__ import annotations

import email.message
import time

from mailq_runtime.relay import RemoteDelivery, RetrySchedule, Router
from mailq_runtime.stores.embedded.store import EmbeddedStore
from mailq_runtime.worker import WorkerStats, handle
from mailq_servers.smtp_sink import SmtpSink

from .conftest import HOSTNAME, LOCAL, QUEUE, SCHEDULE, SENDER, inbox, send, statuses, wait_until


def _report(message: email.message.Message) -> list[email.message.Message]:
    """The per-recipient blocks of a delivery status notification, after checking its structure."""
    assert message.get_content_type() == "multipart/report"
    assert message.get_param("report-type") == "delivery-status"
    assert message["To"] == SENDER
    text, status, headers = message.get_payload()
    assert text.get_content_type() == "text/plain"
    assert headers.get_content_type() == "text/rfc822-headers"
    assert "Subject: for far away" in headers.get_payload()
    assert status.get_content_type() == "message/delivery-status"
    blocks = status.get_payload()
    assert blocks[0]["Reporting-MTA"] == "dns; relay.example.org"
    return blocks[1:]


def test_mail_reaches_the_mx_by_preference_and_is_logged_as_sent(runtime, start_worker, mx_port, relay_log):
    # down.test's first exchanger does not answer: the second, by preference, takes the mail.
    with SmtpSink(mx_port) as sink:
        enqueue_id = send(runtime, "bob@down.test", "carol@bare.test")
        worker = start_worker()
        wait_until(lambda: len(sink.dumped()) == 2)
        wait_until(lambda: runtime.queue("spool").size() == 0)
        stats = worker.stop()
    assert sorted(r for d in sink.dumped() for r in d.recipients) == ["<bob@down.test>", "<carol@bare.test>"]
    assert (stats.delivered, stats.retried, stats.bounced) == (1, 0, 0)
    lines = [r.getMessage() for r in relay_log.records]
    assert any(
        line.startswith(f"{enqueue_id}: to=<bob@down.test>, relay=mx2.down.test[127.0.0.1]:{mx_port}")
        and "dsn=2.0.0, status=sent (250 2.0.0 Ok)" in line
        for line in lines
    ), lines
    assert statuses(relay_log, "carol@bare.test") == ["sent"]  # no MX: the domain's own address


def test_a_destination_down_then_up_is_delivered_on_the_schedule(runtime, start_worker, mx_port, relay_log):
    send(runtime, "bob@one.test")
    worker = start_worker()
    wait_until(lambda: statuses(relay_log, "bob@one.test") == ["deferred"])
    with SmtpSink(mx_port) as sink:
        started = time.monotonic()
        wait_until(lambda: sink.dumped())
        # Retried after the schedule's delay (1 s, then 2 s), by no operator.
        assert time.monotonic() - started < 5
        wait_until(lambda: runtime.queue("spool").size() == 0)
        stats = worker.stop()
    assert statuses(relay_log, "bob@one.test")[-1] == "sent"
    assert set(statuses(relay_log, "bob@one.test")[:-1]) == {"deferred"}
    assert stats.delivered == 1 and stats.retried >= 1
    assert "connect to mx.one.test[127.0.0.1]" in relay_log.text


def test_a_4xx_reply_is_retried_until_a_2xx(runtime, start_worker, mx_port, relay_log):
    send(runtime, "bob@one.test")
    with SmtpSink(mx_port, soft=["RCPT"]):
        worker = start_worker()
        wait_until(lambda: "deferred" in statuses(relay_log, "bob@one.test"))
    assert "status=deferred (450 4.3.0 Error: command failed)" in relay_log.text
    with SmtpSink(mx_port) as sink:
        wait_until(lambda: sink.dumped())
        wait_until(lambda: runtime.queue("spool").size() == 0)
        worker.stop()
    assert [d.recipients for d in sink.dumped()] == [("<bob@one.test>",)]
    assert inbox(runtime) == []  # no notification for a mail delivered in the end


def test_a_5xx_reply_returns_the_mail_to_its_sender_at_once(runtime, start_worker, mx_port, relay_log):
    enqueue_id = send(runtime, "bob@one.test")
    with SmtpSink(mx_port, hard=["RCPT"]):
        worker = start_worker()
        wait_until(lambda: inbox(runtime))
        wait_until(lambda: runtime.queue("spool").size() == 0)
        stats = worker.stop()
    (notice,) = inbox(runtime)
    (block,) = _report(notice)
    assert block["Final-Recipient"] == "rfc822; bob@one.test"
    assert (block["Action"], block["Status"]) == ("failed", "5.3.0")
    assert block["Diagnostic-Code"] == "smtp; 500 5.3.0 Error: command failed"
    assert notice["From"].startswith("MAILER-DAEMON@relay.example.org")
    assert enqueue_id in notice.get_payload()[1].as_string()
    assert statuses(relay_log, "bob@one.test") == ["bounced"] and stats.bounced == 1


def test_a_mail_older_than_the_maximum_age_is_returned_with_4_4_7(runtime, start_worker, relay_log):
    send(runtime, "bob@one.test")  # no exchanger answers
    worker = start_worker(RetrySchedule.of("1s", "2s", "0s"))
    wait_until(lambda: inbox(runtime))
    worker.stop()
    (block,) = _report(inbox(runtime)[0])
    assert (block["Action"], block["Status"]) == ("failed", "4.4.7")
    assert "message expired: connect to mx.one.test[127.0.0.1]" in relay_log.text


def test_a_null_sender_gets_no_notification(runtime, start_worker, mx_port, relay_log):
    send(runtime, "bob@one.test", sender=None)
    with SmtpSink(mx_port, hard=["RCPT"]):
        worker = start_worker()
        wait_until(lambda: runtime.queue("spool").size() == 0)
        stats = worker.stop()
    assert stats.bounced == 1 and statuses(relay_log, "bob@one.test") == ["bounced"]
    assert inbox(runtime) == [] and runtime.queue("spool").size() == 0


def test_a_null_mx_bounces_at_once_without_a_connection(runtime, start_worker, relay_log):
    send(runtime, "bob@nullmx.test")
    worker = start_worker()
    wait_until(lambda: inbox(runtime))
    worker.stop()
    (block,) = _report(inbox(runtime)[0])
    assert block["Status"] == "5.1.10" and "Remote-MTA" not in block
    assert "does not accept mail (nullMX)" in block["Diagnostic-Code"]


def test_a_partly_delivered_mail_is_retried_to_the_others_only(runtime, start_worker, mx_port, relay_log):
    send(runtime, "bob@one.test", "carol@two.test", "alice@example.org")
    with SmtpSink(mx_port) as one:
        with SmtpSink(mx_port, host="127.0.0.2", soft=["RCPT"]):
            worker = start_worker()
            wait_until(lambda: "deferred" in statuses(relay_log, "carol@two.test"))
        with SmtpSink(mx_port, host="127.0.0.2") as two:
            wait_until(lambda: two.dumped())
            wait_until(lambda: runtime.queue("spool").size() == 0)
            stats = worker.stop()
        # bob had his copy once, at the first attempt: the retries named carol alone.
        assert [d.recipients for d in one.dumped()] == [("<bob@one.test>",)]
        assert [d.recipients for d in two.dumped()] == [("<carol@two.test>",)]
    assert statuses(relay_log, "bob@one.test") == ["sent"]
    assert len(inbox(runtime)) == 1  # the local recipient's copy, delivered once
    assert stats.delivered == 1 and stats.retried >= 1


def test_a_mail_for_other_domains_only_writes_nothing_before_its_smtp_transaction(
    runtime, mx_port, monkeypatch
):
    # It has no local copy to write: a transaction opened for one was an empty commit and a WAL sync a mail.
    commits = []
    commit = EmbeddedStore._commit
    monkeypatch.setattr(EmbeddedStore, "_commit", lambda store: (commits.append(store), commit(store))[1])
    queue = runtime.queue(QUEUE)
    relay = RemoteDelivery(
        queue, Router({"one.test": f"127.0.0.1:{mx_port}"}), SCHEDULE, HOSTNAME, runtime.clock
    )
    deliver, commits_before_smtp = relay.deliver, []
    monkeypatch.setattr(
        relay, "deliver", lambda *a: (commits_before_smtp.append(len(commits)), deliver(*a))[1]
    )
    with SmtpSink(mx_port) as sink:
        send(runtime, "bob@one.test")
        item = queue.dequeue(timeout=5)
        commits.clear()
        stats = WorkerStats()
        handle(
            queue,
            runtime.mailboxes,
            [item],
            frozenset([LOCAL]),
            "1s",
            5,
            stats,
            relay.notifications,
            relay=relay,
        )
        relay.close()
        assert [d.recipients for d in sink.dumped()] == [("<bob@one.test>",)]
    assert commits_before_smtp == [0]
    assert commits and stats.delivered == 1 and queue.size() == 0
