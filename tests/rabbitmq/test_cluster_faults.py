"""Faults on the harness's three-node RabbitMQ cluster under the distributed deployment with quorum queues
(`broker=amqp://n1,n2,n3/?queues=quorum`; Cassandra and S3 from the harness, a keyspace of this module's
own): producers and consumers at work in threads while the node leading the mail queue is SIGKILLed, or
the whole cluster, then started again. Nothing is restarted but RabbitMQ. Every accepted mail is
delivered (counted exactly), the same runtimes carry on by themselves, and only a mail in flight at the
fault (not settled before it) may be delivered twice."""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from mailq_runtime import LeaseExpired, Runtime
from mailq_runtime.brokers.rabbitmq import band_queue, rabbitmq_queues
from mailq_runtime.model import NORMAL_PRIORITY
from mailq_runtime.queue import MailQueue
from mailq_servers.rabbitmq_cluster import RabbitMQCluster, RabbitMQClusterServer
from tests.runtime.helpers import make_mail

from .conftest import Deployment

# Producers enqueue until the test has done its faults (`enough`), at most PER_PRODUCER mails each.
PRODUCERS, CONSUMERS, PER_PRODUCER = 2, 2, 500


class Load:
    """Producers and consumers on one mail queue, in threads, counting every enqueue that returned and
    every delivery."""

    def __init__(self, queue: MailQueue) -> None:
        self.queue = queue
        self.lock = threading.Lock()
        self.accepted: list[str] = []
        self.delivered: list[str] = []  # every delivery, a mail delivered twice twice
        # done() returned, or raised LeaseExpired having marked the mail deleted all the same (the
        # delivery's connection was lost: RabbitMQ delivers it again and the deletion mark absorbs it)
        self.settled: set[str] = set()
        self.leases_lost = 0
        self.slowest_enqueue = 0.0
        self.failures: list[BaseException] = []
        self.stop = threading.Event()
        self.enough = threading.Event()
        self.producers = [threading.Thread(target=self._produce, args=(f"p{n}",)) for n in range(PRODUCERS)]
        self.consumers = [threading.Thread(target=self._consume) for _ in range(CONSUMERS)]

    def start(self) -> None:
        for thread in (*self.producers, *self.consumers):
            thread.start()

    def _produce(self, prefix: str) -> None:
        try:
            for n in range(PER_PRODUCER):
                if self.enough.is_set():
                    return
                name = f"{prefix}-{n:03d}"
                started = time.monotonic()
                # One in ten urgent: the urgent band's queue lives through the fault too.
                self.queue.enqueue(make_mail(name), priority=9 if n % 10 == 0 else None)
                with self.lock:
                    self.accepted.append(name)
                    self.slowest_enqueue = max(self.slowest_enqueue, time.monotonic() - started)
                time.sleep(0.02)
        except BaseException as error:  # reported by the test's thread
            self.failures.append(error)

    def _consume(self) -> None:
        try:
            while not self.stop.is_set():
                item = self.queue.dequeue(timeout=0.5)
                if item is None:
                    continue
                with self.lock:
                    self.delivered.append(item.mail.name)
                try:
                    item.done()
                except LeaseExpired:
                    with self.lock:
                        self.leases_lost += 1
                with self.lock:
                    self.settled.add(item.mail.name)
        except BaseException as error:
            self.failures.append(error)

    def wait_until(self, condition: Callable[[], bool], seconds: float, what: str) -> None:
        deadline = time.monotonic() + seconds
        while not condition():
            assert not self.failures, self.failures
            assert time.monotonic() < deadline, what
            time.sleep(0.1)

    def finish(self, seconds: float) -> None:
        """Stop the producers, then wait until every accepted mail was delivered and settled."""
        self.enough.set()
        for thread in self.producers:
            thread.join(seconds)
        assert not self.failures, self.failures
        self.wait_until(
            lambda: self.settled >= set(self.accepted), seconds, f"undelivered: {self.undelivered()}"
        )

    def undelivered(self) -> list[str]:
        with self.lock:
            return sorted(set(self.accepted) - self.settled)[:20]

    def close(self) -> None:
        self.stop.set()
        self.enough.set()
        for thread in (*self.producers, *self.consumers):
            if thread.is_alive():
                thread.join(60)


@pytest.fixture
def cluster_vhost(rabbitmq_cluster: RabbitMQCluster) -> Iterator[str]:
    """A virtual host of the test's own on the cluster, deleted with its queues afterwards (the
    cluster's data outlives the test run: every queue left there would elect a leader at each start)."""
    vhost = f"mailq-faults-{secrets.token_hex(3)}"
    rabbitmq_cluster.ctl("add_vhost", vhost)
    rabbitmq_cluster.ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    yield vhost
    rabbitmq_cluster.ctl("delete_vhost", vhost)


@pytest.fixture
def cluster_url(
    rabbitmq_cluster: RabbitMQCluster, cluster_vhost: str, deployment: Deployment
) -> Callable[..., str]:
    running = rabbitmq_cluster.running()
    assert running is not None
    server = RabbitMQClusterServer(**running.facts)
    return deployment.url_on(server.broker_url(cluster_vhost, queues="quorum"))


