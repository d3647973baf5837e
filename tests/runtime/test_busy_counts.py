"""A queue that never idles keeps exact counts: producers and consumers work the whole time, on the
distributed deployment, with no fault or with Cassandra's replies held back past the driver's timeout in
the middle (tests/forwarder.py: every request reaches the node and is applied, its answer comes late).
Whenever the producers pause and the consumers hold what they took, and once the counts' bound has
passed since the fault (docs/distributed.md, "Exact counts"), size(), the overview and the counts by
destination domain equal a browse, and a mailbox's counters its messages. The recount runs meanwhile,
under traffic, on its schedule; it never makes a count wrong.

The bound is shortened here as the settling of counts allows (epochs of 1 s, settled 6 s after their
end, a recount every 3 s: 10 s where the defaults make 70 s), with a driver timeout of 2 s."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterator
from dataclasses import replace
from urllib.parse import quote, urlsplit

import pytest

import mailq_runtime.stores.cassandra
from mailq_runtime import Runtime
from mailq_runtime.stores.cassandra import CassandraOptions
from mailq_servers import CassandraServer, RabbitMQServer, S3Server
from mailq_servers.rabbitmq import Vhosts
from mailq_servers.s3 import remove_bucket
from mailq_servers.urls import distributed_url
from tests.forwarder import Forwarder
from tests.servers.fixtures import fresh_keyspace

from .busy_traffic import Traffic, shorten_the_bound

TIMEOUT = 2.0  # the driver's request timeout, seconds
HELD = 3.0  # seconds of replies held back: past a try's timeout, within the store's retries


@pytest.fixture
def deployment(
    cassandra_server: CassandraServer,
    s3_server: S3Server,
    rabbitmq_server: RabbitMQServer,
    rabbitmq_vhosts: Vhosts,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[str, Forwarder]]:
    """A fresh distributed deployment whose runtime reaches Cassandra through a forwarder, the bound
    shortened: its URL and the forwarder."""
    for variable, value in s3_server.env().items():  # the AWS chain finds the harness's keys
        monkeypatch.setenv(variable, value)
    shorten_the_bound(monkeypatch)
    cable = Forwarder(cassandra_server.host, cassandra_server.port)
    bucket = f"mailq-busy-{time.time_ns():x}"
    vhost = quote(rabbitmq_vhosts.take(), safe="")
    with fresh_keyspace(cassandra_server) as keyspace:
        s3 = urlsplit(s3_server.endpoint_url)
        url = distributed_url(
            replace(cassandra_server, port=cable.port),
            replace(s3_server, endpoint_url=f"http://{s3.hostname}:{s3.port}"),
            keyspace,
            bucket,
            broker=f"amqp://{rabbitmq_server.host}:{rabbitmq_server.port}/{vhost}",
        )
        with Runtime.open(url, create=True):
            pass  # the schema, whose statements take longer than the short timeout
        monkeypatch.setattr(
            mailq_runtime.stores.cassandra,
            "CassandraOptions",
            functools.partial(CassandraOptions, request_timeout=TIMEOUT),
        )
        try:
            yield url, cable
        finally:
            cable.close()
            remove_bucket(s3_server.client(), bucket)


@pytest.mark.parametrize("fault", ["none", "lost-replies"])
def test_a_busy_queue_counts_exactly_within_the_bound(deployment, fault, caplog):
    url, cable = deployment
    caplog.set_level(logging.WARNING, logger="mailq_runtime.queue.mail_view")

    def hold_replies() -> None:
        with cable.replies_held():
            time.sleep(HELD)

    with Runtime.open(url) as runtime:
        queue = runtime.queue("busy")
        traffic = Traffic(runtime, queue)
        try:
            traffic.checked_through(hold_replies if fault == "lost-replies" else lambda: None)
        finally:
            traffic.stop()
        if fault == "none":
            assert "counters corrected" not in caplog.text, caplog.text
