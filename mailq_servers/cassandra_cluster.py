"""Three Cassandra 5.0.9 nodes on 127.0.0.1, 127.0.0.2 and 127.0.0.3, one JVM each, for the tests of a
replicated keyspace: the same native and storage ports on each address, each node its own data and logs
under the cache's cassandra-cluster/run/nodeN, seed 127.0.0.1, one token a node spread evenly over the
ring, SimpleSnitch (one datacenter). The host bed (host_bed.py) runs the same class with a node on each
of its server hosts: the first node is always the seed.

The cluster is durable (no skipped syncs, whatever MAILQ_SERVERS_UNSAFE says): its point is surviving a
node's SIGKILL. `python -m mailq_servers up` leaves it out; `up cassandra-cluster` starts it, and the
`cassandra_cluster` fixture starts it for the tests that need it and stops it after them. `kill(node)`,
`stop_node(node)`, `start_node(node)` and `node_up(node)` act on one node (1, 2 or 3), for fault tests.

The nodes start together: on an empty cluster whose nodes have their tokens given, `auto_bootstrap: false`
lets each join without streaming, so they need not bootstrap one after the other. A node restarted on its
data rejoins with the tokens it saved."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from .base import Place, Proc, Running, Server, ServerError, log_contains, port_answers, say, wait_for
from .cassandra import (
    DATACENTER,
    Cassandra,
    CassandraServer,
    cql_round_trip,
    launch_node,
    listening_line,
    serves_cql,
    write_node_config,
)
from .certificates import ClientTls

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from cassandra.cluster import Cluster

ADDRESSES = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
# Murmur3's ring is [-2**63, 2**63): a third of it a node.
TOKENS = (-6148914691236517206, 0, 6148914691236517206)
CLUSTER_NAME = "mailq-cluster"
# Cassandra's default rather than the single node's 15 s: a counter update whose leader replica died
# unconvicted times out, and the store sends it again (stores/cassandra/store.py); at 5 s a few tries fit
# in a request's 30 s while the others' failure detectors take 16-18 s to convict a killed node.
COUNTER_WRITE_TIMEOUT = "5000ms"
# Only right while the cluster is empty or restarts on its own data: a node that joins a cluster holding
# data would serve its token range empty.
EXTRA_YAML = "auto_bootstrap: false\n"
# How long a stop waits for a node's own shutdown (it flushes its memtables, in 2-3 s) before it kills it.
# A node's commit log syncs each write before its acknowledgement (batch), so a kill loses nothing the
# node acknowledged: its restart replays the log. Nodes that hang in their shutdown (seen with TLS on a
# loaded machine, none logging why) cost this wait and no more.
STOP_WAIT = 30


@dataclass(frozen=True)
class CassandraClusterServer:
    """How to reach the cluster: `Cluster(list(hosts), port=port)`, local datacenter `datacenter`."""

    hosts: tuple[str, ...]
    port: int
    datacenter: str
    tls: ClientTls | None = None  # the CA and client certificate of a cluster that speaks TLS only

    def __post_init__(self) -> None:
        object.__setattr__(self, "hosts", tuple(self.hosts))  # a list once read back from JSON
        if isinstance(self.tls, dict):
            object.__setattr__(self, "tls", ClientTls(**self.tls))

    @property
    def contact_points(self) -> str:
        """The hosts part of a mailq URL: every node, so that the runtime connects while any is up."""
        return ",".join(f"{host}:{self.port}" for host in self.hosts)

    def cluster(self, **options: Any) -> Cluster:
        """A cassandra-driver `Cluster` on every node (not yet connected); options go to `Cluster`."""
        from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
        from cassandra.policies import DCAwareRoundRobinPolicy

        profile = ExecutionProfile(
            load_balancing_policy=DCAwareRoundRobinPolicy(local_dc=self.datacenter), request_timeout=60
        )
        options.setdefault("execution_profiles", {EXEC_PROFILE_DEFAULT: profile})
        if self.tls is not None:
            options.setdefault("ssl_context", self.tls.context())
        return Cluster(list(self.hosts), port=self.port, **options)

    def env(self) -> dict[str, str]:
        return {
            "MAILQ_CASSANDRA_CLUSTER_HOSTS": ",".join(self.hosts),
            "MAILQ_CASSANDRA_CLUSTER_PORT": str(self.port),
        }


class CassandraCluster(Server):
    name = "cassandra-cluster"
    port_settings = {
        "native": ("MAILQ_CASSANDRA_CLUSTER_PORT", 29042),
        "storage": ("MAILQ_CASSANDRA_CLUSTER_STORAGE_PORT", 27000),
    }
    main_process = "node1"
    cluster_name = CLUSTER_NAME
    heap_setting = ("MAILQ_CASSANDRA_CLUSTER_HEAP", "1g")

    def __init__(
        self,
        cache: Path | None = None,
        *,
        run_dir: Path | None = None,
        places: Sequence[Place] | None = None,
        node_dirs: Sequence[Path] | None = None,
        ports: dict[str, int] | None = None,
        heap: str | None = None,
        cluster_name: str | None = None,
    ) -> None:
        """The loopback cluster by default; a bed's (host_bed.py) gives each node its host (`places`), its
        directory on that host, the ports, the same on every host, and its name (which a node's data
        keeps: a node refuses to start under another)."""
        super().__init__(cache, run_dir=run_dir)
        # The jars are the single node's: one download serves both.
        self.single = Cassandra(self.cache)
        self.places = tuple(places or (Place(address) for address in ADDRESSES))
        self.addresses = tuple(place.address for place in self.places)
        numbers = range(1, len(self.places) + 1)
        self.node_dirs = tuple(node_dirs or (self.run_dir / f"node{n}" for n in numbers))
        self._ports = ports
        self.heap = heap or os.environ.get(*self.heap_setting)
        self.cluster_name = cluster_name or self.cluster_name

    def ports(self) -> dict[str, int]:
        return dict(self._ports) if self._ports is not None else super().ports()

    def role(self, node: int) -> str:
        if node not in range(1, len(self.places) + 1):
            raise ServerError(f"cassandra-cluster has nodes 1 to {len(self.places)}, not {node!r}")
        return f"node{node}"

    def node_dir(self, node: int) -> Path:
        self.role(node)  # refuses a node that is not there
        return self.node_dirs[node - 1]

    def system_log(self, node: int) -> Path:
        return self.node_dir(node) / "logs" / "system.log"

    def installed(self) -> bool:
        return self.single.installed()

    def install(self) -> None:
        with self.single.lock():
            if not self.single.installed():
                self.single.install()

    def launch(self) -> dict[str, Proc]:
        return {self.role(node): self._launch(node) for node in range(1, len(self.places) + 1)}

    def _launch(self, node: int) -> Proc:
        place = self.places[node - 1]
        write_node_config(
            self.node_dir(node) / "conf",
            address=place.address,
            token=TOKENS[node - 1],
            seeds=self.addresses[0],
            cluster_name=self.cluster_name,
            counter_write_timeout=COUNTER_WRITE_TIMEOUT,
            unsafe=False,
            extra=EXTRA_YAML + self.extra_yaml(node),
        )
        ports = self.ports()
        return launch_node(
            self.single.lib,
            self.node_dir(node),
            native=ports["native"],
            storage=ports["storage"],
            heap=self.heap,
            unsafe=False,
            place=place,
        )

    def extra_yaml(self, node: int) -> str:
        """What node `node`'s cassandra.yaml adds to the common one and EXTRA_YAML."""
        return ""

    def client_tls(self) -> ClientTls | None:
        """The CA and client certificate of a cluster whose clients must speak TLS; None for plaintext."""
        return None

    def wait_ready(self, procs: dict[str, Proc]) -> None:
        for role, proc in procs.items():
            self._wait_listening(int(role.removeprefix("node")), proc)
        self.wait_ring()

    def _wait_listening(self, node: int, proc: Proc) -> None:
        address, port = self.addresses[node - 1], self.ports()["native"]
        log = self.system_log(node)
        wait_for(
            f"cassandra-cluster node {node}",
            lambda: serves_cql(log, address, port),
            alive=proc.alive,
            logs=[log, log.with_name("stdout.log")],
        )
        cql_round_trip(CassandraServer(address, port, DATACENTER, tls=self.client_tls()))

    def wait_ring(self, addresses: tuple[str, ...] | None = None, timeout: float = 120) -> None:
        """Until a driver connection sees the nodes at `addresses` up and each node's gossip sees them
        NORMAL (`nodetool status` would say UN for them)."""
        addresses = self.addresses if addresses is None else addresses
        deadline = time.monotonic() + timeout
        facts = CassandraClusterServer(**self.facts())
        cluster = facts.cluster(connect_timeout=30, control_connection_timeout=30)
        try:
            session = cluster.connect()
            while True:
                seen = _ring_view(cluster, session, self.addresses)
                if all(seen.get(address) == "UN" for address in addresses):
                    return
                if time.monotonic() > deadline:
                    raise ServerError(
                        f"cassandra-cluster: after {timeout:.0f} s the nodes' states are {seen}, not UN for "
                        f"{', '.join(addresses)}"
                    )
                time.sleep(0.5)
        finally:
            cluster.shutdown()

    def facts(self) -> dict:
        return asdict(
            CassandraClusterServer(self.addresses, self.ports()["native"], DATACENTER, self.client_tls())
        )

    def serving(self, running: Running) -> bool:
        """Every node alive and holding its ports (each on its own address: the ports are the same)."""
        return all(
            proc.alive() and all(proc.owns_listener(port) for port in running.ports.values())
            for proc in running.procs.values()
        )

    def ensure(self) -> tuple[Running, str]:
        """As Server.ensure; and when only some nodes of the recorded cluster died, those are restarted
        on their data, the others kept."""
        with self.lock():
            running = self.recorded()
            if running is not None and not self.serving(running):
                dead = [role for role, proc in running.procs.items() if not proc.alive()]
                if len(dead) < len(running.procs):
                    for role in dead:
                        self._start(int(role.removeprefix("node")), self.recorded() or running)
                    return self.recorded() or running, f"restarted {', '.join(dead)}"
            if running is None or not self.serving(running):
                self._refuse_busy_ports()
        return super().ensure()

    def _refuse_busy_ports(self) -> None:
        # Server.ensure checks 127.0.0.1 alone: each node has its own address.
        for address in self.addresses:
            for role, port in self.ports().items():
                if port_answers(port, address):
                    raise ServerError(
                        f"{self.name}: port {port} ({role}) on {address} is already in use by a process that "
                        f"is not this harness's {self.name}: stop it or choose another port with "
                        f"{self.port_settings[role][0]}=PORT"
                    )

    def shut_down(self, procs: dict[str, Proc]) -> None:
        # SIGTERM to every node at once, so they stop together rather than one after the other, and one
        # wait for them all: nodes that hang in their shutdown cost the wait once, not once a node.
        for proc in procs.values():
            proc.signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT
        for role, proc in procs.items():
            proc.terminate(f"{self.name} {role}", timeout=max(0.0, deadline - time.monotonic()))

    # One node at a time, for fault tests.

    def _proc(self, node: int) -> Proc:
        running = self.recorded()
        if running is None:
            raise ServerError(f"{self.name} is not running: `python -m mailq_servers up {self.name}`")
        return running.procs[self.role(node)]

    def kill(self, node: int) -> None:
        """SIGKILL the node, as a crash would: what it acknowledged is in its commit log."""
        proc = self._proc(node)
        proc.signal(signal.SIGKILL)
        if not proc.wait_gone(30):
            raise ServerError(f"{self.name} node {node} (pid {proc.pid}) still runs 30 s after SIGKILL")

    def stop_node(self, node: int) -> None:
        self._proc(node).terminate(f"{self.name} node {node}", timeout=STOP_WAIT)

    def node_up(self, node: int) -> bool:
        """The node's process alive and serving CQL on its address."""
        proc = self._proc(node)
        address, port = self.addresses[node - 1], self.ports()["native"]
        return proc.alive() and log_contains(self.system_log(node), listening_line(address, port))

    def start_node(self, node: int) -> None:
        """Start the stopped or killed node on its data, and wait until the ring sees it and every other
        running node UN."""
        with self.lock():
            running = self.recorded()
            if running is None:
                raise ServerError(f"{self.name} is not running: `python -m mailq_servers up {self.name}`")
            if running.procs[self.role(node)].alive():
                raise ServerError(f"{self.name} node {node} is running already")
            self._start(node, running)

    def _start(self, node: int, running: Running) -> None:
        """Under the lock: launch the node, record it, wait until it serves and the ring sees it."""
        role = self.role(node)
        say(f"{self.name}: starting {role} on its data")
        proc = self._launch(node)
        procs = {**running.procs, role: proc}
        self._write_state(Running(procs, running.ports, running.facts))
        self._wait_listening(node, proc)
        # The nodes meant to be up: a fault test may keep another one down.
        up = range(1, len(self.places) + 1)
        self.wait_ring(tuple(self.addresses[n - 1] for n in up if procs[self.role(n)].alive()))


def _ring_view(cluster, session, addresses: tuple[str, ...]) -> dict[str, str]:
    """Each node's state as `nodetool status` shows it, by address: U when the driver's connection to it
    is up (D otherwise), then N when every node that answers lists it NORMAL in its gossip, J if not."""
    from cassandra import DriverException
    from cassandra.cluster import NoHostAvailable

    hosts = cluster.metadata.all_hosts()
    states = {host.address: "U" if host.is_up else "D" for host in hosts}
    normal = {address: True for address in addresses}
    for host in hosts:
        if not host.is_up:
            continue
        try:
            rows = session.execute(
                "SELECT address, status_with_port FROM system_views.gossip_info", host=host, timeout=10
            )
        except (NoHostAvailable, DriverException, OSError):
            states[host.address] = "D"
            continue
        seen = {str(row.address): (row.status_with_port or "").startswith("NORMAL") for row in rows}
        for address in addresses:
            normal[address] = normal[address] and seen.get(address, False)
    return {address: state + ("N" if normal.get(address) else "J") for address, state in states.items()}
