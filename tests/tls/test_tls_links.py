"""Every link of the distributed deployment over TLS, against the harness's TLS servers (cassandra-tls,
s3-tls, rabbitmq-tls): mails in and out with every link encrypted, and each way a handshake fails (a CA
that did not sign the server's certificate, a certificate that does not name the host, a certificate past
its date, a client certificate refused, a host that does not answer) is one `mailq: error:` line naming
the server and the reason, exit status 2, nothing made on any server, and the same command succeeds once
the cause is gone.

A link's failure is seen through the CLI where the open reaches that link first or alone (the open checks
RabbitMQ's certificates, then looks at the bucket, then opens the keyspace); Cassandra's wrong CA, which
the S3 link would meet first with the same `ca=`, through the runtime's open of the keyspace."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from mailq_runtime.blobs.s3_store import S3BlobStore
from mailq_runtime.deployments import open_cassandra
from mailq_runtime.errors import StoreUnavailable
from mailq_runtime.model import BlobId
from mailq_runtime.settings import Settings
from mailq_runtime.tls import TlsFiles
from mailq_servers.base import Proc, port_answers, spawn, wait_for
from mailq_servers.cassandra import CassandraServer
from mailq_servers.certificates import HarnessCA
from mailq_servers.rabbitmq import RabbitMQServer, Vhosts
from mailq_servers.s3 import REGION, S3Endpoint, S3Server, remove_bucket
from mailq_servers.tls_servers import harness_ca
from tests.cli.test_store_errors import MESSAGE, RECIPIENT, SENDER, assert_one_line, mailq
from tests.forwarder import Forwarder
from tests.runtime.backends import CassandraS3
from tests.servers.fixtures import fresh_bucket_name, fresh_keyspace_name

ELSEWHERE = "127.0.0.2"  # a loopback address no harness certificate names


@dataclass
class Deployment:
    """A keyspace, a bucket and a vhost no one made yet, on the TLS servers (and on the plaintext ones,
    for the URLs that keep some links in the clear), and a copy of the harness's TLS files."""

    tls: CassandraS3
    plain: CassandraS3
    rabbitmq: RabbitMQServer
    plain_rabbitmq: RabbitMQServer
    keyspace: str
    bucket: str
    vhost: str
    plain_vhost: str
    tmp: Path

    @property
    def cassandra(self) -> CassandraServer:
        return self.tls.cassandra_server

    @property
    def s3(self) -> S3Server:
        return self.tls.s3_server

    @property
    def tls_files(self) -> dict[str, str]:
        return {name: str(self.tmp / file) for name, file in FILES.items()}

    def url(
        self,
        *,
        cassandra: str | None = None,
        s3: str | None = None,
        broker: str | None = None,
        tls: bool = True,
    ) -> str:
        """The URL of every link over TLS, unless told: a link given as "plain" is the shared plaintext
        server's, one given as host:port is the TLS server reached there."""
        hosts = {"plain": self.plain.cassandra_server.contact_points, None: self.cassandra.contact_points}
        endpoints = {"plain": self.plain.s3_server.endpoint_url, None: self.s3.endpoint_url}
        brokers = {
            "plain": f"amqp://{self.plain_rabbitmq.host}:{self.plain_rabbitmq.port}/{self.plain_vhost}",
            "embedded": f"embedded:{self.tmp / 'broker'}",
            None: f"amqps://{self.rabbitmq.host}:{self.rabbitmq.port}/{self.vhost}",
        }
        options = [
            f"s3={self.bucket}",
            f"s3_endpoint={endpoints.get(s3, f'https://{s3}')}",
            f"s3_region={REGION}",
            f"broker={brokers.get(broker, f'amqps://{broker}/{self.vhost}')}",
            *(["tls=on"] if tls else []),
            *(f"{name}={path}" for name, path in self.tls_files.items()),
        ]
        return f"cassandra://{hosts.get(cassandra, cassandra)}/{self.keyspace}?" + "&".join(options)

    def made(self) -> list[str]:
        """What an open made: the keyspace or the bucket (on either server), the embedded broker's store."""
        made = []
        for servers in (self.tls, self.plain):
            found = servers.session.execute(
                "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = %s", (self.keyspace,)
            )
            if found.one() is not None:
                made.append(f"keyspace {self.keyspace} on port {servers.cassandra_server.port}")
            try:
                servers.s3.head_bucket(Bucket=self.bucket)
                made.append(f"bucket {self.bucket} at {servers.s3_server.endpoint_url}")
            except ClientError:
                pass
        if (self.tmp / "broker").exists():
            made.append("the embedded broker's store")
        return made

    def enqueue(self, url: str) -> tuple[int, str, str]:
        eml = self.tmp / "mail.eml"
        eml.write_bytes(MESSAGE)
        return mailq("--url", url, "enqueue", "spool", str(eml), "--sender", SENDER, "--rcpt", RECIPIENT)


