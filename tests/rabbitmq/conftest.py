"""Fixtures of the RabbitMQ broker's tests: brokers in a virtual host of the test's own on the harness's
node, and, for the tests that stop or kill RabbitMQ, a private node of their own (never the shared one,
which other test runs are using) or the harness's three-node cluster, started for their module only; the
URL of the whole distributed deployment on any of them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import pytest

from mailq_runtime.brokers.rabbitmq import QUEUE_TYPES, BrokerOptions, RabbitMQBroker
from mailq_servers.base import ServerError
from mailq_servers.rabbitmq import RabbitMQ, RabbitMQServer, Vhosts
from mailq_servers.rabbitmq_cluster import RabbitMQCluster
from tests.servers.fixtures import fresh_keyspace

Brokers = Callable[..., RabbitMQBroker]


@pytest.fixture
def vhost(rabbitmq_vhosts: Vhosts) -> str:
    return rabbitmq_vhosts.take()


def broker_factory(
    server: RabbitMQServer, vhost: str, queue_type: str = "classic"
) -> tuple[Brokers, list[RabbitMQBroker]]:
    made: list[RabbitMQBroker] = []

    def make(**options) -> RabbitMQBroker:
        options.setdefault("password", server.password)
        options.setdefault("queue_type", queue_type)
        broker = RabbitMQBroker(BrokerOptions(server.host, server.port, vhost, server.username, **options))
        made.append(broker)
        return broker

    return make, made


@pytest.fixture(params=QUEUE_TYPES)
def queue_type(request: pytest.FixtureRequest) -> str:
    """Each broker test runs on both designs: classic priority queues, and quorum queues per priority
    band (on one node quorum queues work too, unreplicated)."""
    return request.param


@pytest.fixture
def brokers(rabbitmq_server: RabbitMQServer, vhost: str, queue_type: str) -> Iterator[Brokers]:
    """Makes brokers of the test's queue type in the test's virtual host (keyword arguments as
    RabbitMQBroker's); all closed at the end."""
    make, made = broker_factory(rabbitmq_server, vhost, queue_type)
    yield make
    for broker in made:
        broker.close()


@pytest.fixture(scope="module")
def private_node(
    tmp_path_factory: pytest.TempPathFactory, rabbitmq_server: RabbitMQServer
) -> Iterator[RabbitMQ]:
    """A RabbitMQ node of this module's own, on free ports, to stop and kill (rabbitmq_server first: it
    installs RabbitMQ when missing)."""
    node = RabbitMQ.private(tmp_path_factory.mktemp("rabbitmq"))
    try:
        node.ensure()
    except ServerError as error:
        pytest.fail(f"a private RabbitMQ node could not start: {error}", pytrace=False)
    yield node
    node.stop()


@pytest.fixture(scope="module")
def rabbitmq_cluster(rabbitmq_server: RabbitMQServer) -> Iterator[RabbitMQCluster]:
    """The harness's three-node cluster, for this module: started if it is not running (rabbitmq_server
    first: it installs RabbitMQ when missing), and stopped afterwards if this fixture started it."""
    cluster = RabbitMQCluster()
    started = time.monotonic()
    try:
        _, did = cluster.ensure()
    except ServerError as error:
        pytest.fail(f"the RabbitMQ cluster could not start: {error}", pytrace=False)
    print(f"rabbitmq-cluster: {did} in {time.monotonic() - started:.1f} s")
    yield cluster
    if did != "reused":
        cluster.stop()


def private_server(node: RabbitMQ) -> RabbitMQServer:
    return RabbitMQServer(**node.facts())


@dataclass(frozen=True)
class Deployment:
    """The harness's Cassandra (a keyspace of this module's own) and S3: the distributed deployment's
    URL on a RabbitMQ node and virtual host."""

    cassandra: Any
    s3: Any
    keyspace: str
    bucket: str

    def url(self, rabbitmq: RabbitMQServer, vhost: str) -> Callable[..., str]:
        return self.url_on(f"amqp://{rabbitmq.host}:{rabbitmq.port}/{quote(vhost, safe='')}")

    def url_on(self, broker: str) -> Callable[..., str]:
        """The URL on the broker of the amqp:// URL `broker`."""

        def url(**options: object) -> str:
            query = urlencode(
                {
                    "s3": self.bucket,
                    "s3_endpoint": self.s3.endpoint_url,
                    "s3_region": self.s3.region,
                    "s3_prefix": f"{self.keyspace}/",
                    "broker": broker,
                    **options,
                },
                safe=":/",
            )
            return f"cassandra://{self.cassandra.host}:{self.cassandra.port}/{self.keyspace}?{query}"

        return url


@pytest.fixture(scope="module")
def keyspace(cassandra_server) -> Iterator[str]:
    """A keyspace of this module's own: the other suites empty theirs between tests, and a blob row of
    theirs would make the deduplicating store skip content this module's prefix does not hold."""
    with fresh_keyspace(cassandra_server) as name:
        yield name


@pytest.fixture
def deployment(
    cassandra_server, s3_server, keyspace: str, bucket_name: str, monkeypatch: pytest.MonkeyPatch
) -> Deployment:
    # The AWS chain finds the harness's keys, in this process and the processes it starts.
    for variable in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(variable, raising=False)
    for variable, value in s3_server.env().items():
        monkeypatch.setenv(variable, value)
    return Deployment(cassandra_server, s3_server, keyspace, bucket_name)
