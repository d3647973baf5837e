"""The harness's servers really serve: each test does through the real client what mailq's backends will."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pika
import pytest
from cassandra.concurrent import execute_concurrent_with_args
from cassandra.query import SimpleStatement

from mailq_servers.cassandra import CassandraServer
from mailq_servers.rabbitmq import RabbitMQServer
from mailq_servers.s3 import S3Server, remove_bucket
from mailq_servers.spark import SparkCluster

from .fixtures import fresh_bucket_name, fresh_keyspace_name

MIN_TOKEN, MAX_TOKEN = -(2**63), 2**63 - 1


def test_cassandra_round_trip_token_ranges_and_counters(cassandra_server: CassandraServer):
    # A keyspace of its own: the session's `keyspace_name` belongs to the stores' tests.
    keyspace_name = fresh_keyspace_name()
    cluster = cassandra_server.cluster()
    session = cluster.connect()
    try:
        session.execute(
            f"CREATE KEYSPACE {keyspace_name}"
            " WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}"
        )
        session.set_keyspace(keyspace_name)
        session.execute("CREATE TABLE blobs (blob_id text PRIMARY KEY, generation int)")
        session.execute(
            "CREATE TABLE mailbox_counters (mailbox text PRIMARY KEY, count counter, unseen counter)"
        )

        insert = session.prepare("INSERT INTO blobs (blob_id, generation) VALUES (?, ?)")
        rows = [(f"blob-{n}", n % 3) for n in range(500)]
        results = execute_concurrent_with_args(
            session, insert, rows, concurrency=50, raise_on_first_error=True
        )
        assert all(result.success for result in results)

        # Murmur3 never assigns the minimum token, so (MIN, t0] .. (tn, MAX] covers every row; each
        # range is split further, as the Spark reader will split it for the cluster's cores.
        ring = [token.value for token in cluster.metadata.token_map.ring]
        bounds = sorted({MIN_TOKEN, *ring, MAX_TOKEN})
        ranges = []
        for start, end in zip(bounds, bounds[1:], strict=False):
            step = (end - start) // 4
            cuts = [start + step * n for n in range(4)] + [end]
            ranges.extend(zip(cuts, cuts[1:], strict=False))
        scan = session.prepare(
            "SELECT blob_id, generation FROM blobs WHERE token(blob_id) > ? AND token(blob_id) <= ?"
        )
        seen = [tuple(row) for start, end in ranges for row in session.execute(scan, (start, end))]
        assert sorted(seen) == sorted(rows)
        assert len(ranges) >= 8

        one = session.execute(
            SimpleStatement("SELECT generation FROM blobs WHERE blob_id = %s"), ("blob-7",)
        ).one()
        assert one.generation == 1

        bump = session.prepare(
            "UPDATE mailbox_counters SET count = count + ?, unseen = unseen + ? WHERE mailbox = ?"
        )
        session.execute(bump, (3, 2, "INBOX"))
        session.execute(bump, (4, -1, "INBOX"))
        counters = session.execute("SELECT count, unseen FROM mailbox_counters WHERE mailbox = 'INBOX'").one()
        assert (counters.count, counters.unseen) == (7, 1)
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace_name}", timeout=120)
        cluster.shutdown()


def test_s3_put_get_delete_objects_and_multipart_upload(s3_server: S3Server):
    # A bucket of its own: the session's `bucket_name` belongs to the stores' tests.
    bucket_name = fresh_bucket_name()
    client = s3_server.client()
    client.create_bucket(Bucket=bucket_name)
    try:
        _s3_round_trip(client, bucket_name)
    finally:
        remove_bucket(client, bucket_name)


def _s3_round_trip(client, bucket_name: str) -> None:
    client.put_object(Bucket=bucket_name, Key="blob-a", Body=b"hello", ChecksumAlgorithm="CRC32")
    assert client.get_object(Bucket=bucket_name, Key="blob-a")["Body"].read() == b"hello"
    assert client.get_object(Bucket=bucket_name, Key="blob-a", Range="bytes=1-3")["Body"].read() == b"ell"
    with pytest.raises(client.exceptions.NoSuchKey):
        client.get_object(Bucket=bucket_name, Key="absent")

    keys = [f"gc-{n:04d}" for n in range(120)]
    for key in keys:
        client.put_object(Bucket=bucket_name, Key=key, Body=key.encode())
    deleted = client.delete_objects(Bucket=bucket_name, Delete={"Objects": [{"Key": key} for key in keys]})
    assert sorted(entry["Key"] for entry in deleted["Deleted"]) == keys
    assert not deleted.get("Errors")
    listed = client.list_objects_v2(Bucket=bucket_name)
    assert [entry["Key"] for entry in listed["Contents"]] == ["blob-a"]

    # Parts other than the last must be at least 5 MiB, as on AWS.
    parts = [bytes([n]) * (5 * 2**20) for n in range(2)] + [b"tail"]
    upload = client.create_multipart_upload(Bucket=bucket_name, Key="large")
    etags = [
        client.upload_part(
            Bucket=bucket_name, Key="large", UploadId=upload["UploadId"], PartNumber=number, Body=body
        )["ETag"]
        for number, body in enumerate(parts, start=1)
    ]
    client.complete_multipart_upload(
        Bucket=bucket_name,
        Key="large",
        UploadId=upload["UploadId"],
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": etag} for n, etag in enumerate(etags, start=1)]},
    )
    body = client.get_object(Bucket=bucket_name, Key="large")["Body"].read()
    assert hashlib.sha256(body).digest() == hashlib.sha256(b"".join(parts)).digest()


def test_s3_refuses_a_wrong_secret(s3_server: S3Server):
    intruder = S3Server(s3_server.endpoint_url, s3_server.access_key_id, "not-the-secret").client()
    with pytest.raises(intruder.exceptions.ClientError) as refused:
        intruder.list_buckets()
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_rabbitmq_quorum_queue_with_confirms_and_acks(rabbitmq_server: RabbitMQServer):
    queue = f"mailq-test-{secrets.token_hex(4)}"
    connection = pika.BlockingConnection(rabbitmq_server.connection_parameters())
    try:
        channel = connection.channel()
        declared = channel.queue_declare(
            queue,
            durable=True,
            arguments={"x-queue-type": "quorum", "x-overflow": "reject-publish", "x-delivery-limit": 3},
        )
        assert declared.method.message_count == 0
        channel.confirm_delivery()
        sent = [f"mail-{n}".encode() for n in range(20)]
        for body in sent:
            # With confirms on, a publish the broker nacks or cannot route raises here.
            channel.basic_publish(
                "",
                queue,
                body,
                pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent),
                mandatory=True,
            )

        received = []
        channel.basic_qos(prefetch_count=5)
        for method, _properties, body in channel.consume(queue, inactivity_timeout=10):
            assert method is not None, f"only {len(received)} of {len(sent)} messages came back"
            received.append(body)
            channel.basic_ack(method.delivery_tag)
            if len(received) == len(sent):
                break
        channel.cancel()
        assert received == sent
        assert channel.queue_declare(queue, passive=True).method.message_count == 0
        channel.queue_delete(queue)
    finally:
        connection.close()


# Run as its own process: a driver is one per process, and a local session of another suite in this
# pytest run would otherwise be the one `getOrCreate()` returns.
SPARK_JOB = """
import json, os, sys, time
from pyspark.sql import SparkSession

