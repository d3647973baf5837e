"""Fixtures of the SMTP server's tests: a store with one local user on each deployment, and `mailq smtp`'s
server running in this process on a free loopback port, for clients no one here wrote (smtplib, swaks)."""

from __future__ import annotations

import asyncio
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from mailq_runtime import Runtime
from mailq_runtime.queue import MailQueue
from mailq_runtime.smtp.access import parse_networks
from mailq_runtime.smtp.defaults import DEFAULT_NETWORKS
from mailq_runtime.smtp.handler import Policy
from mailq_runtime.smtp.server import ServerOptions, SmtpServer, run
from tests.runtime.backends import Backend, open_backend

USER = "alice@example.org"
DOMAIN = "example.org"
HOSTNAME = "mx.example.org"
QUEUE = "spool"
DEPLOYMENTS = ("embedded", "rabbitmq")


@dataclass
class Running:
    """A server serving in this process: its port, its runtime (the tests' window on the queue)."""

    port: int
    runtime: Runtime
    server: SmtpServer

    @property
    def queue(self) -> MailQueue:
        return self.runtime.queue(QUEUE)

    def size(self) -> int:
        """The mails the queue holds: 0 also while no mail has created it."""
        return self.queue.size() if QUEUE in self.runtime.queues() else 0


def options(**changes: object) -> ServerOptions:
    policy = Policy(
        hostname=HOSTNAME,
        local_domains=frozenset({DOMAIN}),
        networks=parse_networks(DEFAULT_NETWORKS),
        max_recipients=int(changes.pop("max_recipients", 1000)),  # type: ignore[call-overload]
    )
    return replace(ServerOptions(policy=policy, queue=QUEUE), **changes)  # type: ignore[arg-type]


@contextmanager
def serving(url: str, **changes: object) -> Iterator[Running]:
    """`mailq smtp`'s server on `url`'s store (which must exist), in a thread with its own event loop."""
    runtime = Runtime.open(url)
    server = SmtpServer(runtime, options(**changes))
    bound: list[tuple[str, int]] = []
    ready = threading.Event()
    loop_box: list[asyncio.AbstractEventLoop] = []
    stop_box: list[asyncio.Event] = []

    async def main() -> None:
        loop_box.append(asyncio.get_running_loop())
        stop_box.append(asyncio.Event())
        await server.serve(
            ("127.0.0.1", 0), stop_box[0], lambda address: (bound.append(address), ready.set())
        )

    failure: list[BaseException] = []

    def serve_in_thread() -> None:
        try:
            run(main())
        except BaseException as error:  # shown by the test, not lost in the thread
            failure.append(error)
            ready.set()

    thread = threading.Thread(target=serve_in_thread, name="mailq-smtp-test", daemon=True)
    thread.start()
    assert ready.wait(30) and not failure, failure
    try:
        yield Running(bound[0][1], runtime, server)
    finally:
        loop_box[0].call_soon_threadsafe(stop_box[0].set)
        thread.join(60)
        runtime.close()
        assert not thread.is_alive() and not failure, failure


def make_store(url: str) -> None:
    """The store, and the local user's INBOX (what `mailq schema create` and `mailq users add` make)."""
    with Runtime.open(url, create=True) as runtime:
        runtime.mailboxes.create(USER, "INBOX")


@pytest.fixture(params=DEPLOYMENTS)
def backend(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Backend]:
    with open_backend(request, tmp_path, monkeypatch) as opened:
        yield opened


@pytest.fixture
def embedded_url(tmp_path: Path) -> str:
    url = f"embedded://{tmp_path / 'data'}"
    make_store(url)
    return url


@pytest.fixture
def serve(embedded_url: str) -> Callable[..., contextmanager]:
    """The server on the embedded store, with options changed: `with serve(max_sessions=2) as running`."""
    return lambda **changes: serving(embedded_url, **changes)


@pytest.fixture
def running(serve) -> Iterator[Running]:
    with serve() as opened:
        yield opened


@pytest.fixture(scope="session")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate and its key for STARTTLS."""
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={HOSTNAME}"]
        + ["-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    return cert, key
