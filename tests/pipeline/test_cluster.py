"""The whole maintenance job on the harness's Spark standalone cluster (a master, two workers) against
Cassandra + S3: every task runs in an executor of a worker, which reads Cassandra and S3 from the URL
and its own environment, so code that works only in local mode (closures over the driver's files, paths
of an embedded store) cannot pass. The run is the code location's job, as `mailq` runs it, in a process of
its own: one process holds one Spark context, and the suite's is local.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from mailq_runtime import Runtime
from mailq_runtime.faults import AFTER_PROJECTION, InjectedFault
from mailq_runtime.model import BlobId, MailboxId
from mailq_runtime.settings import Settings
from mailq_servers.spark import SparkCluster
from resources.spark import code_zip
from tests.runtime.backends import Backend
from tests.runtime.helpers import FakeClock, make_mail

DEPLOYMENTS = ("cassandra",)
# A cluster's run starts executors on both workers: about a minute and a half on a quiet two-core machine.
pytestmark = pytest.mark.timeout(900)
# The jobs one after the other in one process, as one Spark application: a summary line a job.
RUN_JOBS = """
import json, sys
from assets import runner
for job in sys.argv[2:]:
    print(json.dumps(runner.summarise(runner.run_job(job, sys.argv[1]))))
"""
# A session on the cluster with the pipeline's settings: where its executors' Python finds mailq.
EXECUTOR_CODE = """
import json
from pyspark.sql import SparkSession
from resources.spark import spark_config
builder = SparkSession.builder
for key, value in spark_config().items():
    builder = builder.config(key, value)
session = builder.getOrCreate()
def imported(_):
    import mailq_runtime
    import assets.spark.table_source
    return [mailq_runtime.__file__, assets.spark.table_source.__file__]
print(json.dumps(session.sparkContext.parallelize(range(2), 2).flatMap(imported).collect()))
session.stop()
"""


def applications(cluster: SparkCluster) -> dict[str, list[dict]]:
    """The master's active and completed applications."""
    with urllib.request.urlopen(f"{cluster.web_ui_url}/json/", timeout=10) as answer:
        state = json.load(answer)
    return {"active": state["activeapps"], "completed": state["completedapps"]}


