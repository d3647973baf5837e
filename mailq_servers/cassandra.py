"""Cassandra 5.0.9 as one single-node `CassandraDaemon` JVM, from the Maven Central jars (no Debian or PyPI
package carries the server), tuned for tests on a small machine."""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base import (
    HOST,
    LOOPBACK,
    Place,
    Proc,
    Running,
    Server,
    ServerError,
    fresh_log,
    log_contains,
    port_answers,
    require_program,
    run_logged,
    say,
    spawn,
    unsafe_mode,
    wait_for,
)
from .certificates import ClientTls

if TYPE_CHECKING:
    from cassandra.cluster import Cluster

VERSION = "5.0.9"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.6.1"
DATACENTER = "datacenter1"

POM = f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>mailq.servers</groupId>
  <artifactId>cassandra-jars</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.cassandra</groupId>
      <artifactId>cassandra-all</artifactId>
      <version>{VERSION}</version>
    </dependency>
  </dependencies>
</project>
"""

# Cassandra 5.0 refuses unknown keys, so this holds only what differs from the defaults or has none.
# The timeouts are long because a starved 2-core machine otherwise turns slow requests into failures.
# How the commit log is synced comes from the mode (COMMITLOG_SYNC).
CASSANDRA_YAML = """cluster_name: {cluster_name}
num_tokens: 1
initial_token: {token}
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
endpoint_snitch: SimpleSnitch
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: "{seeds}"
listen_address: {address}
rpc_address: {address}
start_native_transport: true
{commitlog_sync}auto_snapshot: false
disk_access_mode: standard
read_request_timeout: 15000ms
range_request_timeout: 30000ms
write_request_timeout: 15000ms
counter_write_request_timeout: {counter_write_timeout}
cas_contention_timeout: 5000ms
truncate_request_timeout: 60000ms
request_timeout: 30000ms
"""

# The jar ships no logback configuration; the readiness check reads this file.
LOGBACK_XML = """<configuration scan="false">
  <appender name="FILE" class="ch.qos.logback.core.rolling.RollingFileAppender">
    <file>${cassandra.logdir}/system.log</file>
    <rollingPolicy class="ch.qos.logback.core.rolling.FixedWindowRollingPolicy">
      <fileNamePattern>${cassandra.logdir}/system.log.%i</fileNamePattern>
      <minIndex>1</minIndex>
      <maxIndex>3</maxIndex>
    </rollingPolicy>
    <triggeringPolicy class="ch.qos.logback.core.rolling.SizeBasedTriggeringPolicy">
      <maxFileSize>20MB</maxFileSize>
    </triggeringPolicy>
    <encoder><pattern>%-5level [%thread] %date{ISO8601} %F:%L - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="FILE"/></root>
