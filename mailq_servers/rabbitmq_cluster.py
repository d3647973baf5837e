"""A three-node RabbitMQ cluster beside the single node, for the tests of replicated (quorum) queues and
of a node's loss: three nodes of Debian's `rabbitmq-server` with their own names, AMQP and distribution
ports, base directories and one shared Erlang cookie, registered with an epmd of the cluster's own (never
the single node's), joined with `rabbitmqctl join_cluster`, on loopback only.

Started on demand only (`python -m mailq_servers up rabbitmq-cluster`, or the module-scoped fixture of the
tests that need it), never by a plain `up`: it costs three Erlang VMs. The harness can SIGKILL a node and
start it again on its data (`kill_node`, `start_node`), or the whole cluster (`kill_all`, `start_all`), and
tell which node leads a quorum queue (`leaders`). The host bed (host_bed.py) runs the same class with a
node on each of its server hosts, each on the standard ports of its own address."""

from __future__ import annotations

import json
import secrets
import signal
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from .base import Place, Proc, Running, Server, ServerError, port_answers, port_setting
from .certificates import ClientTls
from .rabbitmq import GUEST, RabbitMQ, RabbitMQServer

if TYPE_CHECKING:
    from collections.abc import Sequence

NODES = 3
CLUSTER_NAME = "mailq-cluster"


def node_name(index: int) -> str:
    return f"mailq-c{index}@localhost"


@dataclass(frozen=True)
class RabbitMQClusterServer:
    """How to reach the cluster: every node's address and AMQP port, and the broker URL naming them all
    (with the user, unless it is RabbitMQ's guest; its password goes in MAILQ_AMQP_PASSWORD)."""

    hosts: list[str]
    ports: list[int]
    nodes: list[str]
    username: str
    password: str
    tls: ClientTls | None = None  # the CA and client certificate of nodes that speak amqps only

    def __post_init__(self) -> None:
        if isinstance(self.tls, dict):  # as read back from the state file
            object.__setattr__(self, "tls", ClientTls(**self.tls))

    def broker_url(self, vhost: str = "/", **options: str) -> str:
        hosts = ",".join(f"{host}:{port}" for host, port in zip(self.hosts, self.ports, strict=True))
        user = "" if (self.username, self.password) == GUEST else f"{quote(self.username, safe='')}@"
        query = f"?{urlencode(options)}" if options else ""
        scheme = "amqps" if self.tls else "amqp"
        return f"{scheme}://{user}{hosts}/{quote(vhost, safe='') if vhost != '/' else ''}{query}"

    def node_server(self, index: int, vhost: str = "/") -> RabbitMQServer:
        """Node `index` (1..3) alone, as a client of one node reaches it."""
        return RabbitMQServer(
            self.hosts[index - 1],
            self.ports[index - 1],
            self.username,
            self.password,
            vhost,
            self.nodes[index - 1],
            self.tls,
        )

    def env(self) -> dict[str, str]:
        return {"MAILQ_AMQP_CLUSTER_URL": self.broker_url()}


