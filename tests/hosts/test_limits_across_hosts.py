"""Per-destination limits across worker hosts: `mailq worker --relay` on worker1 and on worker2, sharing
the bed's deployment, never hold more sessions to one destination than its limit, counted by a sink on
the bed's bridge."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from mailq_runtime import Runtime
from mailq_runtime.model import Mail
from mailq_servers.counting_sink import counting_sink
from mailq_servers.host_bed import HostBed
from mailq_servers.hosts import BRIDGE_ADDRESS

from .conftest import mailq_on

QUEUE = "spool"
MESSAGE = b"From: alice@example.org\r\nSubject: limits\r\n\r\nhello\r\n"
SINK_PORT = 2527
MAILS = 24
WORKER_HOSTS = ("worker1", "worker2")


def wait_until(condition: Callable[[], object], timeout: float, state: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out: {state()}"
        time.sleep(0.5)


def test_two_workers_on_two_hosts_never_open_more_connections_than_the_limit(
    host_bed: HostBed, bed_url: str, bed_env: dict[str, str], bed_client: None, tmp_path: Path
):
    with Runtime.open(bed_url, create=True) as runtime:
        queue = runtime.queue(QUEUE)
        for n in range(MAILS):
            queue.enqueue(Mail((f"bob{n}@one.test",), MESSAGE, sender="alice@example.org"))
    options = ["--threads", "3", "--destination-concurrency", "2", "--domain", "example.org", "--relay"]
    options += ["--transport", f"one.test={BRIDGE_ADDRESS}:{SINK_PORT}", "--retry-first", "1s"]
    options += ["--retry-longest", "1s"]
    logs = {host: tmp_path / f"{host}.log" for host in WORKER_HOSTS}
    # Each mail holds its session 0.3 s: six threads on two hosts would open six sessions without the limit.
    with counting_sink(SINK_PORT, host=BRIDGE_ADDRESS, data_wait=0.3) as sink:
        workers = []
        for host in WORKER_HOSTS:
            with logs[host].open("w") as out:
                argv = mailq_on(host_bed, host, bed_url, "worker", "--queue", QUEUE, *options)
                workers.append(subprocess.Popen(argv, env=bed_env, stdout=out, stderr=out))
        try:
            with Runtime.open(bed_url) as runtime:
                wait_until(
                    lambda: len(sink.recipients) == MAILS and runtime.queue(QUEUE).size() == 0,
                    timeout=180,
                    state=lambda: f"{len(sink.recipients)} taken, size {runtime.queue(QUEUE).size()}",
                )
        finally:
            for worker in workers:
                worker.send_signal(signal.SIGTERM)
            statuses = [worker.wait(60) for worker in workers]
    said = {host: logs[host].read_text() for host in WORKER_HOSTS}
    assert statuses == [0, 0], said
    assert sorted(sink.recipients) == sorted(f"bob{n}@one.test" for n in range(MAILS))
    assert sink.most_sessions == 2  # the limit bound, and held across the hosts
    # Both hosts delivered, and were throttled at times: the limit is the deployment's, not a host's.
    assert all("status=sent" in text for text in said.values()), said
    throttled = [line for line in "".join(said.values()).splitlines() if "status=throttled (" in line]
    assert throttled and all(line.endswith(": 2 connections open)") for line in throttled), said