</configuration>
"""

# The JPMS block of Cassandra's conf/jvm17-server.options: without it the daemon stops with
# "Cassandra is unable to access required classes".
JPMS_OPTIONS = [
    "-Djdk.attach.allowAttachSelf=true",
    *(
        f"--add-exports={module}=ALL-UNNAMED"
        for module in (
            "java.base/jdk.internal.misc",
            "java.management.rmi/com.sun.jmx.remote.internal.rmi",
            "java.rmi/sun.rmi.registry",
            "java.rmi/sun.rmi.server",
            "java.sql/java.sql",
            "java.base/java.lang.ref",
            "jdk.unsupported/sun.misc",
            "jdk.compiler/com.sun.tools.javac.file",
            "jdk.attach/sun.tools.attach",
        )
    ),
    *(
        f"--add-opens={module}=ALL-UNNAMED"
        for module in (
            "java.base/java.lang.module",
            "java.base/jdk.internal.loader",
            "java.base/jdk.internal.ref",
            "java.base/jdk.internal.reflect",
            "java.base/jdk.internal.math",
            "java.base/jdk.internal.module",
            "java.base/jdk.internal.util.jar",
            "jdk.management/com.sun.management.internal",
            "java.base/sun.nio.ch",
            "java.base/java.io",
            "java.base/java.lang.reflect",
            "jdk.compiler/com.sun.tools.javac",
            "java.base/java.lang",
            "java.base/java.util",
        )
    ),
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dio.netty.allocator.useCacheForAllThreads=true",
    "-Dio.netty.allocator.maxOrder=11",
]

# Speed-ups that cost no durability: no shutdown announcement nor graceful close of the internode
# connections (stop in ~2 s instead of ~6.5 s), no memtable overhead estimate (1.5 s), no jemalloc probe.
FAST_OPTIONS = [
    "-Dcassandra.shutdown_announce_in_ms=0",
    "-Dcassandra.test.messagingService.nonGracefulShutdown=true",
    "-Dcassandra.memtable.row_overhead_size=180",
    "-Dcassandra.libjemalloc=-",
]

# The suite's unsafe mode (MAILQ_SERVERS_UNSAFE=1): the system keyspace written without its commit log and
# no fsync at all make schema changes about 5x faster, but a SIGKILL then loses schema and rows: such a
# node must be stopped with SIGTERM, and is never the one a user's data lives on.
UNSAFE_OPTIONS = ["-Dcassandra.unsafesystem=true", "-Dcassandra.skip_sync=true"]


# Durable: a write is acknowledged once its commit log section is synced. Cassandra's default, periodic
# (a sync every 10 s), was not enough even for a process's crash: with it, the cluster's fault test found
# a counter one short after a SIGKILL and a restart (twice in two runs; with batch, never in four). Likely
# cause: a restarted node replays its commit log only up to its last sync marker, and the increments of
# the counter shard the killed node led live on it alone. Unsafe: periodic, and skip_sync makes even that
# a no-op.
COMMITLOG_SYNC = {
    "durable": "commitlog_sync: batch\n",
    "unsafe": "commitlog_sync: periodic\ncommitlog_sync_period: 10000ms\n",
}


def write_node_config(
    conf: Path,
    *,
    address: str,
    token: int,
    seeds: str,
    cluster_name: str,
    counter_write_timeout: str = "15000ms",
    unsafe: bool,
    extra: str = "",
) -> None:
    """A node's cassandra.yaml and logback.xml in `conf`."""
    conf.mkdir(parents=True, exist_ok=True)
    yaml = CASSANDRA_YAML.format(
        cluster_name=cluster_name,
        token=token,
        seeds=seeds,
        address=address,
        counter_write_timeout=counter_write_timeout,
        commitlog_sync=COMMITLOG_SYNC["unsafe" if unsafe else "durable"],
    )
    (conf / "cassandra.yaml").write_text(yaml + extra)
    (conf / "logback.xml").write_text(LOGBACK_XML)


def launch_node(
    lib: Path,
    node_dir: Path,
    *,
    native: int,
    storage: int,
    heap: str,
    unsafe: bool,
    place: Place = LOOPBACK,
) -> Proc:
    """Start one CassandraDaemon at `place` whose configuration is in node_dir/conf (write_node_config),
    its data in node_dir/data and its logs in node_dir/logs."""
    conf = node_dir / "conf"
    logs = node_dir / "logs"
    fresh_log(logs / "system.log")
    java = [
        require_program("java", "install a Java 17 runtime"),
        # -Xms stays small, so an idle node's RSS does not grow with the ceiling.
        "-Xms256m",
        f"-Xmx{heap}",
        "-Xss256k",
        # C1 only: on 2 cores the C2 compiler took over half the CPU and requests timed out.
        "-XX:TieredStopAtLevel=1",
        "-XX:+UseG1GC",
        "-XX:+ExitOnOutOfMemoryError",
        "-Djava.net.preferIPv4Stack=true",
        *JPMS_OPTIONS,
        *FAST_OPTIONS,
        *(UNSAFE_OPTIONS if unsafe else []),
        f"-Dcassandra.config={(conf / 'cassandra.yaml').as_uri()}",
        f"-Dlogback.configurationFile={conf / 'logback.xml'}",
        f"-Dcassandra.storagedir={node_dir / 'data'}",
        f"-Dcassandra.logdir={logs}",
        # Without it the daemon closes its stdout and stderr, and a fatal start-up error is lost.
        "-Dcassandra-foreground=yes",
        f"-Dcassandra.native_transport_port={native}",
        f"-Dcassandra.storage_port={storage}",
        "-cp",
        f"{lib}/*",
        "org.apache.cassandra.service.CassandraDaemon",
    ]
    if os.geteuid() == 0:
        # As root, JNA's mlockall succeeds and pins the whole JVM in memory (RSS 876 MiB instead of
        # ~390 at a 512m heap); without CAP_IPC_LOCK Cassandra only warns.
        java = ["setpriv", "--bounding-set", "-ipc_lock", *java]
    return spawn(place.command(java), env=dict(os.environ), log=fresh_log(logs / "stdout.log"), cwd=node_dir)


