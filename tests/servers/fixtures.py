"""pytest fixtures for tests against the real servers, registered for the whole suite by tests/conftest.py.

Each server fixture is session-scoped: it makes sure the server runs, through the same code as
`python -m mailq_servers up` (reusing a running one), and yields how to reach it. A server that cannot
start fails the tests that need it, with the reason; none is ever skipped. `keyspace_name` and
`bucket_name` give each test session its own keyspace and bucket on the shared servers.

The suite asks for the servers' fast, unsafe mode (MAILQ_SERVERS_UNSAFE=1, unless the environment says
otherwise): a single Cassandra node that skips syncs, fine for tests that never crash it. The
`cassandra_cluster` fixture is module-scoped instead: the three nodes run only beside the tests that
need them, and durable, as their fault tests kill nodes; so is `host_bed`, the hosts of the bed."""

from __future__ import annotations

import os
import secrets
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from mailq_servers import SERVERS, ServerError, ensure
from mailq_servers.base import UNSAFE_VARIABLE, Running, Server
from mailq_servers.cassandra import CassandraServer
from mailq_servers.cassandra_cluster import CassandraCluster, CassandraClusterServer
from mailq_servers.prometheus import Prometheus, PrometheusServer
from mailq_servers.rabbitmq import RabbitMQ, RabbitMQServer, Vhosts
from mailq_servers.s3 import S3Server, remove_bucket
from mailq_servers.spark import SparkCluster
from mailq_servers.tls_servers import CassandraClusterTLS, RabbitMQClusterTLS, RabbitMQTLS
from tests.runtime.backends import CassandraS3

os.environ.setdefault(UNSAFE_VARIABLE, "1")


def fresh_keyspace_name() -> str:
    """A keyspace name no other session uses (the time in it tells old leftovers apart)."""
    return f"mailq_test_{int(time.time())}_{secrets.token_hex(3)}"


def fresh_bucket_name() -> str:
    return f"mailq-test-{int(time.time())}-{secrets.token_hex(3)}"


@contextmanager
def untimed() -> Iterator[None]:
    """pytest-timeout's alarm also runs during fixture set-up, and a cold install takes minutes that are
    not the test's: hold the alarm while installing, and give the test its full time afterwards."""
    remaining, interval = signal.getitimer(signal.ITIMER_REAL)
    signal.setitimer(signal.ITIMER_REAL, 0)
    try:
        yield
    finally:
        if remaining:
            signal.setitimer(signal.ITIMER_REAL, remaining, interval)


@contextmanager
def held_for_the_tests(server: Server) -> Iterator[Running]:
    """`server` running for the tests of a fixture's scope (started untimed if it is not, failing those
    tests with the reason if it cannot start), and stopped after them unless it was running before."""
    try:
        with untimed():
            running, did = server.ensure()
    except ServerError as error:
        pytest.fail(f"{server.name} could not start: {error}", pytrace=False)
    yield running
    if did.startswith(("started", "installed")):
        server.stop()


def _server(name: str):
    try:
        if SERVERS[name]().installed():
            return ensure(name)
        with untimed():
            return ensure(name)
    except ServerError as error:
        reason = str(error)
    pytest.fail(f"{name} could not start: {reason}", pytrace=False)


@pytest.fixture(scope="module")
def cassandra_cluster() -> Iterator[CassandraClusterServer]:
    """The three-node cluster, started for this module's tests (with every node up: one a test left
    down is restarted) and stopped after them, unless it was running before they began."""
    with held_for_the_tests(CassandraCluster()) as running:
        yield CassandraClusterServer(**running.facts)


@pytest.fixture(scope="module")
def cassandra_cluster_tls() -> Iterator[CassandraClusterServer]:
    """The three-node cluster with TLS on every link, as `cassandra_cluster` starts and stops its own."""
    with held_for_the_tests(CassandraClusterTLS()) as running:
        yield CassandraClusterServer(**running.facts)


@pytest.fixture(scope="module")
def rabbitmq_cluster_tls(rabbitmq_server: RabbitMQServer) -> Iterator[RabbitMQClusterTLS]:
    """The three-node RabbitMQ cluster whose nodes speak TLS to each other, for this module's tests
    (rabbitmq_server first: it installs RabbitMQ when missing), stopped after them unless it ran before."""
    cluster = RabbitMQClusterTLS()
    with held_for_the_tests(cluster):
        yield cluster


@pytest.fixture(scope="module")
def prometheus_server() -> Iterator[PrometheusServer]:
    """The Prometheus server, for this module's tests, stopped after them unless it ran before."""
    with held_for_the_tests(Prometheus()) as running:
        yield PrometheusServer(**running.facts)


