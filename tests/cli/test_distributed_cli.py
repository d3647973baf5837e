"""The `mailq` command on the distributed deployment (Cassandra + S3, the harness's servers): a keyspace and
a bucket that do not exist are named and not created by a reading command; `schema create` makes both;
mails go in and out through the same commands as on the embedded deployment."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from mailq_servers.s3 import remove_bucket
from mailq_servers.urls import distributed_url
from tests.runtime.backends import CassandraBackend, CassandraS3
from tests.servers.fixtures import fresh_bucket_name, fresh_keyspace

from .test_store_errors import MESSAGE, RECIPIENT, SENDER, assert_one_line, mailq


@pytest.fixture
def deployment(
    cassandra_s3: CassandraS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[CassandraBackend]:
    """A distributed deployment on a keyspace and a bucket no one made, its broker in `tmp_path / broker`;
    the keyspace and the bucket removed at the end."""
    for variable, value in cassandra_s3.s3_server.env().items():
        monkeypatch.setenv(variable, value)
    with fresh_keyspace(cassandra_s3.cassandra_server) as keyspace:
        bucket = fresh_bucket_name()
        yield CassandraBackend(tmp_path / "broker", cassandra_s3, keyspace, bucket)
        remove_bucket(cassandra_s3.s3, bucket)


@pytest.fixture
def url(deployment: CassandraBackend) -> str:
    servers = deployment.servers
    broker = f"embedded:{deployment.broker_dir}"
    return distributed_url(
        servers.cassandra_server, servers.s3_server, deployment.keyspace, deployment.bucket, broker
    )


def test_a_reading_command_names_the_missing_keyspace_and_creates_nothing(url, deployment):
    assert_one_line(mailq("--url", url, "size", "spool"), "no keyspace", "create the schema first")
    assert not deployment.exists()  # neither the keyspace nor the broker's directory


def test_schema_create_then_mails_in_and_out(url, tmp_path, s3_server):
    eml = tmp_path / "mail.eml"
    eml.write_bytes(MESSAGE)
    status, out, _ = mailq("--url", url, "--json", "schema", "create")
    assert status == 0 and json.loads(out)["created"] is True
    # Again: the keyspace and bucket are there, nothing is made twice.
    status, out, _ = mailq("--url", url, "--json", "schema", "create")
    assert status == 0 and json.loads(out)["created"] is False
    status, out, err = mailq(
        "--url", url, "enqueue", "spool", str(eml), "--sender", SENDER, "--rcpt", RECIPIENT
    )
    assert status == 0, err
    status, out, _ = mailq("--url", url, "--json", "browse", "spool")
    (mail,) = json.loads(out)
    assert (mail["sender"], mail["recipients"]) == (SENDER, [RECIPIENT])
    assert mailq("--url", url, "size", "spool")[1] == "spool: 1 mails\n"
    # The content went to the bucket, under its blob ids.
    client = s3_server.client()
    bucket = url.split("s3=")[1].split("&")[0]
    assert client.list_objects_v2(Bucket=bucket)["KeyCount"] == 2  # the header and the body
    status, out, err = mailq("--url", url, "clear", "spool")
    assert status == 0, err
    assert mailq("--url", url, "size", "spool")[1] == "spool: 0 mails\n"


def test_the_demo_refuses_a_deployment_it_would_share_and_makes_nothing(
    url, deployment, s3_server, tmp_path, monkeypatch
):
    monkeypatch.setenv("MAILQ_PIPELINE_DIR", str(tmp_path / "pipeline"))
    # Someone else's content in the bucket: the demo's orphan sweep would delete it.
    bucket = url.split("s3=")[1].split("&")[0]
    client = s3_server.client()
    client.create_bucket(Bucket=bucket)
    client.put_object(Bucket=bucket, Key=f"g1_{'ab' * 32}", Body=b"kept")
    assert_one_line(mailq("--url", url, "demo", "--mails", "10"), f"bucket '{bucket}'", "holds content")
    assert not deployment.exists() and not (tmp_path / "pipeline").exists()
    assert client.get_object(Bucket=bucket, Key=f"g1_{'ab' * 32}")["Body"].read() == b"kept"
    # A keyspace that holds a store already.
    assert mailq("--url", url, "schema", "create")[0] == 0
    client.delete_object(Bucket=bucket, Key=f"g1_{'ab' * 32}")
    assert_one_line(mailq("--url", url, "demo", "--mails", "10"), "holds a mailq store already")
