"""The project's harness for the real servers of the distributed deployment: Cassandra, an S3 endpoint
(versitygw), RabbitMQ and a Spark standalone cluster, and the Prometheus server of the metrics tests,
installed into a cache outside the repository (`MAILQ_SERVERS_CACHE`, default ~/.cache/mailq-servers)
or from Debian, and started on loopback.

`python -m mailq_servers up|down|status|env [server ...]` drives them from a shell (`make servers`, the
distributed demo); `ensure()` drives them from Python through the same code, for the test suite's
fixtures (tests/servers/fixtures.py) and the benchmarks. A running instance
is reused, so starting is paid once per machine, not once per test session."""

from __future__ import annotations

from .base import ServerError, cache_root
from .cassandra import Cassandra, CassandraServer
from .cassandra_cluster import CassandraCluster, CassandraClusterServer
from .host_bed import HostBed, HostBedServers
from .prometheus import Prometheus, PrometheusServer
from .rabbitmq import RabbitMQ, RabbitMQServer
from .rabbitmq_cluster import RabbitMQCluster, RabbitMQClusterServer
from .s3 import S3Endpoint, S3Server
from .spark import SparkCluster, SparkStandalone
from .tls_servers import CassandraClusterTLS, CassandraTLS, RabbitMQClusterTLS, RabbitMQTLS, S3EndpointTLS

#: In the order `up` starts them (and `down` stops them in reverse).
SERVERS = {
    "cassandra": Cassandra,
    "s3": S3Endpoint,
    "rabbitmq": RabbitMQ,
    "spark": SparkStandalone,
    "cassandra-cluster": CassandraCluster,
    "rabbitmq-cluster": RabbitMQCluster,
    "prometheus": Prometheus,
    "cassandra-tls": CassandraTLS,
    "s3-tls": S3EndpointTLS,
    "rabbitmq-tls": RabbitMQTLS,
    "cassandra-cluster-tls": CassandraClusterTLS,
    "rabbitmq-cluster-tls": RabbitMQClusterTLS,
    "hosts": HostBed,
}
FACTS = {
    "cassandra": CassandraServer,
    "s3": S3Server,
    "rabbitmq": RabbitMQServer,
    "spark": SparkCluster,
    "cassandra-cluster": CassandraClusterServer,
    "rabbitmq-cluster": RabbitMQClusterServer,
    "prometheus": PrometheusServer,
    "cassandra-tls": CassandraServer,
    "s3-tls": S3Server,
    "rabbitmq-tls": RabbitMQServer,
    "cassandra-cluster-tls": CassandraClusterServer,
    "rabbitmq-cluster-tls": RabbitMQClusterServer,
    "hosts": HostBedServers,
}
#: Started only when named (`up cassandra-cluster`) or by the fixtures of the tests that need them: the
#: rest of the suite does not run beside their nodes.
#: The servers that speak TLS only (tls_servers.py), by the plaintext server they stand beside: `--tls`.
TLS_VARIANTS = {
    "cassandra": "cassandra-tls",
    "s3": "s3-tls",
    "rabbitmq": "rabbitmq-tls",
    "cassandra-cluster": "cassandra-cluster-tls",
    "rabbitmq-cluster": "rabbitmq-cluster-tls",
}
ON_DEMAND = {"cassandra-cluster", "rabbitmq-cluster", "prometheus", "hosts", *TLS_VARIANTS.values()}

__all__ = [
    "ON_DEMAND",
    "SERVERS",
    "TLS_VARIANTS",
    "CassandraClusterServer",
    "CassandraServer",
    "HostBedServers",
    "PrometheusServer",
    "RabbitMQClusterServer",
    "RabbitMQServer",
    "S3Server",
    "SparkCluster",
    "ServerError",
    "cache_root",
    "ensure",
    "running",
    "stop",
]


def ensure(name: str):
    """The facts of the running server `name`, which is installed and started first when needed."""
    running, _ = SERVERS[name]().ensure()
    return FACTS[name](**running.facts)


def running(name: str):
    """The facts of the server `name` if this harness runs it, else None."""
    found = SERVERS[name]().running()
    return None if found is None else FACTS[name](**found.facts)


def stop(name: str) -> bool:
    """Stop the server `name` gracefully; False when it was not running."""
    return SERVERS[name]().stop()
