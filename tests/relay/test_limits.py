"""Per-destination limits across worker processes: two `mailq worker --relay` processes
deliver to a sink on loopback that counts the sessions open at once and when each mail arrived; on the
embedded deployment (one SQLite file shared by the processes) and the distributed one (Cassandra)."""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, closing
from pathlib import Path

import pytest

from mailq_runtime import Runtime
from mailq_runtime.model import Mail
from mailq_runtime.relay.client import send
from mailq_runtime.relay.connections import Connections
from mailq_runtime.relay.limits import (
    LEASE,
    WAIT,
    Destination,
    DestinationLimits,
    Limit,
    Limiter,
    Rate,
    Throttled,
)
from mailq_runtime.relay.routes import Target
from mailq_servers.counting_sink import counting_sink
from mailq_servers.s3 import remove_bucket
from mailq_servers.urls import distributed_url
from tests.servers.fixtures import fresh_bucket_name, fresh_keyspace
from tests.smtp.helpers import mailq_command

from .conftest import HOSTNAME, LOCAL, QUEUE, SENDER, wait_until

MESSAGE = b"From: alice@example.org\r\nSubject: limits\r\n\r\nhello\r\n"
# The rate and the slots' leases are timed across worker processes: measured with the machine to themselves.
pytestmark = pytest.mark.alone


