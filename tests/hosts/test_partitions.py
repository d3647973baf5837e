"""Partitions of the bed's server hosts under the fault workload (fault_workload.py): `mailq smtp` on the
smtp host, `mailq worker`s on worker1 and worker2, producers through SMTP and the API, while one server
host (its Cassandra node and its RabbitMQ node) is cut off from every other host of the bed, and from this
machine's own clients, for 30 s, then healed. With replication 3, LOCAL_QUORUM and quorum queues, two
hosts of three keep a quorum of both: no mail is lost, none fails, and the counts equal a browse once the
bound has passed.

They hold mailq to the scenarios' targets, which it misses today (docs/hosts.md, "Partitions"): the
quorum queues' leader cut off holds every publish to them until its followers elect another or the
partition heals, up to the broker's publish timeout, so a reply takes seconds and a mail kept after
that timeout can wait past the fault plus 10 s. `make faults` runs them; `make test` leaves them out."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import pytest

from mailq_runtime.settings import Settings
from mailq_servers.host_bed import SERVER_HOSTS, HostBed

from .conftest import run_on
from .fault_workload import Workload

pytestmark = pytest.mark.faults
PARTITION_SECONDS = 30.0
SMTP_PORT = 2527


def leaders_by_host(bed: HostBed, url: str) -> Counter[str]:
    """How many of the deployment's quorum queues each server host leads."""
    vhost = Settings.from_url(url).amqp.vhost
    leaders = bed.rabbitmq.leaders(vhost).values()
    return Counter({name: sum(leader == f"rabbit@{name}" for leader in leaders) for name in SERVER_HOSTS})


class HostPartition:
    """The fault: the server host `choose` picks from the queues' leaders at the fault's start, cut off
    from every other host of the bed; the heal reconnects it."""

    def __init__(self, bed: HostBed, url: str, choose: Callable[[Counter[str]], str]) -> None:
        self.bed, self.url, self.choose = bed, url, choose
        self.host: str | None = None
        self.leaders: dict[str, int] = {}

    def others(self) -> list[str]:
        return [name for name in self.bed.hosts if name != self.host]

    def fault(self) -> float:
        """Partition the chosen host; the time it took effect (after rabbitmqctl named the leaders)."""
        led = leaders_by_host(self.bed, self.url)
        self.leaders = dict(led)
        self.host = self.choose(led)
        # This process's producers are the workload's clients too: on the others' side.
        self.bed.partition(self.host, self.others(), from_here=True)
        return time.time()

    def heal(self) -> None:
        if self.host is not None:
            self.bed.heal(self.host, self.others())


def partitioned(
    bed: HostBed, url: str, env: dict[str, str], choose: Callable[[Counter[str]], str]
) -> HostPartition:
    """The workload with the host `choose` picks cut off from every other host for PARTITION_SECONDS."""
    workload = Workload(
        url,
        env,
        lambda on, argv: bed.host(on).command(argv),
        smtp_address=(bed.host("smtp").address, SMTP_PORT),
        networks=("10.213.0.0/24",),
    )
    partition = HostPartition(bed, url, choose)
    report = workload.run(partition.fault, partition.heal, fault_seconds=PARTITION_SECONDS)
    print(f"partitioned {partition.host}, queues led by host {partition.leaders}")
    print(report.to_json())
    report.check(PARTITION_SECONDS)
    bed.cassandra.wait_ring(timeout=120)  # the node back in every node's gossip
    assert sorted(bed.rabbitmq.members()) == [f"rabbit@{name}" for name in SERVER_HOSTS]
    return partition


def test_a_server_host_that_leads_no_queue_partitioned_30_s_loses_nothing(
    host_bed: HostBed, bed_url: str, bed_env: dict[str, str], bed_client: None
):
    run_on(host_bed, "smtp", bed_url, bed_env, "schema", "create")
    partitioned(host_bed, bed_url, bed_env, lambda led: min(SERVER_HOSTS, key=lambda name: (led[name], name)))


def test_the_host_leading_the_queues_partitioned_30_s_loses_nothing(
    host_bed: HostBed, bed_url: str, bed_env: dict[str, str], bed_client: None
):
    run_on(host_bed, "smtp", bed_url, bed_env, "schema", "create")
    partition = partitioned(
        host_bed, bed_url, bed_env, lambda led: max(SERVER_HOSTS, key=lambda name: (led[name], name))
    )
    assert partition.leaders[partition.host], f"no quorum queue had a leader: {partition.leaders}"
