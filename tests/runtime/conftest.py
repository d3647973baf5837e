"""Fixtures of the runtime contract suite: every test runs once per deployment (backends.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mailq_runtime import Runtime
from mailq_runtime.queue import MailQueue, dequeuer
from mailq_runtime.stores.cassandra import slice_counts

from .backends import Backend, open_backend
from .helpers import FakeClock

QUEUE = "spool"


# Every contract test runs on the embedded deployment and on the distributed one (Cassandra + S3 +
# RabbitMQ). A module whose contract also holds Cassandra + S3 with the embedded broker (one machine
# without RabbitMQ) lists its deployments in DEPLOYMENTS; the other modules would repeat the distributed
# run there, as their subject is not the broker.
DEPLOYMENTS = ("embedded", "rabbitmq")
WITH_EMBEDDED_BROKER = ("embedded", "cassandra", "rabbitmq")
# The modules whose subject is the broker's contract (deliveries, leases, priorities, dead letters) run
# on RabbitMQ's quorum queues too.
WITH_QUORUM_QUEUES = (*DEPLOYMENTS, "rabbitmq-quorum")
WITH_EVERY_BROKER = (*WITH_EMBEDDED_BROKER, "rabbitmq-quorum")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        deployments = getattr(metafunc.module, "DEPLOYMENTS", DEPLOYMENTS)
        metafunc.parametrize("backend", deployments, indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest, tmp_path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Backend]:
    with open_backend(request, tmp_path, monkeypatch) as opened:
        yield opened


@pytest.fixture
def runtime(backend: Backend) -> Runtime:
    return backend.open()


@pytest.fixture
def queue(runtime: Runtime) -> MailQueue:
    return runtime.queue(QUEUE)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def clocked_runtime(backend: Backend, clock: FakeClock) -> Runtime:
    """A runtime on the fake clock: 1 s slices, no clock-skew grace, browse_start moved only on request."""
    return backend.open(clock, slice_window="1s", clock_skew_grace="0s", update_browse_start_pace=10**9)


@pytest.fixture
def clocked(clocked_runtime: Runtime) -> MailQueue:
    return clocked_runtime.queue(QUEUE)


@pytest.fixture
def settling(monkeypatch: pytest.MonkeyPatch) -> float:
    """Counts that settle within a fraction of a second (stores/cassandra/slice_counts.py) and a recount at
    every dequeue: the seconds after which what was counted has settled."""
    monkeypatch.setattr(slice_counts, "EPOCH", 0.1)
    monkeypatch.setattr(slice_counts, "SETTLE", 0.2)
    monkeypatch.setattr(dequeuer, "RECOUNT_INTERVAL", 0.0)
    return 0.4
