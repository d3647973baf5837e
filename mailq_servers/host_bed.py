"""The host bed: the distributed deployment on separate network hosts of this machine (hosts.py), each
with its own address and its own files, its servers reached only across the bed's bridge.

    server1..3   10.213.0.11-13   a Cassandra node (9042, storage 7000), a RabbitMQ node (amqps 5671,
                                  distribution 25672, epmd 4369) and a Spark worker each: one cluster
                                  of three of each; server1 also runs the Spark master (7077, UI 8080)
    objects      10.213.0.20      versitygw, the S3 endpoint (https 17170)
    smtp, worker1, worker2, driver, sink, metrics   10.213.0.31-36: client hosts with no server of the
                                  bed's: `mailq smtp`, `mailq worker`s, the pipeline's driver, an SMTP sink,
                                  Prometheus, started there by the tests (`host(name).command(argv)`)

The servers are the harness's own TLS classes (CassandraClusterTLS, RabbitMQClusterTLS, S3EndpointTLS,
SparkStandalone) given a place on a host and a directory there; the bed is one server of the harness
(`python -m mailq_servers up hosts`, `down hosts`), its state file recording every process. It starts its
servers together, and `down` stops them, then removes every namespace, link and process of the bed,
recorded or not.

Every link that crosses the bridge to a server speaks TLS only, with certificates of the harness's CA
(tls_servers.py) naming each host's address and name: CQL and Cassandra's node-to-node links (each client
presents the harness's client certificate), amqps and RabbitMQ's Erlang distribution, and S3 over https.
A bed deployment's URL names the CA and the client certificate; every host reads them, as it reads the
servers' binaries, from the harness's cache, as each machine of a real cluster holds them at one path.
The Cassandra keyspaces
of a bed deployment are replicated on the three nodes and its mail queues are quorum queues, so a
deployment survives one server host's loss."""

from __future__ import annotations

import os
import secrets
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import hosts as network
from .base import Proc, Running, Server, ServerError
from .cassandra_cluster import CassandraClusterServer
from .hosts import NETWORK_PREFIX, Host
from .rabbitmq_cluster import RabbitMQClusterServer
from .s3 import S3Server
from .spark import SparkCluster, SparkStandalone
from .tls_servers import CassandraClusterTLS, RabbitMQClusterTLS, S3EndpointTLS

SERVER_HOSTS = ("server1", "server2", "server3")
CLIENT_HOSTS = ("smtp", "worker1", "worker2", "driver", "sink", "metrics")
ADDRESSES = {
    **{name: f"{NETWORK_PREFIX}{11 + n}" for n, name in enumerate(SERVER_HOSTS)},
    "objects": f"{NETWORK_PREFIX}20",
    **{name: f"{NETWORK_PREFIX}{31 + n}" for n, name in enumerate(CLIENT_HOSTS)},
}
CASSANDRA_PORTS = {"native": 9042, "storage": 7000}
RABBITMQ_PORTS = {
    **{f"amqp{n}": 5671 for n in (1, 2, 3)},
    **{f"distribution{n}": 25672 for n in (1, 2, 3)},
}
EPMD_PORT = 4369
SPARK_PORTS = {"master": 7077, "webui": 8080}
AMQP_USER = "mailq"
# Three nodes on a shared two-core machine: small heaps (the bed's keyspaces are few).
CASSANDRA_HEAP = "768m"
# The name the bed's nodes had before they spoke TLS, which their data keeps.
CASSANDRA_CLUSTER_NAME = "mailq-cluster"


@dataclass(frozen=True)
class HostBedServers:
    """How to reach the bed's servers from this machine's root namespace or from any host of the bed."""

    addresses: dict[str, str]
    cassandra: dict[str, Any]
    rabbitmq: dict[str, Any]
    spark: dict[str, Any]
    s3: dict[str, Any] = field(repr=False)

    @property
    def cassandra_cluster(self) -> CassandraClusterServer:
        return CassandraClusterServer(**self.cassandra)

    @property
    def rabbitmq_cluster(self) -> RabbitMQClusterServer:
        return RabbitMQClusterServer(**self.rabbitmq)

    @property
    def spark_cluster(self) -> SparkCluster:
        """The cluster, for a driver on the bed's driver host."""
        return SparkCluster(**self.spark)

    @property
    def s3_server(self) -> S3Server:
        return S3Server(**self.s3)

    def env(self) -> dict[str, str]:
        """Where the servers are, for a shell (`python -m mailq_servers env hosts`): names of the bed's
        own, so that they never shadow the loopback servers' in `env`'s full listing."""
        return {
            "MAILQ_BED_CASSANDRA": self.cassandra_cluster.contact_points,
            "MAILQ_BED_AMQP_URL": self.rabbitmq_cluster.broker_url(),
            "MAILQ_BED_S3_ENDPOINT": self.s3_server.endpoint_url,
            "MAILQ_BED_SPARK_MASTER": self.spark_cluster.master_url,
        }

    def client_env(self) -> dict[str, str]:
        """What a mailq process on the bed needs beside its URL: the AMQP password and the S3 keys, and
        for a pipeline's driver on the driver host the Spark master and the driver's address."""
        return {
            "MAILQ_AMQP_PASSWORD": self.rabbitmq_cluster.password,
            **self.s3_server.keys_env(),
            **self.spark_cluster.env(),
        }


