"""The pipeline's outputs on the distributed deployment go to its bucket through s3a://, not to a disk:
`mailq gc --dry-run`, `gc --apply` and `blobs explain` with no MAILQ_PIPELINE_DIR, on the harness's
Cassandra and S3. Each command runs in a process of its own, as a user runs it: s3a's jars are set when
Spark's JVM starts, which this session's shared local Spark has started without them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mailq_runtime import InvalidInput, Runtime
from mailq_runtime.settings import Settings
from mailq_servers.s3 import remove_bucket
from mailq_servers.urls import distributed_url
from resources.outputs import Outputs
from tests.cli.test_store_errors import assert_one_line
from tests.cli.test_store_errors import mailq as in_process
from tests.runtime.backends import CassandraS3
from tests.servers.fixtures import fresh_bucket_name, fresh_keyspace

from .test_gc_plan import GARBAGE, eligible_garbage_and_live

# Three commands, each starting Spark with s3a on a machine other work shares.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture
def url(cassandra_s3: CassandraS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A distributed deployment made for the test (its broker embedded: the pipeline uses none), and the
    S3 keys in the environment of this process and of the commands it starts."""
    for variable, value in cassandra_s3.s3_server.env().items():
        monkeypatch.setenv(variable, value)
    with fresh_keyspace(cassandra_s3.cassandra_server) as keyspace:
        bucket = fresh_bucket_name()
        url = distributed_url(
            cassandra_s3.cassandra_server,
            cassandra_s3.s3_server,
            keyspace,
            bucket,
            f"embedded:{tmp_path / 'b'}",
        )
        Runtime.open(url, create=True).close()
        yield url
        remove_bucket(cassandra_s3.s3, bucket)


def mailq(url: str, cwd: Path, *argv: str) -> dict:
    """`mailq --url URL --json ARGV` in a process of its own, started in `cwd`, with neither
    MAILQ_PIPELINE_DIR nor DAGSTER_HOME; its JSON report."""
    environ = {k: v for k, v in os.environ.items() if k not in ("MAILQ_PIPELINE_DIR", "DAGSTER_HOME")}
    environ |= {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, "-m", "mailq_cli", "--url", url, "--json", *argv],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_plan_application_and_explanation_keep_their_records_in_the_bucket(
    url: str, cassandra_s3: CassandraS3, tmp_path: Path
) -> None:
    settings = Settings.from_url(url)
    assert settings.s3 is not None
    bucket = settings.s3.bucket
    with Runtime.open(url) as runtime:
        garbage, live = eligible_garbage_and_live(runtime)
    workdir = tmp_path / "cwd"
    workdir.mkdir()

    plan = mailq(url, workdir, "gc", "--dry-run", "--exact")["assets"]["gc_plan"]

    assert plan["blobs_to_delete"] == len(GARBAGE)
    assert plan["path"] == f"s3a://{bucket}/pipeline/gc_plans/{plan['plan_id']}"
    keys = {item["Key"] for item in cassandra_s3.s3.list_objects_v2(Bucket=bucket)["Contents"]}
    plan_keys = {key for key in keys if key.startswith(f"pipeline/gc_plans/{plan['plan_id']}/")}
    assert f"pipeline/gc_plans/{plan['plan_id']}/_SUCCESS" in plan_keys
    assert any(key.endswith(".parquet") for key in plan_keys)
    # The JSON outputs too (reference_generations' generations), written without Spark.
    assert "pipeline/reference_generations.json" in keys

    applied = mailq(url, workdir, "gc", "--apply", plan["plan_id"])["assets"]["applied_gc_plan"]

    assert (applied["planned_blobs"], applied["deleted_blobs"]) == (len(GARBAGE), len(GARBAGE))
    with Runtime.open(url) as runtime:
        stored = set(runtime.content.list_ids())
    assert live in stored and not stored & set(garbage)
    # The blob store's listing and deletions pass over the pipeline's keys, which are still there.
    keys = {item["Key"] for item in cassandra_s3.s3.list_objects_v2(Bucket=bucket)["Contents"]}
    assert f"pipeline/gc_plans/{plan['plan_id']}/_SUCCESS" in keys
    assert any(key.startswith("pipeline/gc_runs/") and key.endswith("/_SUCCESS") for key in keys)

    # Read back with pyarrow, without Spark: the record of the run that deleted it.
    explained = mailq(url, workdir, "blobs", "explain", str(garbage[0]))
    assert explained["last_gc"]["outcome"] == "deleted"
    assert explained["last_gc"]["plan_id"] == plan["plan_id"]
    assert list(workdir.iterdir()) == []  # nothing written to the disk of the commands


def test_outputs_in_an_object_store_the_deployment_lacks_are_refused(tmp_path: Path) -> None:
    embedded = Settings.from_url(f"embedded://{tmp_path / 'data'}")
    with pytest.raises(InvalidInput, match="need an object store, and the deployment of"):
        Outputs.of("s3a://somewhere/pipeline", embedded)
    with pytest.raises(InvalidInput, match="expected s3a://<bucket>/<path>"):
        Outputs.of("s3a:///pipeline", embedded)


def test_a_bucket_the_pipeline_cannot_write_is_one_line_before_any_run(
    url: str, cassandra_s3: CassandraS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = fresh_bucket_name()
    monkeypatch.setenv("MAILQ_PIPELINE_DIR", f"s3a://{missing}/pipeline")
    monkeypatch.delenv("DAGSTER_HOME", raising=False)

    refused = in_process("--url", url, "gc", "--dry-run")

    assert_one_line(refused, f"outputs at 's3a://{missing}/pipeline' cannot be written")

    buckets = {bucket["Name"] for bucket in cassandra_s3.s3.list_buckets()["Buckets"]}
    assert missing not in buckets  # nothing made