def listening_line(address: str, port: int) -> str:
    """The line a node logs once it serves CQL (its own: a port check may be answered by another node)."""
    return f"Starting listening for CQL clients on /{address}:{port}"


def serves_cql(log: Path, address: str, port: int) -> bool:
    """The node of `log` says it listens for CQL on `address`:`port`, and the port answers: the line comes
    just before the socket is bound, and under load a connect right after it was refused."""
    return log_contains(log, listening_line(address, port)) and port_answers(port, address)


@dataclass(frozen=True)
class CassandraServer:
    """How to reach the node: `Cluster([host], port=port)`, local datacenter `datacenter`; `durable` is
    False for a node in the suite's unsafe mode (and for one recorded before the harness knew modes,
    which all were)."""

    host: str
    port: int
    datacenter: str
    durable: bool = False
    tls: ClientTls | None = None  # the CA and client certificate of a node that speaks TLS only

    def __post_init__(self) -> None:
        if isinstance(self.tls, dict):  # as read back from the state file
            object.__setattr__(self, "tls", ClientTls(**self.tls))

    @property
    def contact_points(self) -> str:
        """The hosts part of a mailq URL."""
        return f"{self.host}:{self.port}"

    def cluster(self, **options: Any) -> Cluster:
        """A cassandra-driver `Cluster` for this node (not yet connected); options go to `Cluster`. Its
        default profile routes to the node's datacenter and waits 60 s, as a busy 2-core machine needs."""
        from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
        from cassandra.policies import DCAwareRoundRobinPolicy

        profile = ExecutionProfile(
            load_balancing_policy=DCAwareRoundRobinPolicy(local_dc=self.datacenter), request_timeout=60
        )
        options.setdefault("execution_profiles", {EXEC_PROFILE_DEFAULT: profile})
        if self.tls is not None:
            options.setdefault("ssl_context", self.tls.context())
        return Cluster([self.host], port=self.port, **options)

    def env(self) -> dict[str, str]:
        prefix = "MAILQ_CASSANDRA_TLS" if self.tls else "MAILQ_CASSANDRA"
        return {
            f"{prefix}_HOST": self.host,
            f"{prefix}_PORT": str(self.port),
            f"{prefix}_DATACENTER": self.datacenter,
            **(self.tls.env() if self.tls else {}),
        }