FILES = {"ca": "ca.pem", "cert": "client.pem", "key": "client-key.pem"}


@pytest.fixture
def deployment(
    cassandra_s3_tls: CassandraS3,
    cassandra_s3: CassandraS3,
    rabbitmq_tls_server: RabbitMQServer,
    rabbitmq_server: RabbitMQServer,
    rabbitmq_tls_vhosts: Vhosts,
    rabbitmq_vhosts: Vhosts,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Deployment]:
    for variable, value in cassandra_s3.s3_server.env().items():
        monkeypatch.setenv(variable, value)
    # The harness's CA and client certificate, copied: a test replaces them to make a handshake fail.
    tls = cassandra_s3_tls.cassandra_server.tls
    for name, file in FILES.items():
        shutil.copyfile(getattr(tls, name), tmp_path / file)
    made = Deployment(
        cassandra_s3_tls,
        cassandra_s3,
        rabbitmq_tls_server,
        rabbitmq_server,
        fresh_keyspace_name(),
        fresh_bucket_name(),
        rabbitmq_tls_vhosts.take(),
        rabbitmq_vhosts.take(),
        tmp_path,
    )
    yield made
    for servers in (cassandra_s3_tls, cassandra_s3):
        servers.session.execute(f"DROP KEYSPACE IF EXISTS {made.keyspace}", timeout=120)
        remove_bucket(servers.s3, made.bucket)


def other_ca(tmp_path: Path) -> HarnessCA:
    """A CA that signed none of the servers' certificates."""
    return HarnessCA(tmp_path / "other-ca")


def test_mails_in_and_out_with_every_link_over_tls(deployment: Deployment):
    url = deployment.url()
    status, out, err = mailq("--url", url, "schema", "create")
    assert status == 0, err
    status, out, err = deployment.enqueue(url)
    assert status == 0, err
    assert mailq("--url", url, "size", "spool")[1] == "spool: 1 mails\n"
    status, out, err = mailq("--url", url, "--json", "worker", "--domain", "example.org", "--idle-exit", "3s")
    assert status == 0 and json.loads(out)["delivered"] == 1, (out, err)
    assert mailq("--url", url, "size", "spool")[1] == "spool: 0 mails\n"


def test_tls_on_refuses_a_link_in_the_clear(deployment: Deployment):
    for url, words in (
        (deployment.url(s3="plain"), ("tls=on encrypts every link", "http://")),
        (deployment.url(broker="plain"), ("tls=on encrypts every link", "amqps://")),
    ):
        assert_one_line(mailq("--url", url, "size", "spool"), *words)


# A link that meets the wrong CA alone: the others in the clear (or the embedded broker).
WRONG_CA_LINKS = {
    "rabbitmq": (
        {"cassandra": "plain", "s3": "plain", "tls": False},
        ("RabbitMQ at 127.0.0.1:", "(amqps)", "not signed by the CA given"),
    ),
    "s3": (
        {"cassandra": "plain", "broker": "embedded", "tls": False},
        ("S3 bucket", "at https://127.0.0.1:", "not signed by the CA given"),
    ),
}


@pytest.mark.parametrize("link", list(WRONG_CA_LINKS))
def test_a_ca_that_did_not_sign_the_server_is_one_line_and_nothing_made(deployment: Deployment, link):
    changes, words = WRONG_CA_LINKS[link]
    url = deployment.url(**changes)
    ca_file = Path(deployment.tls_files["ca"])
    right = ca_file.read_bytes()
    ca_file.write_bytes(other_ca(deployment.tmp).cert.read_bytes())
    assert_one_line(deployment.enqueue(url), *words)
    assert deployment.made() == []
    ca_file.write_bytes(right)
    status, _, err = deployment.enqueue(url)
    assert status == 0, err


