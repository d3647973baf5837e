"""The bed's faults of a network, as the tests of a cluster's failures use them: a host partitioned from
chosen others and healed, a host's link unplugged and plugged again, a server's process paused and
resumed. Each is seen from the hosts themselves, through a TCP connection or a TLS handshake (every
server of the bed speaks TLS)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mailq_servers.host_bed import CASSANDRA_PORTS, RABBITMQ_PORTS, HostBed

# Connects to HOST PORT within 3 s and, when asked, completes a TLS handshake within 3 s (the server's
# answer, whoever signed its certificate): exit 0 when connected (and answered), 2 when refused (the host
# answered), 1 when nothing answered.
PROBE = """
import socket, ssl, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3) as connection:
        if len(sys.argv) > 3:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            context.wrap_socket(connection).close()
except ConnectionRefusedError:
    sys.exit(2)
except OSError:
    sys.exit(1)
"""
OUTCOMES = {0: "connected", 1: "silence", 2: "refused"}


def probe(bed: HostBed, source: str, target: str, port: int, handshake: bool = False) -> str:
    """What a process on host `source` meets connecting to `target`'s port (and shaking hands)."""
    argv = [sys.executable, "-c", PROBE, bed.host(target).address, str(port), *(["tls"] if handshake else [])]
    return OUTCOMES[subprocess.run(bed.host(source).command(argv), timeout=30).returncode]


def reaches(bed: HostBed, source: str, target: str, port: int, handshake: bool = False) -> bool:
    return probe(bed, source, target, port, handshake) == "connected"


def test_a_partition_cuts_a_host_off_from_the_chosen_hosts_only_until_healed(host_bed: HostBed):
    cql = CASSANDRA_PORTS["native"]
    assert reaches(host_bed, "worker1", "server1", cql)
    host_bed.partition("worker1", ["server1", "server2"])
    try:
        assert not reaches(host_bed, "worker1", "server1", cql)
        assert not reaches(host_bed, "server2", "worker1", 22) and reaches(
            host_bed, "worker1", "server3", cql
        )
        assert reaches(host_bed, "worker2", "server1", cql)
    finally:
        host_bed.heal("worker1", ["server1", "server2"])
    assert reaches(host_bed, "worker1", "server1", cql) and reaches(host_bed, "worker1", "server2", cql)


def test_an_unplugged_host_reaches_nothing_until_plugged_again(host_bed: HostBed):
    cql = CASSANDRA_PORTS["native"]
    host_bed.link_down("worker2")
    try:
        assert probe(host_bed, "worker2", "server1", cql) == "silence"
    finally:
        host_bed.link_up("worker2")
    assert reaches(host_bed, "worker2", "server1", cql)


def test_a_paused_server_accepts_connections_and_answers_nothing_until_resumed(host_bed: HostBed):
    amqp = RABBITMQ_PORTS["amqp3"]
    host_bed.pause("server3.rabbitmq")
    try:
        # The kernel accepts a stopped process's connections; the node answers no TLS handshake.
        assert reaches(host_bed, "worker1", "server3", amqp)
        assert probe(host_bed, "worker1", "server3", amqp, handshake=True) == "silence"
    finally:
        host_bed.resume("server3.rabbitmq")
    assert reaches(host_bed, "worker1", "server3", amqp, handshake=True)


def test_a_fault_on_a_host_the_bed_lacks_is_refused_naming_it(host_bed: HostBed):
    from mailq_servers import ServerError

    with pytest.raises(ServerError, match="no host 'server9'"):
        host_bed.partition("server9", ["server1"])
    with pytest.raises(ServerError, match="no process 'server1.spark'"):
        host_bed.pause("server1.spark")
