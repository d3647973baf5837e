"""A real Prometheus scrapes `mailq smtp` and `mailq worker`, each started as a user starts it with
`--metrics`; the test sends mails by SMTP, lets the worker deliver them, and checks with PromQL through
Prometheus's HTTP API that every count matches the work done."""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mailq_servers.prometheus import PrometheusServer
from tests.smtp.conftest import DOMAIN, USER, make_store
from tests.smtp.helpers import Raw

WORKTREE = Path(__file__).resolve().parents[2]
LOCAL_MAILS = 4  # to the local user: delivered
SESSIONS = LOCAL_MAILS + 1  # and one to another domain, relayed from loopback: dead-lettered by the worker


@contextmanager
def mailq(url: str, log: Path, *argv: str) -> Iterator[Path]:
    """`mailq --url URL ARGV` running, its stderr in `log`; SIGTERM (a graceful stop) at the end."""
    env = {**os.environ, "PYTHONPATH": str(WORKTREE)}
    with log.open("w") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "mailq_cli", "--url", url, *argv],
            stderr=err,
            stdout=subprocess.DEVNULL,
            env=env,
        )
    try:
        yield log
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, log.read_text()


def logged(log: Path, pattern: str, timeout: float = 30.0) -> str:
    """The first group of `pattern` once the log has a line matching it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, log.read_text())
        if found:
            return found.group(1)
        time.sleep(0.1)
    raise AssertionError(f"no {pattern!r} in {log}: {log.read_text()}")


def smtp_session(port: int, recipient: str) -> int:
    """One mail in one session; the bytes sent."""
    raw = Raw(port)
    assert raw.reply().startswith("220 ")
    sent = 0
    for line in (
        b"EHLO client.example\r\n",
        b"MAIL FROM:<bob@elsewhere.example>\r\n",
        f"RCPT TO:<{recipient}>\r\n".encode(),
        b"DATA\r\n",
        b"Subject: hi\r\nFrom: bob@elsewhere.example\r\n\r\nHello.\r\n.\r\n",
        b"QUIT\r\n",
    ):
        assert raw.command(line)[:1] in "23", line
        sent += len(line)
    raw.sock.close()
    return sent


def test_prometheus_counts_the_work(prometheus_server: PrometheusServer, tmp_path: Path) -> None:
    url = f"embedded://{tmp_path / 'data'}"
    make_store(url)
    run = secrets.token_hex(4)
    smtp_argv = ("smtp", "--listen", "127.0.0.1:0", "--domain", DOMAIN, "--metrics", "127.0.0.1:0")
    with mailq(url, tmp_path / "smtp.log", *smtp_argv) as smtp_log:
        smtp_metrics = logged(smtp_log, r"metrics at http://(\S+)/metrics")
        port = int(logged(smtp_log, r"listening on 127\.0\.0\.1:(\d+)"))
        with prometheus_server.scraping(smtp_metrics, f"{run}-smtp"):
            sent = sum(smtp_session(port, USER) for _ in range(LOCAL_MAILS))
            sent += smtp_session(port, "carol@elsewhere.example")
            smtp = f'run="{run}-smtp"'
            expected = {
                f"mailq_smtp_sessions_total{{{smtp}}}": SESSIONS,
                # Each session: 220, EHLO's 250, MAIL's, RCPT's, the mail's 250 and QUIT's 221; DATA's 354.
                f'mailq_smtp_replies_total{{{smtp},code_class="2xx"}}': 6 * SESSIONS,
                f'mailq_smtp_replies_total{{{smtp},code_class="3xx"}}': SESSIONS,
                f"mailq_smtp_received_bytes_total{{{smtp}}}": sent,
                f'mailq_queue_enqueued_mails_total{{{smtp},queue="spool"}}': SESSIONS,
                f'mailq_queue_mails{{{smtp},queue="spool",state="ready"}}': SESSIONS,
                f'mailq_backend_calls_total{{{smtp},backend="sqlite",kind="view.insert"}}': SESSIONS,
            }
            assert {
                query: prometheus_server.await_value(query, want) for query, want in expected.items()
            } == (expected)

    worker_argv = ("worker", "--domain", DOMAIN, "--metrics", "127.0.0.1:0")
    with mailq(url, tmp_path / "worker.log", *worker_argv) as worker_log:
        worker_metrics = logged(worker_log, r"metrics at http://(\S+)/metrics")
        with prometheus_server.scraping(worker_metrics, f"{run}-worker"):
            worker = f'run="{run}-worker",queue="spool"'
            expected = {
                f"mailq_queue_dequeued_mails_total{{{worker}}}": SESSIONS,
                f'mailq_queue_settled_mails_total{{{worker},outcome="delivered"}}': LOCAL_MAILS,
                f'mailq_queue_settled_mails_total{{{worker},outcome="dead_lettered"}}': 1,
                f"mailq_queue_time_in_queue_seconds_count{{{worker}}}": LOCAL_MAILS,
                f'mailq_queue_mails{{{worker},state="ready"}}': 0,
                f'mailq_queue_mails{{{worker},state="dead_letters"}}': 1,
                f"sum(mailq_queue_mails{{{worker}}})": 1,
            }
            assert {
                query: prometheus_server.await_value(query, want) for query, want in expected.items()
            } == (expected)