def test_cassandra_behind_a_ca_that_did_not_sign_it_is_named_at_open(deployment: Deployment):
    settings = Settings.from_url(deployment.url(broker="embedded"))
    ca_file = Path(deployment.tls_files["ca"])
    right = ca_file.read_bytes()
    ca_file.write_bytes(other_ca(deployment.tmp).cert.read_bytes())
    with pytest.raises(StoreUnavailable) as failure:
        open_cassandra(settings, create=True)
    message = str(failure.value)
    assert message.startswith(f"cannot connect to Cassandra at 127.0.0.1 port {deployment.cassandra.port}: ")
    assert "not signed by the CA given" in message and "\n" not in message
    assert deployment.made() == []
    ca_file.write_bytes(right)
    open_cassandra(settings, create=True).close()


@pytest.fixture
def elsewhere():
    """Forwarders listening on 127.0.0.2, which the servers' certificates do not name."""
    forwarders: list[Forwarder] = []

    def forward(host: str, port: int) -> str:
        forwarder = Forwarder(host, port, listen=ELSEWHERE)
        forwarders.append(forwarder)
        return f"{ELSEWHERE}:{forwarder.port}"

    yield forward
    for forwarder in forwarders:
        forwarder.close()


@pytest.mark.parametrize("link", ["cassandra", "s3", "rabbitmq"])
def test_a_certificate_that_does_not_name_the_host_is_one_line_and_nothing_made(
    deployment: Deployment, elsewhere, link
):
    server = {
        "cassandra": (deployment.cassandra.host, deployment.cassandra.port),
        "s3": ("127.0.0.1", int(deployment.s3.endpoint_url.rsplit(":", 1)[1])),
        "rabbitmq": (deployment.rabbitmq.host, deployment.rabbitmq.port),
    }[link]
    url = deployment.url(**{link if link != "rabbitmq" else "broker": elsewhere(*server)})
    where = {
        "cassandra": "Cassandra at 127.0.0.2 port",
        "s3": "at https://127.0.0.2:",
        "rabbitmq": "RabbitMQ at 127.0.0.2:",
    }
    assert_one_line(deployment.enqueue(url), where[link], "does not name the host connected to", ELSEWHERE)
    assert deployment.made() == []


def expired_client_certificate(deployment: Deployment) -> None:
    """The client certificate and key at the URL's paths replaced by ones that expired yesterday."""
    now = datetime.datetime.now(datetime.UTC)
    expired = harness_ca(Path(deployment.cassandra.tls.ca).parent.parent).issue(
        "expired-client",
        ["mailq-client"],
        directory=deployment.tmp / "expired",
        valid_from=now - datetime.timedelta(days=30),
        valid_until=now - datetime.timedelta(days=1),
    )
    shutil.copyfile(expired.cert, deployment.tls_files["cert"])
    shutil.copyfile(expired.key, deployment.tls_files["key"])


@pytest.mark.parametrize(
    ("link", "changes", "words"),
    [
        # In TLS 1.3 the server judges the client's certificate after the client's side of the handshake
        # is done: Cassandra's alert may reach the driver or be lost to its closed connection, and either
        # line names the client certificate.
        (
            "cassandra",
            {"broker": "embedded"},
            ("Cassandra at 127.0.0.1 port", "client certificate"),
        ),
        (
            "rabbitmq",
            {"cassandra": "plain", "s3": "plain", "tls": False},
            ("RabbitMQ at 127.0.0.1:", "expired"),
        ),
    ],
)
def test_an_expired_client_certificate_is_one_line_and_nothing_made(
    deployment: Deployment, link, changes, words
):
    url = deployment.url(**changes)
    right = {name: Path(deployment.tls_files[name]).read_bytes() for name in ("cert", "key")}
    expired_client_certificate(deployment)
    assert_one_line(deployment.enqueue(url), *words)
    assert deployment.made() == []
    for name, content in right.items():
        Path(deployment.tls_files[name]).write_bytes(content)
    status, _, err = deployment.enqueue(url)
    assert status == 0, err


