"""Fixtures of the tests on the host bed: a deployment of each module's own on it, mailq commands run on
its hosts, and the runtime contract suite's `backend`, `runtime` and `queue` on the bed (HostBedBackend)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from mailq_runtime import Runtime
from mailq_runtime.queue import MailQueue
from mailq_servers import bed_deployment
from mailq_servers.host_bed import HostBed, running_facts
from mailq_servers.s3 import remove_bucket
from tests.runtime.backends import CassandraS3, HostBedBackend
from tests.servers.fixtures import fresh_bucket_name, fresh_keyspace_name, held_for_the_tests

QUEUE = "spool"


@pytest.fixture(scope="package")
def host_bed() -> Iterator[HostBed]:
    """The host bed (mailq_servers/host_bed.py), started for the tests of this package and taken down
    after the last of them, unless it was running before they began: one start for every module."""
    bed = HostBed()
    with held_for_the_tests(bed):
        yield bed


@pytest.fixture(scope="module")
def bed_url(host_bed: HostBed) -> Iterator[str]:
    """A keyspace, bucket and vhost of this module's own on the bed, removed after its tests."""
    url = bed_deployment.make(host_bed, f"mailq-bed-{int(time.time())}-{secrets.token_hex(3)}")
    yield url
    bed_deployment.remove(host_bed, url)


@pytest.fixture(scope="module")
def bed_env(host_bed: HostBed) -> dict[str, str]:
    """The environment of a mailq process on the bed: this one's, with the bed's password and S3 keys."""
    return {**os.environ, **running_facts().client_env(), "PYTHONUNBUFFERED": "1"}


@pytest.fixture
def bed_client(monkeypatch: pytest.MonkeyPatch, host_bed: HostBed) -> None:
    """This process a client of the bed (a runtime it opens reaches the bed's servers from the root
    namespace), with the bed's password and S3 keys in its environment."""
    for variable, value in running_facts().client_env().items():
        monkeypatch.setenv(variable, value)


def mailq_on(bed: HostBed, host: str, url: str, *argv: str) -> list[str]:
    """The argv of `mailq --url URL ARGV` run on `host` of the bed, with this interpreter."""
    return bed.host(host).command([sys.executable, "-m", "mailq_cli", "--url", url, *argv])


def run_on(bed: HostBed, host: str, url: str, env: dict[str, str], *argv: str) -> str:
    """Run `mailq ARGV` on `host` to its end; its stdout, or a failure with its stderr."""
    done = subprocess.run(
        mailq_on(bed, host, url, *argv), env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"mailq {' '.join(argv)} on {host}: {done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def bed_contract(host_bed: HostBed) -> Iterator[tuple[CassandraS3, str, str, str]]:
    """The contract suite's servers on the bed (probe session and S3 client), a keyspace and a bucket
    name, and a vhost of this module's own; all removed after its tests."""
    facts = running_facts()
    keyspace, bucket = fresh_keyspace_name(), fresh_bucket_name()
    vhost = bucket
    host_bed.rabbitmq.ctl("add_vhost", vhost)
    host_bed.rabbitmq.ctl("set_permissions", "-p", vhost, facts.rabbitmq_cluster.username, ".*", ".*", ".*")
    cluster, s3 = facts.cassandra_cluster.cluster(), facts.s3_server.client()
    try:
        yield (
            CassandraS3(facts.cassandra_cluster, facts.s3_server, cluster.connect(), s3),
            keyspace,
            bucket,
            vhost,
        )
        cluster.connect().execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)
        remove_bucket(s3, bucket)
        host_bed.rabbitmq.ctl("delete_vhost", vhost)
    finally:
        cluster.shutdown()
        s3.close()


@pytest.fixture
def backend(host_bed: HostBed, bed_contract, bed_client: None) -> Iterator[HostBedBackend]:
    """The contract suite's deployment on the bed; the agents it starts run on worker2."""
    servers, keyspace, bucket, vhost = bed_contract
    cluster = running_facts().rabbitmq_cluster
    opened = HostBedBackend(servers, keyspace, bucket, cluster, vhost, host_bed.host("worker2").command)
    opened.empty()
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def runtime(backend: HostBedBackend) -> Runtime:
    return backend.open()


@pytest.fixture
def queue(runtime: Runtime) -> MailQueue:
    return runtime.queue(QUEUE)
