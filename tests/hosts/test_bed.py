"""The host bed itself: each host its own address on the bed's bridge and no way out of the machine, its
own view of the files, and the clusters of three formed across the server hosts."""

from __future__ import annotations

import subprocess

from mailq_servers import hosts as network
from mailq_servers.host_bed import SERVER_HOSTS, HostBed, processes_reading_elsewhere, running_facts


def _ip(host: network.Host, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "-n", host.namespace, *arguments], capture_output=True, text=True)


def test_each_host_has_its_address_on_the_bridge_and_no_route_out(host_bed: HostBed):
    for host in host_bed.hosts.values():
        assert host.address in _ip(host, "-4", "addr", "show", "dev", "eth0").stdout
        routes = [line.strip() for line in _ip(host, "route", "show").stdout.splitlines()]
        assert routes == [f"10.213.0.0/24 dev eth0 proto kernel scope link src {host.address}"], routes
        # A route look-up sends nothing: an address outside the bed has no way there.
        outside = _ip(host, "route", "get", "192.0.2.1")
        assert outside.returncode != 0 and "unreachable" in outside.stderr, outside
    bridge = subprocess.run(
        ["ip", "-4", "addr", "show", "dev", network.BRIDGE], capture_output=True, text=True
    )
    assert f"{network.BRIDGE_ADDRESS}/24" in bridge.stdout
    assert sorted(network.namespaces()) == sorted(host.namespace for host in host_bed.hosts.values())


def test_a_host_sees_its_own_files_and_none_of_another_hosts(host_bed: HostBed):
    server1, server2 = host_bed.host("server1"), host_bed.host("server2")
    own = subprocess.run(server2.command(["ls", str(server2.directory)]), capture_output=True, text=True)
    assert own.returncode == 0 and {"cassandra", "rabbitmq"} <= set(own.stdout.split()), own
    other = subprocess.run(
        server1.command(["ls", "-A", str(server2.directory)]), capture_output=True, text=True
    )
    assert other.stdout == "", other
    cassandra_yaml = server2.directory / "cassandra" / "conf" / "cassandra.yaml"
    assert cassandra_yaml.exists()  # this machine's root namespace sees every host's files
    read = subprocess.run(server1.command(["cat", str(cassandra_yaml)]), capture_output=True, text=True)
    assert read.returncode != 0 and read.stdout == "", read
    assert list(processes_reading_elsewhere(host_bed)) == []


def test_the_clusters_span_the_three_server_hosts(host_bed: HostBed):
    facts = running_facts()
    running = host_bed.running()
    assert running is not None
    for name in SERVER_HOSTS:
        host = host_bed.host(name)
        for server in ("cassandra", "rabbitmq"):
            assert (
                running.procs[f"{name}.{server}"].pid in host.pids()
            ), f"{server} of {name} is not in its host"
    assert facts.cassandra_cluster.hosts == tuple(host_bed.host(name).address for name in SERVER_HOSTS)
    host_bed.cassandra.wait_ring(timeout=60)  # each node UN in every node's gossip
    assert sorted(host_bed.rabbitmq.members()) == [f"rabbit@{name}" for name in SERVER_HOSTS]
    s3 = facts.s3_server
    assert s3.endpoint_url == f"https://{host_bed.host('objects').address}:{host_bed.s3.ports()['http']}"
    s3.client().list_buckets()
