"""RabbitMQ from Debian's `rabbitmq-server`, as a self-contained node: its own base directory, node name,
Erlang cookie and epmd in the cache, configured through RABBITMQ_* variables, so /etc and any system
instance are left alone."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from .base import (
    HOST,
    LOOPBACK,
    Place,
    Proc,
    Server,
    ServerError,
    log_tails,
    port_answers,
    port_setting,
    say,
    wait_for,
)
from .certificates import ClientTls
from .system_packages import missing_program

if TYPE_CHECKING:
    import pika

SCRIPTS = Path("/usr/lib/rabbitmq/bin")
NODE = "mailq@localhost"
#: RabbitMQ's own user, which it lets in from loopback only.
GUEST = ("guest", "guest")


@dataclass(frozen=True)
class RabbitMQServer:
    """How to reach the broker: `url` for an AMQP client, or `connection_parameters()` for pika."""

    host: str
    port: int
    username: str
    password: str
    vhost: str
    node: str
    tls: ClientTls | None = None  # the CA and client certificate of a node that speaks amqps only

    def __post_init__(self) -> None:
        if isinstance(self.tls, dict):  # as read back from the state file
            object.__setattr__(self, "tls", ClientTls(**self.tls))

    @property
    def scheme(self) -> str:
        return "amqps" if self.tls else "amqp"

    @property
    def url(self) -> str:
        where = f"{self.host}:{self.port}/{quote(self.vhost, safe='')}"
        return f"{self.scheme}://{self.username}:{self.password}@{where}"

    def connection_parameters(self, **options: Any) -> pika.ConnectionParameters:
        import pika

        if self.tls is not None:
            options.setdefault("ssl_options", pika.SSLOptions(self.tls.context(), server_hostname=self.host))
        return pika.ConnectionParameters(
            host=self.host,
            port=self.port,
            virtual_host=self.vhost,
            credentials=pika.PlainCredentials(self.username, self.password),
            **options,
        )

    def env(self) -> dict[str, str]:
        if self.tls:
            return {"MAILQ_AMQPS_URL": self.url, **self.tls.env()}
        return {"MAILQ_AMQP_URL": self.url}


class RabbitMQ(Server):
    name = "rabbitmq"
    port_settings = {
        "amqp": ("MAILQ_RABBITMQ_PORT", 16572),
        "distribution": ("MAILQ_RABBITMQ_DIST_PORT", 26572),
    }

    def __init__(
        self,
        cache: Path | None = None,
        *,
        node: str = NODE,
        ports: dict[str, int] | None = None,
        epmd_port: int | None = None,
        place: Place = LOOPBACK,
        run_dir: Path | None = None,
        user: tuple[str, str] = GUEST,
        distribution_tls: Path | None = None,
    ) -> None:
        """A node at `place` (this machine's loopback by default); `user`, when not RabbitMQ's guest, is
        made at the node's first boot for the clients of other hosts, which guest may not serve;
        `distribution_tls`: the ssl_dist_optfile of a node whose links to its peers (and rabbitmqctl's
        to it) speak TLS, None for the Erlang distribution in the clear."""
        super().__init__(cache, run_dir=run_dir)
        self.node = node
        self._ports = ports
        self._epmd_port = epmd_port
        self.place = place
        self.user = user
        self.distribution_tls = distribution_tls
        self.pid_file = self.run_dir / "rabbit.pid"
        self.log = self.run_dir / "log" / "rabbit.log"
        self.launch_log = self.run_dir / "log" / "launch.log"

    @classmethod
    def private(cls, directory: Path) -> RabbitMQ:
        """A node of its own in `directory`, on free ports and with its own epmd: for tests that stop, kill
        or restart RabbitMQ, which must never do that to the shared node other test runs are using."""
        amqp, distribution, epmd = _free_ports(3)
        return cls(
            directory,
            node=f"mailq-{secrets.token_hex(4)}@localhost",
            ports={"amqp": amqp, "distribution": distribution},
            epmd_port=epmd,
        )

    def ports(self) -> dict[str, int]:
        return dict(self._ports) if self._ports is not None else super().ports()

    def epmd_port(self) -> int:
        # Its own epmd, so that stopping it never disturbs another Erlang node of the machine.
        if self._epmd_port is not None:
            return self._epmd_port
        return port_setting("MAILQ_RABBITMQ_EPMD_PORT", 14369)

    def installed(self) -> bool:
        return (SCRIPTS / "rabbitmq-server").exists() and (SCRIPTS / "rabbitmqctl").exists()

    def install(self) -> None:
        raise missing_program("rabbitmq-server")

    def launch(self) -> dict[str, Proc]:
        ports = self.ports()
        for directory in ("home", "log", "mnesia"):
            (self.run_dir / directory).mkdir(parents=True, exist_ok=True)
        address = self.place.address
        default_user = (
            "" if self.user == GUEST else (f"default_user = {self.user[0]}\ndefault_pass = {self.user[1]}\n")
        )
        conf = self.run_dir / "rabbitmq.conf"
        conf.write_text(
            self.listener_conf(ports["amqp"]) + f"distribution.listener.interface = {address}\n"
            f"distribution.listener.port_range.min = {ports['distribution']}\n"
            f"distribution.listener.port_range.max = {ports['distribution']}\n" + default_user
        )
        conf.chmod(0o600)
        (self.run_dir / "rabbitmq-env.conf").write_text("")
        (self.run_dir / "enabled_plugins").write_text("[].\n")
        self.pid_file.unlink(missing_ok=True)
        if self.log.exists():
            self.log.replace(self.log.with_name("rabbit.log.previous"))
        with self.launch_log.open("w") as out:
            launcher = subprocess.run(
                self.place.command([str(SCRIPTS / "rabbitmq-server"), "-detached"]),
                env=self._env(),
                cwd=self.run_dir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=120,
                # The detached VM in a session of its own, as `spawn` does: a shell or job that ends and
                # signals its process group does not take the node down with it.
                start_new_session=True,
            )
        if launcher.returncode != 0:
            failed = f"rabbitmq-server -detached failed (exit {launcher.returncode})"
            raise ServerError(f"{failed}; {log_tails([self.launch_log])}")
        # The detached VM writes its pid file early in its boot.
        deadline = time.monotonic() + 60
        while not self._pid_from_file():
            if time.monotonic() > deadline:
                raise ServerError(
                    f"rabbitmq wrote no pid file in 60 s; {log_tails([self.launch_log, self.log])}"
                )
            time.sleep(0.1)
        return {"server": Proc.of(self._pid_from_file())}

    def listener_conf(self, port: int) -> str:
        """The rabbitmq.conf lines of the client listener."""
        return f"listeners.tcp.default = {self.place.address}:{port}\n"

    def listener_env(self, port: int) -> dict[str, str]:
        """The variables of the client listener (rabbitmqctl reads them too)."""
        return {"RABBITMQ_NODE_IP_ADDRESS": self.place.address, "RABBITMQ_NODE_PORT": str(port)}

    def wait_ready(self, procs: dict[str, Proc]) -> None:
        server = procs["server"]
        ports = self.ports()
        logs = [self.log, self.launch_log]
        # The AMQP listener opens at the end of the boot; then a real AMQP handshake.
        wait_for("rabbitmq", lambda: server.owns_listener(ports["amqp"]), alive=server.alive, logs=logs)
        wait_for("rabbitmq", self._amqp_answers, alive=server.alive, logs=logs, timeout=60)

    def facts(self) -> dict:
        return asdict(RabbitMQServer(self.place.address, self.ports()["amqp"], *self.user, "/", self.node))

    def shut_down(self, procs: dict[str, Proc]) -> None:
        server = procs["server"]
        # Over the TLS distribution `rabbitmqctl stop` never returned (180 s, three nodes of three): such a
        # node is stopped by SIGTERM alone, which it takes as a graceful shutdown.
        if server.alive() and self.distribution_tls is None:
            # The pid file form waits until the VM has exited; plain `stop` returns before.
            ctl = [str(SCRIPTS / "rabbitmqctl"), "-n", self.node, "stop", str(self.pid_file)]
            try:
                stop = subprocess.run(
                    self.place.command(ctl),
                    env=self._env(),
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    text=True,
                    timeout=180,
                )
                failed = stop.stderr.strip()[-200:] if stop.returncode != 0 else None
            except subprocess.TimeoutExpired:
                failed = "no answer in 180 s"
            if failed is not None:
                say(f"rabbitmq: rabbitmqctl stop failed ({failed}), sending SIGTERM")
        server.terminate("rabbitmq", timeout=60)
        self._stop_epmd()

    def kill(self) -> None:
        """SIGKILL the running node, as a crash would. Its state file stays, so the next `ensure()` finds it
        dead, cleans up and starts it again on the same data."""
        with self.lock():
            running = self.recorded()
            if running is None:
                raise ServerError("rabbitmq: no running node to kill")
            server = running.procs["server"]
            server.signal(signal.SIGKILL)
            if not server.wait_gone(30):
                raise ServerError(f"rabbitmq: pid {server.pid} still alive 30 s after SIGKILL")
            # A dying VM's threads may still hold its listeners for a moment after it shows as dead.
            deadline = time.monotonic() + 30
            while any(port_answers(port, self.place.address) for port in running.ports.values()):
                if time.monotonic() > deadline:
                    raise ServerError("rabbitmq: its ports still answer 30 s after SIGKILL")
                time.sleep(0.1)

    def ctl(self, *arguments: str) -> str:
        """Run `rabbitmqctl` on this node; its output, or ServerError with its message."""
        done = subprocess.run(
            self.place.command([str(SCRIPTS / "rabbitmqctl"), "-q", "-n", self.node, *arguments]),
            env=self._env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip()[-300:]
            raise ServerError(f"rabbitmqctl {' '.join(arguments)}: {said}")
        return done.stdout

    def _env(self) -> dict[str, str]:
        run = self.run_dir
        ports = self.ports()
        address = self.place.address
        distribution = ""
        if self.distribution_tls is not None:
            distribution = f" -proto_dist inet_tls -ssl_dist_optfile {self.distribution_tls}"
        return {
            **os.environ,
            # The Erlang cookie lives in $HOME: this node's own, shared with rabbitmqctl.
            "HOME": str(run / "home"),
            "RABBITMQ_NODENAME": self.node,
            **self.listener_env(ports["amqp"]),
            "RABBITMQ_DIST_PORT": str(ports["distribution"]),
            "RABBITMQ_CONFIG_FILE": str(run / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(run / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(run / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(run / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(run / "mnesia"),
            "RABBITMQ_LOG_BASE": str(run / "log"),
            "RABBITMQ_LOGS": str(self.log),
            "RABBITMQ_PID_FILE": str(self.pid_file),
            "ERL_EPMD_ADDRESS": address,
            "ERL_EPMD_PORT": str(self.epmd_port()),
            # Schedulers that sleep instead of spinning: the machine is small and shared.
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": f"+sbwt none +sbwtdcpu none +sbwtdio none{distribution}",
            "RABBITMQ_CTL_ERL_ARGS": (
                f"-kernel inet_dist_use_interface {{{address.replace('.', ',')}}}{distribution}"
            ),
        }

    def _pid_from_file(self) -> int:
        try:
            text = self.pid_file.read_text().strip()
        except FileNotFoundError:
            return 0
        return int(text) if text.isdigit() else 0

    def _amqp_answers(self) -> bool:
        import logging

        import pika

        # pika logs every refused attempt at ERROR; a refusal here only means "not yet".
        pika_logger = logging.getLogger("pika")
        level = pika_logger.level
        pika_logger.setLevel(logging.CRITICAL)
        try:
            facts = RabbitMQServer(**self.facts())
            pika.BlockingConnection(
                facts.connection_parameters(connection_attempts=1, socket_timeout=5)
            ).close()
        except pika.exceptions.AMQPError:
            return False
        finally:
            pika_logger.setLevel(level)
        return True

    def _stop_epmd(self) -> None:
        """Stop this node's epmd, unless another node registered with it meanwhile."""
        epmd = shutil.which("epmd")
        if epmd is None:
            return
        port = ["-port", str(self.epmd_port())]
        names = subprocess.run(
            self.place.command([epmd, *port, "-names"]), capture_output=True, text=True, timeout=30
        )
        if names.returncode == 0 and "name " not in names.stdout:
            subprocess.run(self.place.command([epmd, *port, "-kill"]), capture_output=True, timeout=30)


def _free_ports(count: int) -> list[int]:
    """`count` loopback ports free right now (held open together, so that they differ)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for one in sockets:
            one.bind((HOST, 0))
        return [one.getsockname()[1] for one in sockets]
    finally:
        for one in sockets:
            one.close()


class Vhosts:
    """Virtual hosts on a RabbitMQ node of the harness, an empty one for each test that asks: made in
    batches, since one rabbitmqctl call costs seconds, handed on once emptied, and all deleted by
    `delete_all`."""

    # A batch doubles each time, from FIRST_BATCH: a run of a few tests pays for few vhosts (each costs
    # RabbitMQ two message stores), a run of hundreds for few rabbitmqctl calls.
    FIRST_BATCH, LAST_BATCH = 8, 64

    def __init__(self, node: RabbitMQ, user: str) -> None:
        self.node = node
        self.user = user
        self.prefix = f"mailq-test-{int(time.time())}-{secrets.token_hex(3)}"
        self.made: list[str] = []
        self.free: list[str] = []

    def take(self) -> str:
        if not self.free:
            size = min(max(self.FIRST_BATCH, len(self.made)), self.LAST_BATCH)
            batch = [f"{self.prefix}-{len(self.made) + n}" for n in range(size)]
            self.node.ctl("eval", _erlang_each(batch, self._add))
            self.made += batch
            self.free += batch
        return self.free.pop(0)

    def _add(self, vhost: str) -> str:
        everything = _binary(".*")
        return (
            f'ok = rabbit_vhost:add({vhost}, <<"mailq-tests">>), '
            f"ok = rabbit_auth_backend_internal:set_permissions({_binary(self.user)}, {vhost}, "
            f'{everything}, {everything}, {everything}, <<"mailq-tests">>)'
        )

    def give_back(self, vhost: str) -> None:
        """A vhost its test emptied (no queue, no consumer left) serves the next test."""
        self.free.append(vhost)

    def delete_all(self) -> None:
        if self.made:
            self.node.ctl(
                "eval", _erlang_each(self.made, lambda v: f'rabbit_vhost:delete({v}, <<"mailq-tests">>)')
            )


def _binary(text: str) -> str:
    return "<<" + json.dumps(text) + ">>"


def _erlang_each(vhosts: list[str], step) -> str:
    return f"[begin {step('V')} end || V <- [{', '.join(_binary(v) for v in vhosts)}]], ok."
