"""The operator's controls against real servers on loopback (dnsmasq, smtp-sink): hold and release,
suspend and resume a domain, and the per-domain view of a destination that answers 4xx."""

from __future__ import annotations

import time

from mailq_runtime.queue import STATES
from mailq_servers.smtp_sink import SmtpSink

from .conftest import QUEUE, inbox, send, statuses, wait_until


def test_a_held_mail_reaches_no_server_until_released(runtime, start_worker, mx_port, relay_log):
    queue = runtime.queue(QUEUE)
    with SmtpSink(mx_port) as sink:
        held = send(runtime, "bob@one.test")
        assert queue.holds.hold(held) == 1
        free = send(runtime, "carol@one.test")
        worker = start_worker()
        wait_until(lambda: len(sink.dumped()) == 1)
        time.sleep(1.5)  # the held mail was dequeued and parked meanwhile: nothing more arrives
        assert [d.recipients for d in sink.dumped()] == [("<carol@one.test>",)]
        assert [item.enqueue_id for item in queue.browse()] == [held]
        assert queue.overviews.overview().held == 1 and free not in {i.enqueue_id for i in queue.holds.list()}
        (shape,) = queue.overviews.by_domain()
        assert (shape.domain, shape.total("held"), shape.total("queued")) == ("one.test", 1, 0)
        assert queue.holds.release(held) == 1
        wait_until(lambda: len(sink.dumped()) == 2)
        wait_until(lambda: queue.size() == 0)
        worker.stop()
    assert statuses(relay_log, "bob@one.test") == ["sent"]
    assert sum(shape.total(state) for shape in queue.overviews.by_domain() for state in STATES) == 0


def test_a_suspended_domain_waits_until_resumed(runtime, start_worker, mx_port, relay_log):
    queue = runtime.queue(QUEUE)
    queue.suspensions.suspend("one.test", "1h")
    with SmtpSink(mx_port) as sink:
        send(runtime, "bob@one.test", "carol@bare.test")
        worker = start_worker()
        wait_until(lambda: statuses(relay_log, "bob@one.test") == ["deferred"])
        wait_until(lambda: len(sink.dumped()) == 1)  # the other domain is not suspended
        assert "4.3.2, status=deferred (delivery to one.test suspended by the operator)" in relay_log.text
        (shape,) = [d for d in queue.overviews.by_domain() if d.domain == "one.test"]
        assert shape.suspended_until is not None and shape.total("deferred") == 1
        queue.suspensions.resume("one.test")
        wait_until(lambda: len(sink.dumped()) == 2)
        wait_until(lambda: queue.size() == 0)
        worker.stop()
    assert statuses(relay_log, "bob@one.test")[-1] == "sent"
    assert [d.recipients for d in sink.dumped()][1] == ("<bob@one.test>",)


def test_by_domain_shows_a_deferred_destination_with_its_error_and_next_attempt(
    runtime, start_worker, mx_port, relay_log
):
    queue = runtime.queue(QUEUE)
    with SmtpSink(mx_port, soft=["RCPT"]):
        send(runtime, "bob@one.test")
        send(runtime, "carol@one.test")
        worker = start_worker()
        wait_until(lambda: statuses(relay_log, "carol@one.test")[:1] == ["deferred"])
        worker.stop()
    (shape,) = queue.overviews.by_domain()
    assert (shape.domain, shape.total("deferred"), shape.total("queued")) == ("one.test", 2, 0)
    assert shape.buckets["deferred"][0] == 2  # younger than 5 minutes
    assert shape.last_error == "450 4.3.0 Error: command failed"
    assert shape.next_attempt is not None and shape.last_error_at <= shape.next_attempt


def test_a_bounced_domain_returns_its_mails_and_new_arrivals_in_the_window(
    runtime, start_worker, mx_port, relay_log
):
    queue = runtime.queue(QUEUE)
    with SmtpSink(mx_port) as sink:
        send(runtime, "bob@one.test", "carol@bare.test")
        queue.suspensions.bounce("one.test", "one.test closed its doors", "3s")
        send(runtime, "dave@one.test")  # arrives in the window
        worker = start_worker()
        wait_until(lambda: len(inbox(runtime)) == 2)
        wait_until(lambda: len(sink.dumped()) == 1)  # carol's domain is not bounced
        time.sleep(3)
        send(runtime, "erin@one.test")  # after the window: delivered
        wait_until(lambda: len(sink.dumped()) == 2)
        wait_until(lambda: queue.size() == 0)
        worker.stop()
    assert statuses(relay_log, "bob@one.test") == ["bounced"]
    assert statuses(relay_log, "dave@one.test") == ["bounced"]
    assert statuses(relay_log, "erin@one.test") == ["sent"]
    notice = inbox(runtime)[0].as_string()
    assert "5.0.0" in notice and "one.test closed its doors" in notice
