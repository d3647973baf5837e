"""The harness's servers that speak TLS only, beside the plaintext ones the suite shares: `cassandra-tls` (a
single node whose clients must present a certificate), `s3-tls` (versitygw over https) and `rabbitmq-tls`
(amqps). Each runs on ports of its own and presents a certificate of the harness's CA naming its address;
`python -m mailq_servers up --tls` starts them, and the TLS tests' fixtures do. The host bed (host_bed.py)
runs the clusters and the endpoint of this module on its hosts, each certificate naming its host's address
and name.

The CA lives in the cache's `tls/` (ca.pem, and client.pem with its key, the certificate every harness
client presents); a server's own certificate is issued again at each start into its run directory, so a
host of a test bed gets one naming its own address by the same code."""

from __future__ import annotations

import ssl
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from .base import HOST, Place, Proc, port_setting, unsafe_mode
from .cassandra import DATACENTER, Cassandra, CassandraServer
from .cassandra_cluster import CassandraCluster
from .certificates import Certificate, ClientTls, HarnessCA
from .rabbitmq import RabbitMQ, RabbitMQServer
from .rabbitmq_cluster import NODES, RabbitMQCluster
from .s3 import S3Endpoint

CLIENT = "client"
#: The name a harness client's certificate gives: servers that ask for one check only that the CA signed it.
CLIENT_NAME = "mailq-client"

# Cassandra 5's PEM key material: the key and certificate in one file, the CA as the trust store. With
# `optional: false` the native port speaks TLS only; `require_client_auth` asks each client's certificate.
CLIENT_ENCRYPTION_YAML = """client_encryption_options:
  enabled: true
  optional: false
  require_client_auth: true
  ssl_context_factory:
    class_name: org.apache.cassandra.security.PEMBasedSslContextFactory
  keystore: {keystore}
  truststore: {ca}
"""


# Node-to-node: every internode connection over TLS on the storage port, each node presenting its own
# certificate and checking its peer's against the CA, both ways. Not that it names the peer's address:
# Cassandra 5.0.9's accepting side refuses every peer when asked to ("Endpoint Identification Algorithm
# HTTPS is not supported on the server side").
SERVER_ENCRYPTION_YAML = """server_encryption_options:
  internode_encryption: all
  optional: false
  require_client_auth: true
  require_endpoint_verification: false
  ssl_context_factory:
    class_name: org.apache.cassandra.security.PEMBasedSslContextFactory
  keystore: {keystore}
  truststore: {ca}
"""


def harness_ca(cache: Path) -> HarnessCA:
    return HarnessCA(cache / "tls")


def client_tls(cache: Path) -> ClientTls:
    """The harness CA's file and the client certificate every harness client presents (made once)."""
    ca = harness_ca(cache)
    client = ca.kept(CLIENT, [CLIENT_NAME])
    return ClientTls(str(ca.cert), str(client.cert), str(client.key))


def node_certificate(cache: Path, run_dir: Path, hosts: list[str]) -> tuple[HarnessCA, Certificate]:
    """A server's certificate for `hosts`, issued afresh into `run_dir/tls`."""
    ca = harness_ca(cache)
    return ca, ca.issue("node", hosts, directory=run_dir / "tls")


def names_of(place: Place) -> list[str]:
    """What a certificate of a server at `place` names: its address, which the harness's clients dial,
    and its host's name, which the Erlang distribution checks."""
    return [place.address, place.host_name]


class CassandraTLS(Cassandra):
    name = "cassandra-tls"
    port_settings = {
        "native": ("MAILQ_CASSANDRA_TLS_PORT", 19142),
        "storage": ("MAILQ_CASSANDRA_TLS_STORAGE_PORT", 17100),
    }
    cluster_name = "mailq-tls"
    # Only the TLS tests' keyspaces live on it.
    heap_setting = ("MAILQ_CASSANDRA_TLS_HEAP", "1g")

    def __init__(self, cache: Path | None = None) -> None:
        super().__init__(cache)
        # The jars are the shared node's: one download serves both.
        self.single = Cassandra(self.cache)
        self.lib = self.single.lib

    def install(self) -> None:
        with self.single.lock():
            if not self.single.installed():
                self.single.install()

    def extra_yaml(self) -> str:
        ca, node = node_certificate(self.cache, self.run_dir, [HOST])
        return CLIENT_ENCRYPTION_YAML.format(keystore=node.keystore, ca=ca.cert)

    def facts(self) -> dict:
        return asdict(
            CassandraServer(
                HOST,
                self.ports()["native"],
                DATACENTER,
                durable=not unsafe_mode(),
                tls=client_tls(self.cache),
            )
        )


class CassandraClusterTLS(CassandraCluster):
    """The three-node cluster with TLS on every link: client-to-node as cassandra-tls, node-to-node with
    each node's certificate naming its address. Its own ports, so it runs beside the plaintext cluster."""

    name = "cassandra-cluster-tls"
    port_settings = {
        "native": ("MAILQ_CASSANDRA_CLUSTER_TLS_PORT", 39042),
        "storage": ("MAILQ_CASSANDRA_CLUSTER_TLS_STORAGE_PORT", 37000),
    }
    cluster_name = "mailq-cluster-tls"

    def extra_yaml(self, node: int) -> str:
        ca, certificate = node_certificate(self.cache, self.node_dir(node), names_of(self.places[node - 1]))
        files = {"keystore": certificate.keystore, "ca": ca.cert}
        return CLIENT_ENCRYPTION_YAML.format(**files) + SERVER_ENCRYPTION_YAML.format(**files)

    def client_tls(self) -> ClientTls:
        return client_tls(self.cache)