class HostBed(Server):
    name = "hosts"
    port_settings: dict[str, tuple[str, int]] = {}
    main_process = "server1.cassandra"

    def __init__(self, cache: Path | None = None) -> None:
        super().__init__(cache)
        self.hosts = _hosts(self.run_dir)
        places = [self.hosts[name].place() for name in SERVER_HOSTS]
        self.cassandra = CassandraClusterTLS(
            self.cache,
            run_dir=self.run_dir / "cassandra-cluster",
            places=places,
            node_dirs=[self.hosts[name].directory / "cassandra" for name in SERVER_HOSTS],
            ports=CASSANDRA_PORTS,
            heap=os.environ.get("MAILQ_BED_CASSANDRA_HEAP", CASSANDRA_HEAP),
            cluster_name=CASSANDRA_CLUSTER_NAME,
        )
        self.rabbitmq = RabbitMQClusterTLS(
            self.cache,
            amqps=True,
            run_dir=self.run_dir / "rabbitmq-cluster",
            places=places,
            node_dirs=[self.hosts[name].directory / "rabbitmq" for name in SERVER_HOSTS],
            ports=RABBITMQ_PORTS,
            epmd_port=EPMD_PORT,
            user=(AMQP_USER, self._amqp_password()),
        )
        self.s3 = S3EndpointTLS(
            self.cache, place=self.hosts["objects"].place(), run_dir=self.hosts["objects"].directory / "s3"
        )
        self.spark = SparkStandalone(
            self.cache,
            run_dir=self.run_dir / "spark",
            master=places[0],
            workers=[
                (self.hosts[name].place(), self.hosts[name].directory / "spark") for name in SERVER_HOSTS
            ],
            ports=SPARK_PORTS,
            s3=S3Server(**self.s3.facts()),
            driver_host=self.hosts["driver"].address,
        )

    def host(self, name: str) -> Host:
        if name not in self.hosts:
            raise ServerError(f"the bed has no host {name!r} (its hosts: {', '.join(self.hosts)})")
        return self.hosts[name]

    def installed(self) -> bool:
        return all(server.installed() for server in self._servers())

    def _servers(self) -> tuple[Server, ...]:
        return (self.cassandra, self.rabbitmq, self.s3, self.spark)

    def install(self) -> None:
        for server in self._servers():
            if not server.installed():
                server.install()

    def launch(self) -> dict[str, Proc]:
        network.remove_all()  # what a harness killed before its `down` left
        network.create(list(self.hosts.values()))
        launched = _together(
            {
                "cassandra": self.cassandra.launch,
                "rabbitmq": self.rabbitmq.launch,
                "s3": self.s3.launch,
                "spark": self.spark.launch,
            },
            on_error=lambda: network.remove_all(),
        )
        return {
            **{f"{SERVER_HOSTS[n]}.cassandra": launched["cassandra"][f"node{n + 1}"] for n in range(3)},
            **{f"{SERVER_HOSTS[n]}.rabbitmq": launched["rabbitmq"][f"n{n + 1}"] for n in range(3)},
            "objects.s3": launched["s3"]["server"],
            "server1.spark-master": launched["spark"]["master"],
            **{f"{SERVER_HOSTS[n]}.spark-worker": launched["spark"][f"worker-{n + 1}"] for n in range(3)},
        }

    def wait_ready(self, procs: dict[str, Proc]) -> None:
        _together(
            {
                "cassandra": lambda: self.cassandra.wait_ready(self._of(procs, "cassandra", "node")),
                "rabbitmq": lambda: self.rabbitmq.wait_ready(self._of(procs, "rabbitmq", "n")),
                "s3": lambda: self.s3.wait_ready({"server": procs["objects.s3"]}),
                "spark": lambda: self.spark.wait_ready(self._spark(procs)),
            }
        )

    @staticmethod
    def _of(procs: dict[str, Proc], server: str, role: str) -> dict[str, Proc]:
        """One cluster's processes under the roles its class gives them (those recorded: a stop may find
        a bed half started)."""
        roles = {f"{role}{n + 1}": f"{name}.{server}" for n, name in enumerate(SERVER_HOSTS)}
        return {role: procs[ours] for role, ours in roles.items() if ours in procs}

    @staticmethod
    def _spark(procs: dict[str, Proc]) -> dict[str, Proc]:
        roles = {
            "master": "server1.spark-master",
            **{f"worker-{n + 1}": f"{name}.spark-worker" for n, name in enumerate(SERVER_HOSTS)},
        }
        return {role: procs[ours] for role, ours in roles.items() if ours in procs}

    def facts(self) -> dict[str, Any]:
        return asdict(
            HostBedServers(
                addresses=dict(ADDRESSES),
                cassandra=self.cassandra.facts(),
                rabbitmq=self.rabbitmq.facts(),
                spark=self.spark.facts(),
                s3=self.s3.facts(),
            )
        )

    def serving(self, running: Running) -> bool:
        cassandra, amqp = CASSANDRA_PORTS["native"], RABBITMQ_PORTS["amqp1"]
        return (
            sorted(network.namespaces()) == sorted(host.namespace for host in self.hosts.values())
            and all(proc.alive() for proc in running.procs.values())
            and all(running.procs[f"{name}.cassandra"].owns_listener(cassandra) for name in SERVER_HOSTS)
            and all(running.procs[f"{name}.rabbitmq"].owns_listener(amqp) for name in SERVER_HOSTS)
        )

    def shut_down(self, procs: dict[str, Proc]) -> None:
        try:
            _together(
                {
                    "cassandra": lambda: self.cassandra.shut_down(self._of(procs, "cassandra", "node")),
                    "rabbitmq": lambda: self.rabbitmq.shut_down(self._of(procs, "rabbitmq", "n")),
                    "s3": lambda: procs["objects.s3"].terminate("hosts objects.s3", timeout=30),
                    "spark": lambda: self.spark.shut_down(self._spark(procs)),
                }
            )
        finally:
            network.remove_all()

    def stop(self) -> bool:
        """As Server.stop; and whatever the record says, no namespace, link or process of the bed is left."""
        stopped = super().stop()
        with self.lock():
            network.remove_all()
        return stopped

    # The faults of a network, by host name, for the tests of a cluster's failures (hosts.py has how).

    def partition(self, name: str, others: Sequence[str], *, from_here: bool = False) -> None:
        """Cut host `name` off from the hosts `others`, both ways, until `heal(name, others)`; with
        `from_here`, from this machine's own processes too (they are on the others' side)."""
        network.partition(self.host(name), [self.host(other) for other in others], from_here=from_here)

    def heal(self, name: str, others: Sequence[str]) -> None:
        network.heal(self.host(name), [self.host(other) for other in others])

    def link_down(self, name: str) -> None:
        """Unplug host `name` from the bridge, until `link_up(name)`."""
        network.link_down(self.host(name))

    def link_up(self, name: str) -> None:
        network.link_up(self.host(name))

    def pause(self, role: str) -> None:
        """SIGSTOP the bed's process `role` (e.g. "server2.cassandra"), as a long GC pause or a frozen
        machine would stop it: its sockets stay open, it answers nothing, until `resume(role)`."""
        self._recorded_proc(role).signal(signal.SIGSTOP)

    def resume(self, role: str) -> None:
        self._recorded_proc(role).signal(signal.SIGCONT)

    def _recorded_proc(self, role: str) -> Proc:
        running = self.recorded()
        if running is None:
            raise ServerError("the host bed is not running: `python -m mailq_servers up hosts`")
        if role not in running.procs:
            raise ServerError(
                f"the host bed has no process {role!r} (its processes: {', '.join(running.procs)})"
            )
        return running.procs[role]

    def _amqp_password(self) -> str:
        """The bed's RabbitMQ password, chosen once per cache and kept readable by its owner only."""
        path = self.home / "amqp-password"
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            pass
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(24))
        return path.read_text().strip()