class RabbitMQCluster(Server):
    name = "rabbitmq-cluster"
    port_settings = {
        **{f"amqp{n}": (f"MAILQ_RABBITMQ_CLUSTER_PORT{n}", 16580 + n) for n in range(1, NODES + 1)},
        **{
            f"distribution{n}": (f"MAILQ_RABBITMQ_CLUSTER_DIST_PORT{n}", 26580 + n)
            for n in range(1, NODES + 1)
        },
    }
    main_process = "n1"
    epmd_setting = ("MAILQ_RABBITMQ_CLUSTER_EPMD_PORT", 14379)

    def __init__(
        self,
        cache: Path | None = None,
        *,
        run_dir: Path | None = None,
        places: Sequence[Place] | None = None,
        node_dirs: Sequence[Path] | None = None,
        ports: dict[str, int] | None = None,
        epmd_port: int | None = None,
        user: tuple[str, str] = GUEST,
    ) -> None:
        """The loopback cluster by default; a bed's gives each node its host (`places`, the node named
        rabbit@<host name>), its directory there, the ports (amqp1..3, distribution1..3), its epmd's
        port and a user of its own."""
        super().__init__(cache, run_dir=run_dir)
        self.places = tuple(places or (Place() for _ in range(NODES)))
        self.node_names = (
            [f"rabbit@{place.host_name}" for place in self.places]
            if places
            else [node_name(index) for index in range(1, NODES + 1)]
        )
        self.node_dirs = tuple(
            node_dirs or (self.run_dir / f"n{index}" / "rabbitmq" / "run" for index in range(1, NODES + 1))
        )
        self._ports = ports
        self._epmd_port = epmd_port
        self.user = user

    def ports(self) -> dict[str, int]:
        return dict(self._ports) if self._ports is not None else super().ports()

    def epmd_port(self) -> int:
        if self._epmd_port is not None:
            return self._epmd_port
        return port_setting(*self.epmd_setting)

    def node(self, index: int) -> RabbitMQ:
        """Node `index` (1..3) as a RabbitMQ server of the harness, in its directory."""
        ports = self.ports()
        return self.node_type(
            self.cache,
            node=self.node_names[index - 1],
            ports={"amqp": ports[f"amqp{index}"], "distribution": ports[f"distribution{index}"]},
            epmd_port=self.epmd_port(),
            place=self.places[index - 1],
            run_dir=self.node_dirs[index - 1],
            user=self.user,
            distribution_tls=self.distribution_tls(index),
        )

    @property
    def node_type(self) -> type[RabbitMQ]:
        """The class of the nodes: one whose AMQP listener speaks TLS is another."""
        return RabbitMQ

    def distribution_tls(self, index: int) -> Path | None:
        """The ssl_dist_optfile of node `index` in a cluster whose nodes speak TLS to each other; None for
        the clear."""
        return None

    def client_tls(self) -> ClientTls | None:
        """The CA and client certificate of a cluster whose clients must speak amqps; None for plain AMQP."""
        return None

    def nodes(self) -> list[RabbitMQ]:
        return [self.node(index) for index in range(1, NODES + 1)]

    def installed(self) -> bool:
        return self.node(1).installed()

    def install(self) -> None:
        self.node(1).install()

    def launch(self) -> dict[str, Proc]:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        cookie_file = self.run_dir / "cookie"
        if not cookie_file.exists():
            cookie_file.write_text(secrets.token_hex(16).upper())
        fresh = not (self.run_dir / "joined").exists()
        for node in self.nodes():
            _share_cookie(node, cookie_file.read_text())
        procs = self._launch_all()
        if fresh:
            self.wait_ready(procs)
            self._join()
        return procs

    def _launch_all(self) -> dict[str, Proc]:
        """Start the three VMs together: a node that was not the last to stop waits, at boot, for the
        others, so starting them one after another would wait for nothing."""
        procs: dict[str, Proc] = {}
        errors: list[BaseException] = []

        def launch(index: int, node: RabbitMQ) -> None:
            try:
                procs[f"n{index}"] = node.launch()["server"]
            except BaseException as error:
                errors.append(error)

        threads = [
            threading.Thread(target=launch, args=(index, node)) for index, node in enumerate(self.nodes(), 1)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            for proc in procs.values():
                proc.terminate(self.name, timeout=30)
            raise errors[0]
        return {f"n{index}": procs[f"n{index}"] for index in range(1, NODES + 1)}

    def _join(self) -> None:
        first = self.node_names[0]
        for node in self.nodes()[1:]:
            node.ctl("stop_app")
            node.ctl("join_cluster", first)
            node.ctl("start_app")
        self.node(1).ctl("set_cluster_name", CLUSTER_NAME)
        members = self.members()
        if sorted(members) != sorted(self.node_names):
            raise ServerError(f"rabbitmq-cluster: the nodes did not join into one cluster: {members}")
        (self.run_dir / "joined").write_text("")

    def members(self) -> list[str]:
        """The running members of the cluster, as node 1 sees them (or the first node that answers)."""
        for node in self.nodes():
            try:
                status = json.loads(node.ctl("cluster_status", "--formatter", "json"))
            except (ServerError, ValueError):
                continue
            return list(status.get("running_nodes", []))
        raise ServerError("rabbitmq-cluster: no node answers cluster_status")

    def wait_ready(self, procs: dict[str, Proc]) -> None:
        errors: list[BaseException] = []

        def wait(index: int) -> None:
            try:
                self.node(index).wait_ready({"server": procs[f"n{index}"]})
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=wait, args=(index,)) for index in range(1, NODES + 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]

    def serving(self, running: Running) -> bool:
        return all(
            running.procs[f"n{index}"].alive()
            and running.procs[f"n{index}"].owns_listener(running.ports[f"amqp{index}"])
            for index in range(1, NODES + 1)
        )

    def facts(self) -> dict[str, Any]:
        ports = self.ports()
        return asdict(
            RabbitMQClusterServer(
                [place.address for place in self.places],
                [ports[f"amqp{index}"] for index in range(1, NODES + 1)],
                list(self.node_names),
                *self.user,
                tls=self.client_tls(),
            )
        )

    def shut_down(self, procs: dict[str, Proc]) -> None:
        # Stopped together, so that no node waits at its next boot for a peer that stopped after it.
        threads = [
            threading.Thread(target=self.node(index).shut_down, args=({"server": procs[f"n{index}"]},))
            for index in range(1, NODES + 1)
            if f"n{index}" in procs
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    # Faults.

    def kill_node(self, index: int) -> None:
        """SIGKILL node `index` (1..3), as a crash would; `start_node` starts it again on its data."""
        with self.lock():
            running = self._recorded_or_fail()
            _kill(running, index, self.places[index - 1].address)

    def start_node(self, index: int) -> None:
        """Start node `index` again (after `kill_node`) and wait until it serves; it rejoins by itself."""
        with self.lock():
            running = self._recorded_or_fail()
            node = self.node(index)
            proc = node.launch()["server"]
            procs = {**running.procs, f"n{index}": proc}
            self._write_state(Running(procs=procs, ports=running.ports, facts=running.facts))
            node.wait_ready({"server": proc})

    def kill_all(self) -> None:
        """SIGKILL every node (the whole cluster lost at once)."""
        with self.lock():
            running = self._recorded_or_fail()
            for index in range(1, NODES + 1):
                running.procs[f"n{index}"].signal(signal.SIGKILL)
            for index in range(1, NODES + 1):
                _kill(running, index, self.places[index - 1].address)

    def start_all(self) -> None:
        """Start every node again (after `kill_all`), together, and wait until all serve."""
        with self.lock():
            running = self._recorded_or_fail()
            procs = self._launch_all()
            self._write_state(Running(procs=procs, ports=running.ports, facts=running.facts))
            self.wait_ready(procs)

    def leaders(self, vhost: str = "/") -> dict[str, str]:
        """The leader node of each quorum queue of `vhost`, by queue name, from the first node answering."""
        for node in self.nodes():
            try:
                listed = node.ctl("list_queues", "-p", vhost, "name", "type", "leader", "--formatter", "json")
            except ServerError:
                continue
            return {row["name"]: row["leader"] for row in json.loads(listed) if row.get("type") == "quorum"}
        raise ServerError("rabbitmq-cluster: no node answers list_queues")

    def ctl(self, *arguments: str) -> str:
        """rabbitmqctl on the first node that answers."""
        last: ServerError | None = None
        for node in self.nodes():
            try:
                return node.ctl(*arguments)
            except ServerError as error:
                last = error
        raise ServerError(f"rabbitmq-cluster: no node answers ({last})")

    def index_of(self, node: str) -> int:
        return self.node_names.index(node) + 1

    def _recorded_or_fail(self) -> Running:
        running = self.recorded()
        if running is None:
            raise ServerError("rabbitmq-cluster: not running")
        return running


def _share_cookie(node: RabbitMQ, cookie: str) -> None:
    """The one cookie of the cluster in the node's $HOME, where its VM and rabbitmqctl read it."""
    home = node.run_dir / "home"
    home.mkdir(parents=True, exist_ok=True)
    path = home / ".erlang.cookie"
    if path.exists() and path.read_text() == cookie:
        return
    path.unlink(missing_ok=True)
    path.write_text(cookie)
    path.chmod(0o400)


def _kill(running: Running, index: int, address: str) -> None:
    """SIGKILL node `index` and wait until its process and its ports are gone."""
    proc = running.procs[f"n{index}"]
    ports = [running.ports[f"amqp{index}"], running.ports[f"distribution{index}"]]
    proc.signal(signal.SIGKILL)
    if not proc.wait_gone(30):
        raise ServerError(f"rabbitmq-cluster: pid {proc.pid} still alive 30 s after SIGKILL")
    deadline = time.monotonic() + 30
    while any(port_answers(port, address) for port in ports):
        if time.monotonic() > deadline:
            raise ServerError("rabbitmq-cluster: a killed node's ports still answer 30 s after SIGKILL")
        time.sleep(0.1)