def pytest_collection_finish(session: pytest.Session) -> None:
    """A Spark session gives its Python workers the environment of the process at its start, and any
    test may start this process's session (the pipeline's own, or a command run in-process). So when the
    run holds tests on the distributed deployment, the harness's S3 keys go into the environment before
    any test does, for the tasks that list and delete content. A server that cannot start is for the
    fixtures of the tests that need it to report."""
    distributed = any(
        getattr(item, "callspec", None) is not None
        and item.callspec.params.get("backend", "embedded") != "embedded"
        for item in session.items
    )
    if not distributed:
        return
    try:
        s3 = ensure("s3")
    except ServerError:
        return
    os.environ["AWS_ACCESS_KEY_ID"] = s3.access_key_id
    os.environ["AWS_SECRET_ACCESS_KEY"] = s3.secret_access_key


@pytest.fixture(scope="session")
def cassandra_server() -> CassandraServer:
    return _server("cassandra")


@contextmanager
def fresh_keyspace(cassandra_server: CassandraServer) -> Iterator[str]:
    """A fresh keyspace name (not created); the keyspace is dropped at the end if it was."""
    name = fresh_keyspace_name()
    yield name
    cluster = cassandra_server.cluster()
    try:
        cluster.connect().execute(f"DROP KEYSPACE IF EXISTS {name}", timeout=120)
    finally:
        cluster.shutdown()


@pytest.fixture(scope="session")
def keyspace_name(cassandra_server: CassandraServer) -> Iterator[str]:
    """This session's keyspace name, dropped at the end."""
    with fresh_keyspace(cassandra_server) as name:
        yield name


@pytest.fixture(scope="session")
def s3_server() -> S3Server:
    return _server("s3")


@pytest.fixture(scope="session")
def bucket_name(s3_server: S3Server) -> Iterator[str]:
    """A fresh bucket name for this session (not created); the bucket is emptied and removed at the end."""
    name = fresh_bucket_name()
    yield name
    remove_bucket(s3_server.client(), name)


@pytest.fixture(scope="session")
def rabbitmq_server() -> RabbitMQServer:
    return _server("rabbitmq")


@pytest.fixture(scope="session")
def rabbitmq_vhosts(rabbitmq_server: RabbitMQServer) -> Iterator[Vhosts]:
    """Fresh virtual hosts on the harness's RabbitMQ node (`take()`), deleted at the session's end."""
    vhosts = Vhosts(RabbitMQ(), rabbitmq_server.username)
    yield vhosts
    vhosts.delete_all()


@pytest.fixture(scope="session")
def cassandra_s3(cassandra_server: CassandraServer, s3_server: S3Server) -> Iterator[CassandraS3]:
    """One probe session on Cassandra and one S3 client for the whole test session (connecting costs more
    than most probes)."""
    yield from _probes(cassandra_server, s3_server)


def _probes(cassandra_server: CassandraServer, s3_server: S3Server) -> Iterator[CassandraS3]:
    cluster = cassandra_server.cluster()
    s3 = s3_server.client()
    yield CassandraS3(cassandra_server, s3_server, cluster.connect(), s3)
    cluster.shutdown()
    s3.close()


@pytest.fixture(scope="session")
def spark_cluster() -> SparkCluster:
    return _server("spark")


@pytest.fixture(scope="session")
def cassandra_tls_server() -> CassandraServer:
    """The single Cassandra node that speaks TLS only and asks each client's certificate."""
    return _server("cassandra-tls")


@pytest.fixture(scope="session")
def s3_tls_server() -> S3Server:
    """The S3 endpoint over https (the same root keys as `s3_server`)."""
    return _server("s3-tls")


@pytest.fixture(scope="session")
def rabbitmq_tls_server() -> RabbitMQServer:
    """The RabbitMQ node that speaks amqps only."""
    return _server("rabbitmq-tls")


@pytest.fixture(scope="session")
def rabbitmq_tls_vhosts(rabbitmq_tls_server: RabbitMQServer) -> Iterator[Vhosts]:
    """Fresh virtual hosts on the amqps node, deleted at the session's end."""
    vhosts = Vhosts(RabbitMQTLS(), rabbitmq_tls_server.username)
    yield vhosts
    vhosts.delete_all()


@pytest.fixture(scope="session")
def cassandra_s3_tls(cassandra_tls_server: CassandraServer, s3_tls_server: S3Server) -> Iterator[CassandraS3]:
    """`cassandra_s3` on the TLS servers."""
    yield from _probes(cassandra_tls_server, s3_tls_server)