@pytest.fixture(params=["embedded", "cassandra"])
def limits_url(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A deployment the workers share, with a short lease: a killed worker's mail comes back soon."""
    if request.param == "embedded":
        yield f"embedded://{tmp_path / 'data'}?visibility_timeout=3s"
        return
    servers = request.getfixturevalue("cassandra_s3")
    for variable, value in servers.s3_server.env().items():
        monkeypatch.setenv(variable, value)  # the workers' too
    with fresh_keyspace(servers.cassandra_server) as keyspace:
        bucket = fresh_bucket_name()
        broker = f"embedded:{tmp_path / 'broker'}"
        yield distributed_url(
            servers.cassandra_server, servers.s3_server, keyspace, bucket, broker, visibility_timeout="3s"
        )
        remove_bucket(servers.s3, bucket)


def _enqueue(url: str, recipients: list[str]) -> None:
    with Runtime.open(url, create=True) as runtime:
        queue = runtime.queue(QUEUE)
        for recipient in recipients:
            queue.enqueue(Mail((recipient,), MESSAGE, sender="alice@example.org"))


def _queued(url: str) -> int:
    with Runtime.open(url) as runtime:
        return runtime.queue(QUEUE).size()


def _queue_state(url: str) -> str:
    """The queue's size beside what a browse finds: what a failed wait for the queue to empty shows."""
    with Runtime.open(url) as runtime:
        queue = runtime.queue(QUEUE)
        return f"size {queue.size()}, browsed {[item.recipients for item in queue.browse()]}"


def _worker(url: str, log: Path, *options: str) -> subprocess.Popen:
    command = mailq_command(
        url,
        "worker",
        "--queue",
        QUEUE,
        "--domain",
        LOCAL,
        "--relay",
        "--retry-first",
        "1s",
        "--retry-longest",
        "1s",
        "--hostname",
        HOSTNAME,
        *options,
    )
    with log.open("ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=out)


def _stop(workers: list[subprocess.Popen], log: Path) -> None:
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(30) == 0, log.read_text()


def test_two_workers_never_open_more_connections_than_the_limit(limits_url, dns, mx_port, tmp_path):
    log = tmp_path / "workers.log"
    mails = 24
    _enqueue(limits_url, [f"bob{n}@one.test" for n in range(mails)])
    options = ["--resolver", dns.address, "--mx-port", str(mx_port), "--threads", "3"]
    # Each mail holds its session 0.3 s: six threads would open six sessions without the limit.
    with counting_sink(mx_port, data_wait=0.3) as sink, ExitStack() as stack:
        workers = [_worker(limits_url, log, "--destination-concurrency", "2", *options) for _ in range(2)]
        stack.callback(lambda: [w.kill() for w in workers if w.poll() is None])
        wait_until(lambda: len(sink.recipients) == mails, timeout=120)
        wait_until(lambda: _queued(limits_url) == 0, state=lambda: _queue_state(limits_url))
        _stop(workers, log)
    assert sorted(sink.recipients) == sorted(f"bob{n}@one.test" for n in range(mails))
    assert sink.most_sessions == 2  # the limit bound, and held
    assert "status=throttled (one.test: 2 connections open)" in log.read_text()


def test_two_workers_keep_to_the_rate(limits_url, mx_port, tmp_path):
    log = tmp_path / "workers.log"
    mails, rate = 16, 4
    _enqueue(limits_url, [f"bob{n}@one.test" for n in range(mails)])
    options = ["--transport", f"one.test=127.0.0.1:{mx_port}", "--threads", "2"]
    options += ["--destination-concurrency", "0", "--destination-rate", f"{rate}/s"]
    with counting_sink(mx_port) as sink, ExitStack() as stack:
        workers = [_worker(limits_url, log, *options) for _ in range(2)]
        stack.callback(lambda: [w.kill() for w in workers if w.poll() is None])
        wait_until(lambda: len(sink.recipients) == mails, timeout=120)
        _stop(workers, log)
    arrivals = sink.arrivals
    # Four windows (seconds) at least, from anywhere in the first to the start of the last.
    assert len({int(arrival) for arrival in arrivals}) >= mails / rate
    assert arrivals[-1] - arrivals[0] > mails / rate - 2
    # A window's mails arrive in its second, but for one sent at its very end and arriving in the next.
    assert sink.most_in_a_second() <= rate + 1


def test_a_killed_workers_slot_comes_back(limits_url, mx_port, tmp_path):
    log = tmp_path / "workers.log"
    _enqueue(limits_url, ["bob@one.test"])
    options = ["--transport", f"one.test=127.0.0.1:{mx_port}", "--destination-concurrency", "1"]
    with counting_sink(mx_port, data_wait=60) as hanging:
        first = _worker(limits_url, log, *options)
        wait_until(lambda: hanging.most_sessions == 1)
        time.sleep(1)  # into DATA, its slot taken
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        killed = time.monotonic()
    with counting_sink(mx_port) as sink:
        second = _worker(limits_url, log, *options)
        try:
            wait_until(lambda: sink.recipients, timeout=LEASE / 1e6 + 30)
            came_back = time.monotonic() - killed
        finally:
            _stop([second], log)
    assert sink.recipients == ["bob@one.test"]
    # The dead worker's slot held the second one off until its lease ran out: LEASE after its last
    # renewal, which came at most a third of LEASE before the kill.
    assert "status=throttled ([127.0.0.1]" in log.read_text()
    assert came_back >= LEASE * 2 / 3 / 1e6 - 0.5


@pytest.mark.parametrize(
    ("option", "complaint"),
    [
        (["--destination-rate", "1.5"], "invalid rate '1.5'"),
        (["--destination-rate", "5/d"], "invalid rate '5/d'"),
        (["--destination-concurrency", "-2"], "invalid concurrency '-2'"),
        (["--domain-rate", "example.net"], "invalid rate entry 'example.net': DOMAIN=RATE"),
        (["--domain-concurrency", "bad_domain=3"], "invalid domain 'bad_domain'"),
    ],
)
def test_bad_limits_are_refused_in_one_line(option, complaint, tmp_path):
    url = f"embedded://{tmp_path / 'data'}"
    command = mailq_command(url, "worker", "--domain", LOCAL, "--relay", *option)
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert complaint in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "data").exists()  # nothing made


def test_a_domains_own_limits_on_the_store(tmp_path):
    limits = DestinationLimits.of(concurrency=3, rate="2/h", domains={"Small.test": {"concurrency": 1}})
    small = limits.of_domain("small.test")
    assert small == Limit(1, Rate(2, 3600 * 1_000_000)) and limits.of_domain("big.test").concurrency == 3
    with (
        Runtime.open(f"embedded://{tmp_path / 'data'}", create=True) as runtime,
        closing(Limiter(runtime.queue_backends.destinations, limits, runtime.clock)) as limiter,
    ):
        first = limiter.slot("small.test", small)
        assert first is not None and first.number == 0
        started = time.monotonic()
        assert limiter.slot("small.test", small) is None  # after waiting for one to come free
        assert time.monotonic() - started >= WAIT - 0.2
        limiter.free(first)
        again = limiter.slot("small.test", small)
        assert again is not None and again.number == 0
        assert [limiter.send("small.test", small) for _ in range(2)] == [None, None]
        third = limiter.send("small.test", small)  # the hour's window is full: no wait for the next
        assert isinstance(third, Throttled) and third.limit == "rate"
        assert 0 < third.delay <= 3600 * 1_000_000


def test_a_session_whose_slot_was_lost_starts_no_transaction(tmp_path, mx_port, caplog):
    """A worker's renewal comes late: its slot's row expired and another worker took the slot. The
    session it kept for its next mail starts no transaction there: that mail waits for a slot, which the
    other worker holds, and is throttled; the limit (one connection) holds."""
    limits = DestinationLimits.of(concurrency=1)
    limit = limits.of_domain("one.test")
    target = Target("mx.one.test", "127.0.0.1", mx_port)
    with (
        Runtime.open(f"embedded://{tmp_path / 'data'}", create=True) as runtime,
        closing(Limiter(runtime.queue_backends.destinations, limits, runtime.clock)) as late,
        # The other worker's clock is past the first one's lease: to it, that slot's row has expired.
        closing(
            Limiter(runtime.queue_backends.destinations, limits, lambda: runtime.clock() + 2 * LEASE)
        ) as other,
        counting_sink(mx_port) as sink,
    ):
        destination = Destination("one.test", limit, late)
        sessions = Connections(late, idle_limit=60)  # kept past the renewal
        sent = send([target], destination, SENDER, ["bob@one.test"], MESSAGE, HOSTNAME, sessions)
        assert sent["bob@one.test"].code == 250
        taken = other.slot("one.test", limit)
        assert taken is not None and taken.number == 0
        with caplog.at_level(logging.WARNING, logger="mailq_runtime.relay"):
            wait_until(lambda: "lost a slot at one.test" in caplog.text, timeout=LEASE / 1e6)
        again = send([target], destination, SENDER, ["carol@one.test"], MESSAGE, HOSTNAME, sessions)
        sessions.close()
    assert isinstance(again, Throttled) and again.limit == "connections"
    assert sink.recipients == ["bob@one.test"]