@pytest.fixture
def load(cluster_url: Callable[..., str], rabbitmq_cluster: RabbitMQCluster) -> Iterator[Load]:
    runtime = Runtime.open(cluster_url(), create=True)
    # Bounded: an enqueue RabbitMQ does not confirm in 5 s is kept as a delayed mail due at once.
    runtime.broker.publish_timeout = 5
    queue = runtime.queue(f"faults-{secrets.token_hex(3)}")
    queue.enqueue(make_mail("first"))  # declares its RabbitMQ queues
    running = Load(queue)
    running.accepted.append("first")
    try:
        yield running
    finally:
        running.close()
        runtime.close()


def check_counts(load: Load, settled_before: set[str]) -> None:
    delivered = Counter(load.delivered)
    assert set(delivered) == set(load.accepted), "delivered exactly the accepted mails"
    assert len(load.accepted) == len(set(load.accepted)) > 100
    twice = {name for name, times in delivered.items() if times > 1}
    assert not twice & settled_before, "a mail settled before the fault was delivered again"
    print(
        f"accepted {len(load.accepted)}, delivered {len(load.delivered)}, duplicates {len(twice)}, "
        f"leases lost {load.leases_lost}, slowest enqueue {load.slowest_enqueue:.1f} s"
    )
    load.wait_until(lambda: load.queue.size() == 0, 30, f"size {load.queue.size()} on an empty queue")


def test_a_mail_queues_quorum_queues_are_replicated_on_the_three_nodes(
    load: Load, rabbitmq_cluster: RabbitMQCluster, cluster_vhost: str
):
    listed = json.loads(
        rabbitmq_cluster.ctl(
            "list_queues", "-p", cluster_vhost, "name", "type", "members", "--formatter", "json"
        )
    )
    found = {row["name"]: (row["type"], sorted(row["members"])) for row in listed}
    names, dead_letters = rabbitmq_queues(load.queue.name, "quorum")
    nodes = sorted(rabbitmq_cluster.members())
    assert len(nodes) == 3
    for name in (*names, dead_letters):
        assert found[name] == ("quorum", nodes), name


def connected_node(cluster: RabbitMQCluster, vhost: str) -> str:
    """The node the runtime's broker is connected to: the one holding its AMQP connection to `vhost`
    (the node's AMQP port tells it)."""
    listed = json.loads(cluster.ctl("list_connections", "vhost", "port", "--formatter", "json"))
    (port,) = {row["port"] for row in listed if row["vhost"] == vhost}
    running = cluster.running()
    assert running is not None
    return RabbitMQClusterServer(**running.facts).nodes[running.facts["ports"].index(port)]


def kill_while_mails_flow(load: Load, cluster: RabbitMQCluster, node: str) -> set[str]:
    """SIGKILL `node` under the load, wait until 40 more mails went through without it, start it again;
    the mails settled before the kill."""
    with load.lock:
        settled_before = set(load.settled)
        accepted_before = len(load.accepted)
    index = cluster.index_of(node)
    cluster.kill_node(index)
    try:
        load.wait_until(
            lambda: len(load.settled) >= accepted_before + 40, 60, f"no mail flowed with {node} down"
        )
    finally:
        cluster.start_node(index)
    return settled_before


def test_the_node_leading_the_queue_killed_loses_no_mail_and_nobody_restarts(
    load: Load, rabbitmq_cluster: RabbitMQCluster, cluster_vhost: str
):
    load.start()
    load.wait_until(lambda: len(load.accepted) >= 80, 60, "no enqueues before the kill")
    # The queue elects a leader among the two others; producers and consumers go on meanwhile.
    leader = rabbitmq_cluster.leaders(cluster_vhost)[band_queue(load.queue.name, NORMAL_PRIORITY)]
    settled_before = kill_while_mails_flow(load, rabbitmq_cluster, leader)
    # Then the node the runtime is connected to (alive, so not the one just killed): the broker
    # connects to another and resends what was unconfirmed.
    settled_before &= kill_while_mails_flow(
        load, rabbitmq_cluster, connected_node(rabbitmq_cluster, cluster_vhost)
    )
    load.finish(60)
    check_counts(load, settled_before)


def test_the_whole_cluster_killed_and_back_delivers_every_mail_by_itself(
    load: Load, rabbitmq_cluster: RabbitMQCluster
):
    load.start()
    load.wait_until(lambda: len(load.accepted) >= 60, 60, "no enqueues before the kill")
    with load.lock:
        settled_before = set(load.settled)
    rabbitmq_cluster.kill_all()
    try:
        time.sleep(5)  # producers go on: their mails wait as delayed mails due at once
    finally:
        rabbitmq_cluster.start_all()
    with load.lock:
        accepted_back = len(load.accepted)
    # Producers and consumers carry on by themselves: mails enqueued once the cluster is back go through.
    load.wait_until(
        lambda: len(load.settled) >= accepted_back + 20, 60, "no mail flowed once the cluster was back"
    )
    load.finish(90)
    check_counts(load, settled_before)
