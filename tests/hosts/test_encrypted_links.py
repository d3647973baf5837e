"""TLS on every link of the bed that crosses its bridge to a server: CQL and Cassandra's node-to-node
links, amqps and RabbitMQ's Erlang distribution, S3 over https, each presenting a certificate of the
harness's CA that names its host; a link in the clear is refused, and a client host given another CA
gets one line naming the server and changes nothing."""

from __future__ import annotations

import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from urllib.parse import parse_qs, urlsplit

import pika
import pika.exceptions
import pytest
from cassandra.cluster import Cluster, NoHostAvailable

from mailq_servers.certificates import HarnessCA
from mailq_servers.host_bed import CASSANDRA_PORTS, RABBITMQ_PORTS, SERVER_HOSTS, HostBed, running_facts

from .conftest import mailq_on, run_on

DISTRIBUTION_PORT = RABBITMQ_PORTS["distribution1"]


def handshake(address: str, port: int, context: ssl.SSLContext) -> dict:
    """The peer certificate of a TLS handshake with `address:port` from this machine, the name checked."""
    with socket.create_connection((address, port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname=address) as tls:
            return tls.getpeercert()


def test_a_bed_deployment_names_tls_for_every_link(bed_url: str):
    parts = urlsplit(bed_url)
    options = {name: values[0] for name, values in parse_qs(parts.query).items()}
    assert options["tls"] == "on"
    assert options["broker"].startswith("amqps://")
    assert options["s3_endpoint"].startswith("https://")
    assert {"ca", "cert", "key"} <= set(options)


def test_each_server_port_of_the_bed_speaks_tls_with_a_certificate_naming_its_host(host_bed: HostBed):
    client = running_facts().cassandra_cluster.tls
    assert client is not None
    context = client.context()
    for name in SERVER_HOSTS:
        address = host_bed.host(name).address
        for port in (
            CASSANDRA_PORTS["native"],
            CASSANDRA_PORTS["storage"],
            RABBITMQ_PORTS["amqp1"],
            DISTRIBUTION_PORT,
        ):
            names = {value for kind, value in handshake(address, port, context)["subjectAltName"]}
            assert {address, name} <= names, (name, port, names)
    objects = host_bed.host("objects").address
    assert objects in {
        value for _, value in handshake(objects, host_bed.s3.ports()["http"], context)["subjectAltName"]
    }


def test_a_client_in_the_clear_is_refused_by_every_server(host_bed: HostBed):
    facts = running_facts()
    address = host_bed.host("server1").address
    plain = Cluster([address], port=CASSANDRA_PORTS["native"], connect_timeout=5)
    try:
        with pytest.raises(NoHostAvailable):
            plain.connect()
    finally:
        plain.shutdown()
    cluster = facts.rabbitmq_cluster
    parameters = pika.ConnectionParameters(
        address,
        RABBITMQ_PORTS["amqp1"],
        credentials=pika.PlainCredentials(cluster.username, cluster.password),
        connection_attempts=1,
        socket_timeout=5,
    )
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(parameters)
    in_the_clear = facts.s3_server.endpoint_url.replace("https://", "http://")
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(in_the_clear, timeout=5)


def test_a_client_host_given_another_ca_gets_one_line_naming_the_server_and_nothing_changes(
    host_bed: HostBed, bed_url: str, bed_env: dict[str, str]
):
    run_on(host_bed, "smtp", bed_url, bed_env, "schema", "create")
    smtp = host_bed.host("smtp")
    other = HarnessCA(smtp.directory / "other-ca")
    right_ca = parse_qs(urlsplit(bed_url).query)["ca"][0]
    wrong_url = bed_url.replace(f"ca={right_ca}", f"ca={other.cert}")
    assert wrong_url != bed_url
    mail = smtp.directory / "mail.eml"
    mail.write_bytes(b"From: carol@example.org\r\nSubject: over TLS\r\n\r\nHello.\r\n")
    enqueue = ("enqueue", "spool", str(mail), "--sender", "carol@example.org", "--rcpt", "alice@example.org")
    done = subprocess.run(
        mailq_on(host_bed, "smtp", wrong_url, *enqueue), env=bed_env, capture_output=True, text=True
    )
    assert (done.returncode, done.stdout) == (2, ""), done
    assert done.stderr.startswith("mailq: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "not signed by the CA given" in done.stderr, done.stderr
    assert any(host_bed.host(name).address in done.stderr for name in (*SERVER_HOSTS, "objects")), done.stderr
    assert "spool" not in run_on(host_bed, "smtp", bed_url, bed_env, "queues")  # nothing was made
    run_on(host_bed, "smtp", bed_url, bed_env, *enqueue)
    assert run_on(host_bed, "smtp", bed_url, bed_env, "size", "spool") == "spool: 1 mails\n"
