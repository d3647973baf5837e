"""`mailq smtp` under Postfix's load generator `smtp-source` (Debian's postfix, which the harness installs
when the machine lacks it), and the enqueue id an operator follows from the server's log line to the
worker's delivery line."""

from __future__ import annotations

import re
import subprocess
from functools import cache

from mailq_runtime.worker import run_worker
from mailq_servers.system_packages import system_program

from .conftest import DOMAIN, QUEUE, USER
from .helpers import MESSAGE, SENDER, SmtpProcess, client, free_port, mailq_command


@cache
def smtp_source_program() -> str:
    return system_program("smtp-source")


def smtp_source(port: int, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [smtp_source_program(), *options, "-f", SENDER, f"127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_every_mail_of_smtp_source_is_enqueued_once_and_delivered(running):
    sent = smtp_source(running.port, "-s", "5", "-m", "50", "-l", "10240", "-t", USER)
    assert sent.returncode == 0, sent.stderr
    assert running.server.handler.accepted == 50
    enqueued = list(running.queue.browse())
    assert len({item.enqueue_id for item in enqueued}) == 50
    assert all(item.recipients == [USER] and item.sender == SENDER for item in enqueued)
    stats = run_worker(running.runtime, QUEUE, local_domains=[DOMAIN], idle_timeout=2)
    assert (stats.delivered, stats.appended, stats.retried, stats.dead_lettered) == (50, 50, 0, 0)
    mailboxes = running.runtime.mailboxes
    inbox = mailboxes.get(USER, "INBOX")
    assert mailboxes.counters(inbox.id).count == 50
    assert running.size() == 0


def test_smtp_source_to_a_user_that_does_not_exist_enqueues_nothing(running):
    sent = smtp_source(running.port, "-s", "2", "-m", "10", "-t", f"nobody@{DOMAIN}")
    assert sent.returncode != 0 and "550 5.1.1 <nobody@example.org>" in sent.stderr, sent.stderr
    assert running.server.handler.accepted == 0
    assert running.size() == 0


def test_the_enqueue_id_of_the_server_log_is_in_the_worker_delivery_line(embedded_url):
    url = embedded_url
    port = free_port()
    server = SmtpProcess(
        mailq_command(url, "smtp", "--listen", f"127.0.0.1:{port}", "--domain", DOMAIN), port
    )
    with client(port) as smtp:
        smtp.sendmail(SENDER, [USER], MESSAGE)
    assert server.stop()[0] == 0
    [accepted] = [line for line in server.log if "client=unknown[127.0.0.1]" in line]
    enqueue_id = accepted.split(": ")[1]
    worker = subprocess.run(
        mailq_command(url, "worker", "--domain", DOMAIN, "--idle-exit", "2s"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert worker.returncode == 0, worker.stderr
    line = rf"mailq/worker\[\d+\]: {enqueue_id}: to=<{USER}>, delay=\d+\.\d\d, attempts=1, status=sent "
    assert re.search(line + r"\(delivered to INBOX\)$", worker.stderr, re.MULTILINE), worker.stderr
