"""The Spark executors reach Cassandra and S3 over TLS the way the runtime does: from the URL, whose TLS
files each executor reads at their paths (tls.py). The blob GC job runs on the harness's Spark cluster
against the TLS servers, its tasks in the workers' executors, and collects what it must; its outputs go
to the bucket through s3a over https, which the driver and the executors verify against the URL's CA
(a JVM trust store made from it, resources/s3a.py)."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

import pytest

from mailq_runtime.runtime import Runtime
from mailq_runtime.settings import Settings
from mailq_servers.s3 import S3Server, remove_bucket
from mailq_servers.spark import SparkCluster
from mailq_servers.urls import distributed_url
from tests.pipeline.test_cluster import applications, run_jobs
from tests.runtime.backends import CassandraS3
from tests.runtime.helpers import FakeClock
from tests.servers.fixtures import fresh_bucket_name, fresh_keyspace

pytestmark = pytest.mark.timeout(900)


class TlsBackend:
    """What `job_process` needs of a backend: the URL it hands the job."""

    def __init__(self, url: str) -> None:
        self._url = url

    def url(self) -> str:
        return self._url


def test_the_blob_gc_runs_on_the_cluster_over_tls(
    cassandra_s3_tls: CassandraS3,
    s3_server: S3Server,
    spark_cluster: SparkCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    # The harness's S3 keys for this process and the job's (its environment goes to the executors).
    for key, value in s3_server.env().items():
        if key.startswith("AWS_"):
            monkeypatch.setenv(key, value)
    # The executors import mailq from the path this process does, so that they run this tree's code.
    monkeypatch.setenv("MAILQ_SPARK_CONF", f"spark.executorEnv.PYTHONPATH={os.environ.get('PYTHONPATH', '')}")
    bucket = fresh_bucket_name()
    with fresh_keyspace(cassandra_s3_tls.cassandra_server) as keyspace:
        url = distributed_url(
            cassandra_s3_tls.cassandra_server,
            cassandra_s3_tls.s3_server,
            keyspace,
            bucket,
            f"embedded:{tmp_path / 'broker'}",
        )
        try:
            runtime = Runtime(Settings.from_url(url), FakeClock(), create=True)
            live = runtime.blobs.save("keeper", b"live content")
            garbage = runtime.blobs.save("leaver", b"garbage")
            runtime.blobs.release("leaver")
            runtime.generations.rotate()
            runtime.generations.rotate()
            runtime.close()
            app = f"mailq-tls-test-{secrets.token_hex(4)}"
            assets = run_jobs(("blob_gc_job",), TlsBackend(url), spark_cluster, None, app)
            collected = assets["collected_blobs"]
            assert (collected["concerned_blobs"], collected["deleted_blobs"]) == (1, 1)
            keys = {
                entry["Key"]
                for entry in cassandra_s3_tls.s3.list_objects_v2(Bucket=bucket).get("Contents", [])
            }
            assert str(garbage) not in keys and str(live) in keys
            assert {"pipeline/reference_generations.json", "pipeline/deletion_sets/_SUCCESS"} <= keys
            assert any(key.startswith("pipeline/gc_runs/") and key.endswith("/_SUCCESS") for key in keys)
            ran = [a["cores"] for a in applications(spark_cluster)["completed"] if a["name"] == app]
            assert ran == [spark_cluster.cores]
        finally:
            remove_bucket(cassandra_s3_tls.s3, bucket)
            shutil.rmtree(tmp_path / "broker", ignore_errors=True)
