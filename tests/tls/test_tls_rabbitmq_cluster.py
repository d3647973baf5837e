"""RabbitMQ's inter-node links over TLS on the harness's rabbitmq-cluster-tls: the Erlang distribution
between its three nodes (and rabbitmqctl's to each) speaks TLS only, each node presenting a certificate of
the harness's CA, and quorum queues replicated over it carry mails in and out. The three VMs make these
tests `alone` (tests/conftest.py)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from mailq_servers.rabbitmq import Vhosts
from mailq_servers.rabbitmq_cluster import NODES, RabbitMQClusterServer, node_name
from mailq_servers.s3 import remove_bucket
from mailq_servers.tls_servers import RabbitMQClusterTLS, client_tls
from mailq_servers.urls import distributed_url
from tests.cli.test_store_errors import MESSAGE, RECIPIENT, SENDER, mailq
from tests.runtime.backends import CassandraS3
from tests.servers.fixtures import fresh_bucket_name, fresh_keyspace

pytestmark = pytest.mark.timeout(900)
# The first bytes of an Erlang distribution handshake in the clear: a name message (`n`, version 5).
PLAIN_HANDSHAKE = b"\x00\x17n\x00\x05\x00\x00\x00\x00mailq-probe@localhost"
TLS_ALERT = 0x15


@pytest.mark.parametrize("index", range(1, NODES + 1))
def test_each_node_speaks_tls_only_to_its_peers(rabbitmq_cluster_tls: RabbitMQClusterTLS, index: int):
    assert sorted(rabbitmq_cluster_tls.members()) == sorted(node_name(n) for n in range(1, NODES + 1))
    port = rabbitmq_cluster_tls.ports()[f"distribution{index}"]
    context = client_tls(rabbitmq_cluster_tls.cache).context()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            names = dict(tls.getpeercert()["subjectAltName"])
    assert names == {"DNS": "localhost", "IP Address": "127.0.0.1"}
    with socket.create_connection(("127.0.0.1", port), timeout=30) as plain:
        plain.sendall(PLAIN_HANDSHAKE)
        plain.settimeout(30)
        assert plain.recv(1)[0] == TLS_ALERT


def test_quorum_queues_replicated_over_tls_carry_mails_in_and_out(
    rabbitmq_cluster_tls: RabbitMQClusterTLS,
    cassandra_s3: CassandraS3,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    for variable, value in cassandra_s3.s3_server.env().items():
        monkeypatch.setenv(variable, value)
    vhosts = Vhosts(rabbitmq_cluster_tls.node(1), "guest")
    facts = RabbitMQClusterServer(**rabbitmq_cluster_tls.facts())
    vhost = vhosts.take()
    broker = facts.broker_url(vhost, queues="quorum")
    bucket = fresh_bucket_name()
    eml = tmp_path / "mail.eml"
    eml.write_bytes(MESSAGE)
    try:
        with fresh_keyspace(cassandra_s3.cassandra_server) as keyspace:
            url = distributed_url(
                cassandra_s3.cassandra_server, cassandra_s3.s3_server, keyspace, bucket, broker
            )
            status, _, err = mailq(
                "--url", url, "enqueue", "spool", str(eml), "--sender", SENDER, "--rcpt", RECIPIENT
            )
            assert status == 0, err
            leaders = rabbitmq_cluster_tls.leaders(vhost)
            assert leaders and set(leaders.values()) <= {node_name(n) for n in range(1, NODES + 1)}
            status, out, err = mailq(
                "--url", url, "--json", "worker", "--domain", "example.org", "--idle-exit", "3s"
            )
            assert status == 0 and json.loads(out)["delivered"] == 1, (out, err)
    finally:
        vhosts.delete_all()
        remove_bucket(cassandra_s3.s3, bucket)