builder = SparkSession.builder.appName("mailq-harness-check")
for key, value in json.loads(sys.argv[1]).items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()

def where(number):
    time.sleep(0.3)
    return os.getcwd(), sys.executable, number * number

print(json.dumps(spark.sparkContext.parallelize(range(8), 8).map(where).collect()))
spark.stop()
"""


def test_spark_job_runs_on_both_workers(spark_cluster: SparkCluster, tmp_path: Path):
    conf = {
        **spark_cluster.conf(),
        "spark.ui.enabled": "false",
        "spark.executor.memory": "512m",
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
        "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1",
        # Start only once both executors (one core each) have registered, so that both get tasks.
        "spark.cores.max": str(spark_cluster.cores),
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
    }
    job = tmp_path / "job.py"
    job.write_text(SPARK_JOB)
    env = {**os.environ, **spark_cluster.env()}
    done = subprocess.run(
        [sys.executable, str(job), json.dumps(conf)], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    placed = json.loads(done.stdout.strip().splitlines()[-1])

    assert sorted(square for _cwd, _python, square in placed) == [n * n for n in range(8)]
    # An executor runs in <worker work dir>/<application>/<executor>.
    assert {Path(cwd).parent.parent.name for cwd, _python, _square in placed} == {"worker-1", "worker-2"}
    assert {python for _cwd, python, _square in placed} == {spark_cluster.python}
