"""`mailq worker --relay` SIGKILLed in the middle of an SMTP session: the mail is never lost, and is
delivered again only to the recipients the queue does not record as done."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from mailq_servers.smtp_sink import SmtpSink
from tests.smtp.helpers import mailq_command

from .conftest import HOSTNAME, LOCAL, QUEUE, send, wait_until


def _worker(url: str, dns_address: str, mx_port: int, log: Path) -> subprocess.Popen:
    command = mailq_command(
        url,
        "worker",
        "--queue",
        QUEUE,
        "--domain",
        LOCAL,
        "--relay",
        "--resolver",
        dns_address,
        "--mx-port",
        str(mx_port),
        "--retry-first",
        "1s",
        "--retry-longest",
        "1s",
        "--hostname",
        HOSTNAME,
    )
    with log.open("ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=out)


def test_a_worker_killed_in_a_session_delivers_again_only_to_the_recipients_left(
    url, runtime, dns, mx_port, tmp_path
):
    log = tmp_path / "worker.log"
    send(runtime, "bob@one.test", "carol@two.test")
    with SmtpSink(mx_port) as one:
        # First attempt: bob is delivered, carol deferred (her queue copy now names her alone).
        with SmtpSink(mx_port, host="127.0.0.2", soft=["RCPT"]):
            first = _worker(url, dns.address, mx_port, log)
            wait_until(lambda: "to=<carol@two.test>" in log.read_text())
        # The retry's session hangs before answering DATA, and the worker dies in it.
        with SmtpSink(mx_port, host="127.0.0.2", data_wait=60) as hanging:
            wait_until(lambda: hanging.dumped())
            first.send_signal(signal.SIGKILL)
            first.wait(10)
        assert runtime.queue(QUEUE).size() == 1  # not lost
        with SmtpSink(mx_port, host="127.0.0.2") as two:
            second = _worker(url, dns.address, mx_port, log)
            try:
                wait_until(lambda: two.dumped())
                wait_until(lambda: runtime.queue(QUEUE).size() == 0)
            finally:
                second.send_signal(signal.SIGTERM)
                assert second.wait(30) == 0, log.read_text()
    assert [d.recipients for d in one.dumped()] == [("<bob@one.test>",)]
    assert [d.recipients for d in two.dumped()] == [("<carol@two.test>",)]
    assert "to=<carol@two.test>, relay=mx.two.test[127.0.0.2]" in log.read_text()
    assert "status=sent" in log.read_text().split("to=<carol@two.test>")[-1]