def job_process(
    jobs: tuple[str, ...], backend: Backend, cluster: SparkCluster, outputs: Path | None, app: str
) -> subprocess.Popen:
    """The jobs' process; their outputs in the directory `outputs`, or with None where the deployment
    keeps them by default: its bucket, through s3a."""
    env = {
        **os.environ,
        **cluster.env(),
        # Any settings the caller's environment gives, then the application's name.
        "MAILQ_SPARK_CONF": ",".join(
            filter(None, (os.environ.get("MAILQ_SPARK_CONF"), f"spark.app.name={app}"))
        ),
    }
    env.pop("DAGSTER_HOME", None)
    env.pop("MAILQ_PIPELINE_DIR", None)
    if outputs is not None:
        env["MAILQ_PIPELINE_DIR"] = str(outputs)
    return subprocess.Popen(
        [sys.executable, "-c", RUN_JOBS, backend.url(), *jobs],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def run_jobs(
    jobs: tuple[str, ...], backend: Backend, cluster: SparkCluster, outputs: Path | None, app: str
) -> dict[str, dict]:
    """Run `jobs` in one job process to the end; every job must succeed. Their assets' figures, merged."""
    process = job_process(jobs, backend, cluster, outputs, app)
    try:
        out, err = process.communicate(timeout=800)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, err[-3000:]
    assets: dict[str, dict] = {}
    for line in out.strip().splitlines()[-len(jobs) :]:
        summary = json.loads(line)
        assert summary["success"], (summary["failures"] or summary["checks"], err[-3000:])
        assets |= summary["assets"]
    return assets


def maintenance_work(runtime: Runtime) -> tuple[BlobId, BlobId, MailboxId]:
    """Work for each maintenance job, on a runtime whose clock is long past: (the live blob, the garbage
    blob, the mailbox whose counters are behind)."""
    # Blob GC: one blob still referenced, one released, in a generation two rotations make eligible.
    live, garbage = runtime.blobs.save("keeper", b"live content"), runtime.blobs.save("leaver", b"garbage")
    runtime.blobs.release("leaver")
    runtime.generations.rotate()
    runtime.generations.rotate()
    # What follows saves in the current generation, which this run's GC does not examine.
    # Counters: an append that dies after the projection leaves the mailbox's counters behind.
    boxes = runtime.mailboxes
    inbox = boxes.create("alice@example.com", "INBOX")
    boxes.append(inbox, b"Subject: one\r\n\r\nfirst\r\n")
    boxes.faults.arm(AFTER_PROJECTION)
    with pytest.raises(InjectedFault):
        boxes.append(inbox, b"Subject: two\r\n\r\nsecond\r\n")
    # Queue clean-up: mails enqueued and delivered in slices long past.
    spool = runtime.queue("spool")
    for name in ("m1", "m2"):
        spool.enqueue(make_mail(name))
    for _ in range(2):
        item = spool.dequeue(timeout=5)
        assert item is not None
        item.done()
    return live, garbage, inbox


def test_the_gc_and_maintenance_jobs_run_on_the_cluster_and_do_all_their_work(
    backend: Backend, spark_cluster: SparkCluster, tmp_path: Path
) -> None:
    runtime = backend.open(FakeClock())
    live, garbage, inbox = maintenance_work(runtime)
    runtime.close()
    app = f"mailq-test-{secrets.token_hex(4)}"

    # The GC's destructive steps run only in the GC jobs; maintenance_job holds the rest. Their outputs
    # go to the deployment's bucket: the executors and the driver share no disk.
    jobs = ("blob_gc_job", "maintenance_job")
    assets = run_jobs(jobs, backend, spark_cluster, None, app)
    assert (assets["collected_blobs"]["concerned_blobs"], assets["collected_blobs"]["deleted_blobs"]) == (
        1,
        1,
    )
    assert assets["mailbox_counters"]["corrected_counters"] == 1
    assert assets["mail_queue_cleanup"]["queues_cleaned"] == 1
    contents = backend.blob_state().contents
    assert str(garbage) not in contents and str(live) in contents
    assert backend.mailbox_state().counters[inbox] == (2, 2)
    assert backend.queue_rows("spool").rows() == 0
    # Both ran on the cluster, in the process's one application, with both workers' cores.
    ran = [a["cores"] for a in applications(spark_cluster)["completed"] if a["name"] == app]
    assert ran == [spark_cluster.cores]
    s3 = Settings.from_url(backend.url()).s3
    assert s3 is not None
    listed = backend.servers.s3.list_objects_v2(Bucket=s3.bucket, Prefix=f"{s3.prefix}pipeline/")
    written = {item["Key"].removeprefix(f"{s3.prefix}pipeline/") for item in listed.get("Contents", ())}
    assert {"reference_generations.json", "deletion_sets/_SUCCESS", "mail_queue_slices/_SUCCESS"} <= written
    assert any(key.startswith("gc_runs/") and key.endswith("/_SUCCESS") for key in written)


def test_the_executors_run_the_code_the_driver_hands_them(spark_cluster: SparkCluster) -> None:
    done = subprocess.run(
        [sys.executable, "-c", EXECUTOR_CODE],
        env={**os.environ, **spark_cluster.env()},
        capture_output=True,
        text=True,
        timeout=600,
    )

    assert done.returncode == 0, done.stderr[-3000:]
    imported = json.loads(done.stdout.strip().splitlines()[-1])
    # From the zip the driver made of this tree, which each executor fetched into its own directory,
    # though the workers' interpreter has mailq installed too.
    shipped = code_zip().name
    assert len(imported) == 4 and all(f"/{shipped}/" in path for path in imported), imported
    assert not any(path.startswith(str(code_zip().parent)) for path in imported)


def test_cancelling_a_run_stops_its_spark_application(
    backend: Backend, spark_cluster: SparkCluster, tmp_path: Path
) -> None:
    runtime = backend.open()
    for n in range(50):
        runtime.blobs.save(f"owner{n}", b"content %d" % n)
    runtime.close()
    app = f"mailq-test-{secrets.token_hex(4)}"
    process = job_process(("maintenance_job",), backend, spark_cluster, tmp_path / "outputs", app)
    try:
        deadline = time.monotonic() + 300
        while not any(a["name"] == app for a in applications(spark_cluster)["active"]):
            assert process.poll() is None, process.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the run's Spark application never started"
            time.sleep(0.5)

        # What Dagster sends a run's process when an operator terminates the run.
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=120)

        deadline = time.monotonic() + 60
        while any(a["name"] == app for a in applications(spark_cluster)["active"]):
            assert time.monotonic() < deadline, "the Spark application outlived its cancelled run"
            time.sleep(0.5)
        assert [a["name"] for a in applications(spark_cluster)["completed"]].count(app) == 1
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