def _hosts(run_dir: Path) -> dict[str, Host]:
    directories = {name: run_dir / name for name in ADDRESSES}
    return {
        name: Host(
            name,
            address,
            directories[name],
            tuple(path for other, path in directories.items() if other != name),
        )
        for name, address in ADDRESSES.items()
    }


def _together(
    steps: dict[str, Callable[[], Any]], on_error: Callable[[], None] | None = None
) -> dict[str, Any]:
    """Run the steps in threads at once (the servers of the bed start and stop together, not one after
    the other); their results by name, or the first failure once all returned."""
    results: dict[str, Any] = {}
    errors: list[BaseException] = []

    def run(name: str, step: Callable[[], Any]) -> None:
        try:
            results[name] = step()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=item, name=f"hosts-{item[0]}") for item in steps.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        if on_error is not None:
            on_error()
        raise errors[0]
    return results


def running_facts() -> HostBedServers:
    """The running bed's facts, or ServerError naming the command that starts it."""
    found = HostBed().running()
    if found is None:
        raise ServerError("the host bed is not running: `python -m mailq_servers up hosts`")
    return HostBedServers(**found.facts)


def processes_reading_elsewhere(bed: HostBed) -> Iterator[str]:
    """Each process of a host that has a file, or its working directory, in another host's directory:
    the check that the hosts' views of the files stay apart."""
    for host in bed.hosts.values():
        for pid in host.pids():
            for path in _paths_of(pid):
                for other in host.others:
                    if path == other or other in path.parents:
                        yield f"pid {pid} of {host.name} uses {path}, {other.name}'s"


def _paths_of(pid: int) -> list[Path]:
    proc = Path(f"/proc/{pid}")
    found = []
    for link in [proc / "cwd", *_entries(proc / "fd")]:
        try:
            target = os.readlink(link)
        except OSError:
            continue
        if target.startswith("/"):
            found.append(Path(target))
    return found


def _entries(directory: Path) -> list[Path]:
    try:
        return list(directory.iterdir())
    except OSError:
        return []
