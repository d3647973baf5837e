"""Remote delivery's metrics on `--metrics`' endpoint, against dnsmasq and smtp-sink: attempts by
destination domain and outcome, the sessions open to a mail exchanger, and per destination the mails
waiting and the age of the oldest, read from the counters kept as mail moves."""

from __future__ import annotations

from mailq_cli.metrics_serving import serving_metrics
from mailq_servers.smtp_sink import SmtpSink
from tests.metrics.helpers import delta, scrape, value

from .conftest import QUEUE, send, statuses, wait_until

LOOPBACK = ("127.0.0.1", 0)


def test_attempts_sessions_and_the_mails_waiting_per_destination(runtime, start_worker, mx_port, relay_log):
    exchanger = f"mx.one.test[127.0.0.1]:{mx_port}"
    with serving_metrics(LOOPBACK, runtime) as address:
        assert address is not None
        before = scrape(address)
        send(runtime, "bob@one.test")
        with SmtpSink(mx_port, soft=["RCPT"]):
            worker = start_worker()
            wait_until(lambda: "deferred" in statuses(relay_log, "bob@one.test"))
            deferred = scrape(address)
        with SmtpSink(mx_port) as sink:
            wait_until(lambda: sink.dumped())
            wait_until(lambda: runtime.queue(QUEUE).size() == 0)
            sent = scrape(address)  # the session is kept for the next mail meanwhile
            worker.stop()
        after = scrape(address)

    attempts = "mailq_relay_attempts_total"
    assert delta(before, deferred, attempts, domain="one.test", outcome="deferred") >= 1
    assert delta(before, deferred, attempts, domain="one.test", outcome="sent") == 0
    waiting = {"queue": QUEUE, "domain": "one.test"}
    assert value(deferred, "mailq_destination_mails", state="deferred", **waiting) == 1
    assert 0 <= value(deferred, "mailq_destination_oldest_mail_age_seconds", **waiting) < 600

    assert delta(before, after, attempts, domain="one.test", outcome="sent") == 1
    assert value(sent, "mailq_destination_mails", state="deferred", **waiting) == 0
    assert ("mailq_destination_oldest_mail_age_seconds", frozenset(waiting.items())) not in sent
    assert value(sent, "mailq_relay_connections", destination=exchanger) == 1
    assert value(after, "mailq_relay_connections", destination=exchanger) == 0