class PrivateEndpoint:
    """A versitygw of this test's own over https, on a free port, with the certificate it is given."""

    def __init__(self, directory: Path, s3: S3Server) -> None:
        self.directory = directory
        self.s3 = s3
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.proc: Proc | None = None

    def start(self, cert: Path, key: Path) -> None:
        data = self.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        argv = [
            str(S3Endpoint().binary),
            "--port",
            f"127.0.0.1:{self.port}",
            "--region",
            REGION,
            "--cert",
            str(cert),
            "--key",
            str(key),
            "--quiet",
            "posix",
            str(data),
        ]
        env = {
            **os.environ,
            "ROOT_ACCESS_KEY": self.s3.access_key_id,
            "ROOT_SECRET_KEY": self.s3.secret_access_key,
        }
        log = self.directory / "versitygw.log"
        self.proc = spawn(argv, env=env, log=log, cwd=self.directory)
        wait_for(
            "private versitygw",
            lambda: port_answers(self.port),
            alive=self.proc.alive,
            logs=[log],
            timeout=60,
        )

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate("private versitygw", timeout=10)
            self.proc = None


def test_an_expired_server_certificate_is_one_line_and_nothing_made(deployment: Deployment):
    now = datetime.datetime.now(datetime.UTC)
    ca = harness_ca(Path(deployment.cassandra.tls.ca).parent.parent)
    expired = ca.issue(
        "expired-node",
        ["127.0.0.1"],
        directory=deployment.tmp / "expired",
        valid_from=now - datetime.timedelta(days=30),
        valid_until=now - datetime.timedelta(days=1),
    )
    endpoint = PrivateEndpoint(deployment.tmp / "endpoint", deployment.s3)
    try:
        endpoint.start(expired.cert, expired.key)
        url = deployment.url(cassandra="plain", s3=f"127.0.0.1:{endpoint.port}", broker="embedded", tls=False)
        assert_one_line(deployment.enqueue(url), f"at https://127.0.0.1:{endpoint.port}", "past its date")
        assert deployment.made() == []
        endpoint.stop()
        renewed = ca.issue("renewed-node", ["127.0.0.1"], directory=deployment.tmp / "renewed")
        endpoint.start(renewed.cert, renewed.key)
        status, _, err = deployment.enqueue(url)
        assert status == 0, err
    finally:
        endpoint.stop()


@pytest.mark.parametrize("link", ["cassandra", "s3"])
def test_a_host_that_does_not_answer_is_one_line_and_the_command_succeeds_once_it_does(
    deployment: Deployment, link
):
    if link == "cassandra":
        forwarder = Forwarder(deployment.cassandra.host, deployment.cassandra.port)
        url = deployment.url(cassandra=f"127.0.0.1:{forwarder.port}")
        words = (f"Cassandra at 127.0.0.1 port {forwarder.port}",)
    else:
        forwarder = Forwarder("127.0.0.1", int(deployment.s3.endpoint_url.rsplit(":", 1)[1]))
        url = deployment.url(s3=f"127.0.0.1:{forwarder.port}")
        words = (f"at https://127.0.0.1:{forwarder.port}",)
    with forwarder:
        with forwarder.cable_pulled():
            assert_one_line(deployment.enqueue(url), *words)
            assert deployment.made() == []
        status, _, err = deployment.enqueue(url)
        assert status == 0, err


def test_blobs_put_and_read_back_one_after_another_over_https(deployment: Deployment):
    """Every put, then a read on the same kept-alive connection: boto3's aws-chunked checksum trailer
    made versitygw fail 2% of the requests after a put with BadRequest; the checksum as a header of its
    own fails none."""
    deployment.s3.client().create_bucket(Bucket=deployment.bucket)
    store = S3BlobStore(
        deployment.bucket,
        endpoint_url=deployment.s3.endpoint_url,
        region=deployment.s3.region,
        tls=TlsFiles(ca=Path(deployment.s3.ca)),
    )
    try:
        for n in range(300):
            content = b"x" * n
            blob_id = BlobId(1, hashlib.sha256(content).hexdigest())
            store.put(blob_id, content)
            assert store.get(blob_id) == content
    finally:
        store.close()