# Erlang's options for the TLS distribution: both ways each node presents its certificate and checks the
# peer's against the CA, and the client side its name (localhost, the host of every node's name).
DISTRIBUTION_OPTIONS = """[{{server, [{{cacertfile, "{ca}"}}, {{certfile, "{cert}"}}, {{keyfile, "{key}"}},
           {{secure_renegotiate, true}}, {{verify, verify_peer}}, {{fail_if_no_peer_cert, true}}]}},
 {{client, [{{cacertfile, "{ca}"}}, {{certfile, "{cert}"}}, {{keyfile, "{key}"}},
           {{secure_renegotiate, true}}, {{verify, verify_peer}}]}}].
"""


class RabbitMQClusterTLS(RabbitMQCluster):
    """The three-node RabbitMQ cluster with its inter-node links (the Erlang distribution, rabbitmqctl's
    included) over TLS only. Its clients' AMQP stays plain (amqps is rabbitmq-tls's) unless `amqps`: the
    host bed's nodes listen for amqps only. Ports and an epmd of its own, so it runs beside the plaintext
    cluster."""

    name = "rabbitmq-cluster-tls"
    port_settings = {
        **{f"amqp{n}": (f"MAILQ_RABBITMQ_CLUSTER_TLS_PORT{n}", 16590 + n) for n in range(1, NODES + 1)},
        **{
            f"distribution{n}": (f"MAILQ_RABBITMQ_CLUSTER_TLS_DIST_PORT{n}", 26590 + n)
            for n in range(1, NODES + 1)
        },
    }
    epmd_setting = ("MAILQ_RABBITMQ_CLUSTER_TLS_EPMD_PORT", 14389)

    def __init__(self, cache: Path | None = None, *, amqps: bool = False, **options: Any) -> None:
        super().__init__(cache, **options)
        self.amqps = amqps

    @property
    def node_type(self) -> type[RabbitMQ]:
        return RabbitMQTLS if self.amqps else RabbitMQ

    def client_tls(self) -> ClientTls | None:
        return client_tls(self.cache) if self.amqps else None

    def distribution_tls(self, index: int) -> Path:
        return self.node_dirs[index - 1] / "tls" / "distribution.config"

    def launch(self) -> dict[str, Proc]:
        for index, place in enumerate(self.places, 1):
            ca, node = node_certificate(self.cache, self.node_dirs[index - 1], names_of(place))
            options = DISTRIBUTION_OPTIONS.format(ca=ca.cert, cert=node.cert, key=node.key)
            self.distribution_tls(index).write_text(options)
        return super().launch()


class S3EndpointTLS(S3Endpoint):
    name = "s3-tls"
    port_settings = {"http": ("MAILQ_S3_TLS_PORT", 17170)}
    scheme = "https"

    def __init__(self, cache: Path | None = None, **options: Any) -> None:
        super().__init__(cache, **options)
        # The binary is the shared endpoint's: one build serves both.
        self.plain = S3Endpoint(self.cache)
        self.binary = self.plain.binary
        # The same root keys as the plaintext endpoint: a shell's AWS_* variables serve both.
        self.credentials = self.plain.credentials

    def install(self) -> None:
        with self.plain.lock():
            if not self.plain.installed():
                self.plain.install()

    def tls_arguments(self) -> list[str]:
        _, node = node_certificate(self.cache, self.run_dir, names_of(self.place))
        return ["--cert", str(node.cert), "--key", str(node.key)]

    def url_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(harness_ca(self.cache).cert))

    def facts(self) -> dict:
        return {**super().facts(), "ca": str(harness_ca(self.cache).cert)}


class RabbitMQTLS(RabbitMQ):
    name = "rabbitmq-tls"
    port_settings = {
        "amqp": ("MAILQ_RABBITMQ_TLS_PORT", 16672),
        "distribution": ("MAILQ_RABBITMQ_TLS_DIST_PORT", 26672),
    }

    def __init__(self, cache: Path | None = None, **options: Any) -> None:
        """The single amqps node by default; a node of a cluster that speaks amqps with `options`."""
        options.setdefault("node", "mailq-tls@localhost")
        options.setdefault("epmd_port", port_setting("MAILQ_RABBITMQ_TLS_EPMD_PORT", 14469))
        super().__init__(cache, **options)

    def install(self) -> None:
        plain = RabbitMQ(self.cache)
        with plain.lock():
            if not plain.installed():
                plain.install()

    def listener_conf(self, port: int) -> str:
        # The PEM files as Erlang's ssl reads them; a client certificate is verified when one is given.
        ca, node = node_certificate(self.cache, self.run_dir, names_of(self.place))
        return (
            "listeners.tcp = none\n"
            f"listeners.ssl.default = {self.place.address}:{port}\n"
            f"ssl_options.cacertfile = {ca.cert}\n"
            f"ssl_options.certfile = {node.cert}\n"
            f"ssl_options.keyfile = {node.key}\n"
            "ssl_options.verify = verify_peer\n"
            "ssl_options.fail_if_no_peer_cert = false\n"
        )

    def listener_env(self, port: int) -> dict[str, str]:
        return {}

    def facts(self) -> dict:
        plain = RabbitMQServer(**super().facts())
        return asdict(replace(plain, tls=client_tls(self.cache)))