class Cassandra(Server):
    name = "cassandra"
    port_settings = {
        "native": ("MAILQ_CASSANDRA_PORT", 19042),
        "storage": ("MAILQ_CASSANDRA_STORAGE_PORT", 17000),
    }
    cluster_name = "mailq-test"
    # A whole suite's keyspaces, schema changes and SAI indexes outgrew a 768m heap (the JVM exits on
    # OutOfMemoryError).
    heap_setting = ("MAILQ_CASSANDRA_HEAP", "2g")

    def __init__(self, cache: Path | None = None) -> None:
        super().__init__(cache)
        self.lib = self.home / VERSION / "lib"
        self.system_log = self.run_dir / "logs" / "system.log"
        self.stdout_log = self.run_dir / "logs" / "stdout.log"

    def installed(self) -> bool:
        return (self.lib / ".complete").exists()

    def install(self) -> None:
        mvn = require_program("mvn", "install Maven (Debian: apt-get install maven)")
        require_program("java", "install a Java 17 runtime (Debian: apt-get install openjdk-17-jre-headless)")
        say(f"cassandra: downloading the {VERSION} jars from Maven Central into {self.lib} (about a minute)")
        build = self.home / "build"
        shutil.rmtree(build, ignore_errors=True)
        build.mkdir(parents=True)
        (build / "pom.xml").write_text(POM)
        staging = build / "lib"
        run_logged(
            [
                mvn,
                "-B",
                "-Dstyle.color=never",
                f"-Dmaven.repo.local={self.home / 'm2'}",
                "-f",
                str(build / "pom.xml"),
                f"{DEPENDENCY_PLUGIN}:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={staging}",
            ],
            log=self.home / "install.log",
            what=f"downloading Cassandra {VERSION} with Maven",
        )
        if not any(staging.glob(f"cassandra-all-{VERSION}.jar")):
            raise ServerError(f"Maven finished but cassandra-all-{VERSION}.jar is not in {staging}")
        (staging / ".complete").touch()
        shutil.rmtree(self.lib, ignore_errors=True)
        self.lib.parent.mkdir(parents=True, exist_ok=True)
        staging.replace(self.lib)
        shutil.rmtree(build)

    def launch(self) -> dict[str, Proc]:
        unsafe = unsafe_mode()
        write_node_config(
            self.run_dir / "conf",
            address=HOST,
            token=0,
            seeds=HOST,
            cluster_name=self.cluster_name,
            unsafe=unsafe,
            extra=self.extra_yaml(),
        )
        ports = self.ports()
        heap = os.environ.get(*self.heap_setting)
        proc = launch_node(
            self.lib,
            self.run_dir,
            native=ports["native"],
            storage=ports["storage"],
            heap=heap,
            unsafe=unsafe,
        )
        return {"server": proc}

    def wait_ready(self, procs: dict[str, Proc]) -> None:
        server = procs["server"]
        port = self.ports()["native"]
        wait_for(
            "cassandra",
            lambda: serves_cql(self.system_log, HOST, port),
            alive=server.alive,
            logs=[self.system_log, self.stdout_log],
        )
        cql_round_trip(CassandraServer(**self.facts()))

    def extra_yaml(self) -> str:
        """What this node's cassandra.yaml adds to the common one."""
        return ""

    def facts(self) -> dict:
        return asdict(CassandraServer(HOST, self.ports()["native"], DATACENTER, durable=not unsafe_mode()))

    def ensure(self) -> tuple[Running, str]:
        """As Server.ensure; and a node running in the unsafe mode when a durable one is asked for is
        restarted durable (SIGTERM: it flushes, so its data stays). The other way round, a durable node is
        reused: it is only slower at schema changes, and restarting would cut off the sessions on it."""
        running, did = super().ensure()
        if running.facts.get("durable", False) or unsafe_mode():
            return running, did
        say("cassandra: the running node skips syncs (the suite's unsafe mode): restarting it durable")
        self.stop()
        running, did = super().ensure()
        return running, f"restarted durable, {did}"

    def shut_down(self, procs: dict[str, Proc]) -> None:
        # SIGTERM only: in the unsafe mode, a SIGKILL loses the schema. It stops in 2-3 s.
        procs["server"].terminate("cassandra", timeout=120)


def cql_round_trip(server: CassandraServer) -> None:
    from cassandra import DriverException
    from cassandra.cluster import NoHostAvailable
    from cassandra.protocol import ErrorMessage

    # A node that just opened its port, TLS handshakes and all, may take more than the driver's 2 s to
    # give the control connection its schema.
    cluster = server.cluster(connect_timeout=30, control_connection_timeout=30)
    try:
        session = cluster.connect()
        session.execute("SELECT release_version FROM system.local", timeout=30).one()
    except (NoHostAvailable, DriverException, ErrorMessage) as error:
        raise ServerError(
            f"cassandra logged that it listens for CQL but a CQL connect failed: {error}"
        ) from None
    finally:
        cluster.shutdown()
