"""Fixtures of the runtime contract suite: every test runs once per deployment (backends.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mailq_runtime import Runtime
from mailq_runtime.queue import MailQueue

from .backends import Backend, CassandraBackend, CassandraS3, EmbeddedBackend, RabbitMQBackend
from .helpers import FakeClock

QUEUE = "spool"


@pytest.fixture(scope="session")
def cassandra_s3(cassandra_server, s3_server) -> Iterator[CassandraS3]:
    cluster = cassandra_server.cluster()
    s3 = s3_server.client()
    yield CassandraS3(cassandra_server, s3_server, cluster.connect(), s3)
    cluster.shutdown()
    s3.close()


# Every contract test runs on the embedded deployment and on the distributed one (Cassandra + S3 +
# RabbitMQ). A module whose contract also holds Cassandra + S3 with the embedded broker (one machine
# without RabbitMQ) lists its deployments in DEPLOYMENTS; the other modules would repeat the distributed
# run there, as their subject is not the broker.
DEPLOYMENTS = ("embedded", "rabbitmq")
WITH_EMBEDDED_BROKER = ("embedded", "cassandra", "rabbitmq")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        deployments = getattr(metafunc.module, "DEPLOYMENTS", DEPLOYMENTS)
        metafunc.parametrize("backend", deployments, indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest, tmp_path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Backend]:
    if request.param == "embedded":
        opened: Backend = EmbeddedBackend(tmp_path / "data")
    else:
        servers: CassandraS3 = request.getfixturevalue("cassandra_s3")
        # The AWS chain finds the harness's keys, in this process and the agents it starts.
        for variable in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
            monkeypatch.delenv(variable, raising=False)
        for variable, value in servers.s3_server.env().items():
            monkeypatch.setenv(variable, value)
        keyspace, bucket = request.getfixturevalue("keyspace_name"), request.getfixturevalue("bucket_name")
        if request.param == "cassandra":
            opened = CassandraBackend(tmp_path / "broker", servers, keyspace, bucket)
        else:
            vhosts = request.getfixturevalue("rabbitmq_vhosts")
            opened = RabbitMQBackend(
                servers, keyspace, bucket, request.getfixturevalue("rabbitmq_server"), vhosts.take(), vhosts
            )
        opened.empty()
    yield opened
    opened.close()


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
