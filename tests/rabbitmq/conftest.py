"""Fixtures of the RabbitMQ broker's tests: brokers in a virtual host of the test's own on the harness's
node, and, for the tests that stop or kill RabbitMQ, a private node of their own (never the shared one,
which other test runs are using)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from mailq_runtime.brokers.rabbitmq import RabbitMQBroker
from tests.servers.base import ServerError
from tests.servers.rabbitmq import RabbitMQ, RabbitMQServer, Vhosts

Brokers = Callable[..., RabbitMQBroker]


@pytest.fixture
def vhost(rabbitmq_vhosts: Vhosts) -> str:
    return rabbitmq_vhosts.take()


def broker_factory(server: RabbitMQServer, vhost: str) -> tuple[Brokers, list[RabbitMQBroker]]:
    made: list[RabbitMQBroker] = []

    def make(**options) -> RabbitMQBroker:
        options.setdefault("password", server.password)
        broker = RabbitMQBroker(server.host, server.port, vhost, server.username, **options)
        made.append(broker)
        return broker

    return make, made


@pytest.fixture
def brokers(rabbitmq_server: RabbitMQServer, vhost: str) -> Iterator[Brokers]:
    """Makes brokers in the test's virtual host (keyword arguments as RabbitMQBroker's); all closed at
    the end."""
    make, made = broker_factory(rabbitmq_server, vhost)
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


def private_server(node: RabbitMQ) -> RabbitMQServer:
    return RabbitMQServer(**node.facts())
