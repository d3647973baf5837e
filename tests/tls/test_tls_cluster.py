"""Cassandra's node-to-node encryption on the harness's three-node TLS cluster (cassandra-cluster-tls): its
nodes gossip and replicate over TLS only, each presenting a certificate of the harness's CA that names its
address, and mails go in and out of a keyspace replicated on the three, with every link encrypted.
The cluster's three JVMs make these tests `alone` (tests/conftest.py)."""

from __future__ import annotations

import json
import socket
import ssl
from pathlib import Path

import pytest
from cryptography import x509

from mailq_servers.cassandra_cluster import ADDRESSES, CassandraClusterServer
from mailq_servers.rabbitmq import RabbitMQServer, Vhosts
from mailq_servers.s3 import S3Server, remove_bucket
from mailq_servers.tls_servers import CassandraClusterTLS
from mailq_servers.urls import distributed_url
from tests.cli.test_store_errors import MESSAGE, RECIPIENT, SENDER, mailq
from tests.servers.fixtures import fresh_bucket_name, fresh_keyspace

pytestmark = pytest.mark.timeout(900)


def handshake(address: str, port: int, context: ssl.SSLContext) -> x509.Certificate:
    """The certificate a TLS handshake with address:port got."""
    with socket.create_connection((address, port), timeout=30) as raw:
        with context.wrap_socket(raw, server_hostname=address) as tls:
            return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True))


@pytest.mark.parametrize("node", [1, 2, 3])
def test_each_node_speaks_tls_only_between_nodes_with_a_certificate_naming_its_address(
    cassandra_cluster_tls: CassandraClusterServer, node: int
):
    address = ADDRESSES[node - 1]
    storage = CassandraClusterTLS().ports()["storage"]
    certificate = handshake(address, storage, cassandra_cluster_tls.tls.context())
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == [address]
    # A peer in the clear gets no answer: the node waits for a TLS ClientHello and drops what is not one.
    with socket.create_connection((address, storage), timeout=30) as plain:
        plain.sendall(b"\x00" * 64)
        plain.settimeout(30)
        assert plain.recv(1024) == b""
    log = (CassandraClusterTLS().system_log(node)).read_text(errors="replace")
    assert "Internode messaging enabled TLS protocols" in log


def test_mails_in_and_out_of_a_keyspace_replicated_on_three_nodes_over_tls(
    cassandra_cluster_tls: CassandraClusterServer,
    s3_tls_server: S3Server,
    s3_server: S3Server,
    rabbitmq_tls_server: RabbitMQServer,
    rabbitmq_tls_vhosts: Vhosts,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    for variable, value in s3_server.env().items():
        monkeypatch.setenv(variable, value)
    vhost = rabbitmq_tls_vhosts.take()
    broker = f"amqps://{rabbitmq_tls_server.host}:{rabbitmq_tls_server.port}/{vhost}"
    bucket = fresh_bucket_name()
    eml = tmp_path / "mail.eml"
    eml.write_bytes(MESSAGE)
    with fresh_keyspace(cassandra_cluster_tls) as keyspace:
        url = distributed_url(cassandra_cluster_tls, s3_tls_server, keyspace, bucket, broker, replication=3)
        try:
            status, _, err = mailq("--url", url, "schema", "create")
            assert status == 0, err
            status, _, err = mailq(
                "--url", url, "enqueue", "spool", str(eml), "--sender", SENDER, "--rcpt", RECIPIENT
            )
            assert status == 0, err
            assert mailq("--url", url, "size", "spool")[1] == "spool: 1 mails\n"
            status, out, err = mailq(
                "--url", url, "--json", "worker", "--domain", "example.org", "--idle-exit", "3s"
            )
            assert status == 0 and json.loads(out)["delivered"] == 1, (out, err)
        finally:
            remove_bucket(s3_tls_server.client(), bucket)
