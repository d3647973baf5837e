"""Fixtures of remote delivery's tests: a DNS server (dnsmasq) serving the test domains, smtp-sink as
their mail exchangers on loopback addresses, an embedded store with a local sender, and the worker run
with remote delivery on a short retry schedule."""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email import message_from_bytes
from email.message import Message
from pathlib import Path

import pytest

from mailq_runtime import Runtime
from mailq_runtime.model import Mail
from mailq_runtime.relay import RemoteDelivery, RetrySchedule, Router
from mailq_runtime.worker import WorkerStats, run_worker
from mailq_servers.dnsmasq import DnsServer, Zone
from tests.smtp.helpers import free_port

SENDER = "alice@example.org"
LOCAL = "example.org"
QUEUE = "spool"
HOSTNAME = "relay.example.org"
# The mail exchangers of the test domains: one.test's on 127.0.0.1, two.test's on 127.0.0.2; down.test's
# first exchanger (127.0.0.3) never answers, its second is 127.0.0.1.
ZONE = Zone(
    mx={
        "one.test": [(10, "mx.one.test")],
        "two.test": [(10, "mx.two.test")],
        "down.test": [(10, "mx1.down.test"), (20, "mx2.down.test")],
    },
    addresses={
        "mx.one.test": "127.0.0.1",
        "mx.two.test": "127.0.0.2",
        "mx1.down.test": "127.0.0.3",
        "mx2.down.test": "127.0.0.1",
        "bare.test": "127.0.0.1",
    },
    null_mx=["nullmx.test"],
)
# Seconds: Postfix's schedule (300 s doubling up to 4,000 s) shrunk for tests.
SCHEDULE = RetrySchedule.of("1s", "2s", "5d")


@pytest.fixture
def dns(tmp_path: Path) -> Iterator[DnsServer]:
    with DnsServer(tmp_path / "dns", free_port(), ZONE) as server:
        yield server


@pytest.fixture
def mx_port() -> int:
    return free_port()


@pytest.fixture
def url(tmp_path: Path) -> str:
    # A short lease: a killed worker's mail comes back within seconds.
    url = f"embedded://{tmp_path / 'data'}?visibility_timeout=3s"
    with Runtime.open(url, create=True) as runtime:
        runtime.mailboxes.create(SENDER, "INBOX")
    return url


@pytest.fixture
def runtime(url: str) -> Iterator[Runtime]:
    with Runtime.open(url) as opened:
        yield opened


def send(runtime: Runtime, *recipients: str, sender: str | None = SENDER) -> str:
    message = (
        b"From: alice@example.org\r\nSubject: for far away\r\nMessage-ID: <m1@example.org>\r\n\r\nhello\r\n"
    )
    return runtime.queue(QUEUE).enqueue(Mail(recipients, message, sender=sender))


@dataclass
class Worker:
    """`run_worker` with remote delivery in a thread, until `stop()`."""

    stop_event: threading.Event
    thread: threading.Thread
    relay: RemoteDelivery
    stats: list[WorkerStats]

    def stop(self) -> WorkerStats:
        self.stop_event.set()
        self.thread.join(30)
        assert not self.thread.is_alive() and self.stats
        self.relay.close()
        return self.stats[0]


@pytest.fixture
def start_worker(runtime: Runtime, dns: DnsServer, mx_port: int) -> Iterator[Callable[..., Worker]]:
    started: list[Worker] = []

    def start(schedule: RetrySchedule = SCHEDULE, transport: dict[str, str] | None = None) -> Worker:
        router = Router(transport, dns.address, mx_port)
        relay = RemoteDelivery(runtime.queue(QUEUE), router, schedule, HOSTNAME, runtime.clock)
        stop, stats = threading.Event(), []
        thread = threading.Thread(
            target=lambda: stats.append(
                run_worker(runtime, QUEUE, local_domains=[LOCAL], stop=stop, relay=relay)
            ),
            daemon=True,
        )
        thread.start()
        worker = Worker(stop, thread, relay, stats)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop_event.set()
        worker.thread.join(30)
        worker.relay.close()


def wait_until(
    condition: Callable[[], object], timeout: float = 30.0, state: Callable[[], str] = lambda: ""
) -> None:
    """Until `condition` holds; past `timeout`, fails with what `state` tells of the moment."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out {state()}".strip()
        time.sleep(0.1)


def inbox(runtime: Runtime, user: str = SENDER) -> list[Message]:
    mailboxes = runtime.mailboxes
    box = mailboxes.get_or_create(user, "INBOX")
    return [message_from_bytes(mailboxes.read(box, e.uid)) for e in mailboxes.list_messages(box)]


@pytest.fixture(scope="session")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate and its key, for a mail exchanger's STARTTLS."""
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=mx.pf.test"]
        + ["-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    # Postfix's smtpd reads them as the user postfix.
    directory.chmod(0o755)
    cert.chmod(0o644)
    key.chmod(0o644)
    return cert, key


@pytest.fixture
def relay_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="mailq_runtime.relay")
    return caplog


def statuses(caplog: pytest.LogCaptureFixture, recipient: str) -> list[str]:
    """The status of each logged attempt for `recipient`, in order."""
    lines = [r.getMessage() for r in caplog.records if r.name == "mailq_runtime.relay"]
    return [line.split("status=")[1].split()[0] for line in lines if f"to=<{recipient}>" in line]
