"""The harness's own guarantees: what it calls alive and ours, what it refuses, what `env` prints."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mailq_runtime.settings import Settings
from mailq_servers import cassandra_cluster, deployment
from mailq_servers.__main__ import selected
from mailq_servers.base import Proc, ServerError
from mailq_servers.cassandra import CassandraServer
from mailq_servers.cassandra_cluster import CassandraCluster
from mailq_servers.rabbitmq import RabbitMQ, RabbitMQServer
from mailq_servers.s3 import S3Endpoint, S3Server

REPO = Path(__file__).resolve().parents[2]


def test_a_zombie_is_not_alive():
    child = subprocess.Popen(["sleep", "0.2"])
    proc = Proc.of(child.pid)
    assert proc.alive()
    deadline = time.monotonic() + 10
    while " Z " not in Path(f"/proc/{child.pid}/stat").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    # Exited but not yet reaped: it still has a pid and answers kill -0.
    os.kill(child.pid, 0)
    assert not proc.alive()
    child.wait()


def test_cluster_nodes_hanging_in_their_shutdown_cost_one_wait_and_are_killed(monkeypatch):
    monkeypatch.setattr(cassandra_cluster, "STOP_WAIT", 2)
    # Three nodes that ignore SIGTERM, as Cassandra nodes hanging in their shutdown do.
    ignoring = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print(flush=True); time.sleep(60)"
    )
    children = [subprocess.Popen([sys.executable, "-c", ignoring], stdout=subprocess.PIPE) for _ in range(3)]
    for child in children:
        child.stdout.readline()  # SIGTERM is ignored from here on
    procs = {f"node{n}": Proc.of(child.pid) for n, child in enumerate(children, 1)}
    started = time.monotonic()
    CassandraCluster().shut_down(procs)
    took = time.monotonic() - started
    assert not any(proc.alive() for proc in procs.values())
    assert took < 2 * cassandra_cluster.STOP_WAIT, f"one wait for the three, not one a node: {took:.1f} s"
    for child in children:
        child.wait()


def test_a_port_held_by_another_process_is_refused_with_the_variable_to_change(tmp_path, monkeypatch):
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", 0))
        stranger.listen()
        port = stranger.getsockname()[1]
        monkeypatch.setenv("MAILQ_S3_PORT", str(port))
        with pytest.raises(ServerError, match=f"port {port} .*MAILQ_S3_PORT=PORT"):
            S3Endpoint(cache=tmp_path).ensure()
        assert Proc.of(os.getpid()).owns_listener(port)
    assert not (tmp_path / "s3" / "run" / "state.json").exists()


def test_a_running_server_is_reused_and_holds_its_port(s3_server: S3Server):
    started = time.monotonic()
    running, did = S3Endpoint().ensure()
    assert did == "reused"
    assert time.monotonic() - started < 2
    assert running.procs["server"].owns_listener(running.ports["http"])
    assert not Proc.of(os.getpid()).owns_listener(running.ports["http"])


def test_env_prints_lines_a_shell_can_source(s3_server: S3Server):
    shell = subprocess.run(
        [
            "/bin/sh",
            "-c",
            f'eval "$("{sys.executable}" -m mailq_servers env s3)" && echo "$AWS_ENDPOINT_URL_S3"',
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert shell.stdout.strip() == s3_server.endpoint_url


def test_a_deployment_is_made_then_removed_whole_with_its_directory(
    cassandra_server: CassandraServer, s3_server: S3Server, rabbitmq_server: RabbitMQServer, tmp_path: Path
):
    directory = tmp_path / "demo"
    url = deployment.fresh(directory, prefix=f"mailq-test-{secrets.token_hex(3)}")
    settings = Settings.from_url(url)
    assert (directory / deployment.URL_FILE).read_text().strip() == url
    assert settings.amqp.vhost in RabbitMQ().ctl("list_vhosts", "name").split()
    # What the runtime's creating open would make there.
    cluster = cassandra_server.cluster()
    session = cluster.connect()
    keyspace = settings.cassandra.keyspace
    replication = "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    session.execute(f"CREATE KEYSPACE {keyspace} WITH replication = {replication}")
    s3 = s3_server.client()
    s3.create_bucket(Bucket=settings.s3.bucket)
    s3.put_object(Bucket=settings.s3.bucket, Key="content", Body=b"x")

    subprocess.run(
        [sys.executable, "-m", "mailq_servers", "deployment", "--remove", str(directory)],
        cwd=REPO,
        check=True,
    )

    assert not directory.exists()
    found = session.execute(
        "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = %s", (keyspace,)
    )
    assert found.one() is None
    cluster.shutdown()
    assert settings.s3.bucket not in {bucket["Name"] for bucket in s3.list_buckets()["Buckets"]}
    assert settings.amqp.vhost not in RabbitMQ().ctl("list_vhosts", "name").split()


def test_up_alone_leaves_the_clusters_out_and_down_alone_stops_them():
    assert "cassandra-cluster" not in selected("up", []) and "rabbitmq-cluster" not in selected("up", [])
    assert "cassandra" in selected("up", [])
    assert selected("up", ["cassandra-cluster"]) == ["cassandra-cluster"]
    assert "cassandra-cluster" in selected("down", []) and "cassandra-cluster" in selected("status", [])
    assert "rabbitmq-cluster" in selected("down", []) and "rabbitmq-cluster" in selected("status", [])


def test_tls_selects_the_servers_that_speak_tls_only():
    assert selected("up", [], tls=True) == ["cassandra-tls", "s3-tls", "rabbitmq-tls"]
    assert selected("up", ["cassandra-cluster"], tls=True) == ["cassandra-cluster-tls"]
    assert selected("up", ["s3", "spark"], tls=True) == ["s3-tls", "spark"]
    assert not {"cassandra-tls", "s3-tls", "rabbitmq-tls"} & set(selected("up", []))
