"""The maintenance pipeline across hosts, sharing no disk: the GC and maintenance jobs run with their
driver on the driver host, their tasks in executors on the three server hosts (mailq's code handed to
them by the driver), their outputs in the deployment's bucket on the objects host (s3a); and they find
and do exactly what the same jobs do on the embedded deployment for the same data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mailq_runtime import Runtime
from mailq_runtime.settings import Settings
from mailq_servers.host_bed import HostBed, running_facts
from tests.pipeline.test_cluster import RUN_JOBS, maintenance_work
from tests.runtime.helpers import FakeClock

pytestmark = pytest.mark.timeout(1200)
JOBS = ("blob_gc_job", "maintenance_job")
LOOPBACK = "127.0.0.1"
# What each job's assets report that the data decides (not the times, ids or places of a run).
FIGURES = {
    "collected_blobs": ("concerned_blobs", "deleted_blobs", "kept_still_referenced", "bytes_reclaimed"),
    "mailbox_counters": ("corrected_counters",),
    "mail_queue_cleanup": ("queues_cleaned",),
}


def seed(runtime: Runtime) -> dict[str, str]:
    """The same data on either deployment: the cluster test's work for each job (`maintenance_work`)."""
    live, garbage, inbox = maintenance_work(runtime)
    return {"live": str(live), "garbage": str(garbage), "inbox": inbox}


def figures(done: subprocess.CompletedProcess) -> dict[str, dict]:
    assets: dict[str, dict] = {}
    for line in done.stdout.strip().splitlines()[-len(JOBS) :]:
        summary = json.loads(line)
        assert summary["success"], (summary["failures"] or summary["checks"], done.stderr[-4000:])
        assets |= summary["assets"]
    return {asset: {key: assets[asset][key] for key in keys} for asset, keys in FIGURES.items()}


def state(url: str, seeded: dict[str, str]) -> tuple[set[str], tuple[int, int]]:
    """What the jobs leave: which of the two blobs keep their content, the mailbox's counters."""
    with Runtime.open(url) as runtime:
        kept = {name for name in ("live", "garbage") if runtime.blobs.explain(seeded[name]).content}
        counters = runtime.mailboxes.counters(seeded["inbox"])
    return kept, (counters.count, counters.unseen)


def test_the_jobs_across_hosts_do_what_they_do_on_the_embedded_deployment(
    host_bed: HostBed, bed_url: str, bed_client: None, tmp_path: Path
) -> None:
    embedded_url = f"embedded://{tmp_path / 'embedded'}"
    seeded = {}
    for url in (embedded_url, bed_url):
        with Runtime.open(url, clock=FakeClock(), create=True) as runtime:
            seeded[url] = seed(runtime)
    environ = {k: v for k, v in os.environ.items() if k not in ("MAILQ_PIPELINE_DIR", "DAGSTER_HOME")}

    local = subprocess.run(
        [sys.executable, "-c", RUN_JOBS, embedded_url, *JOBS],
        # Local Spark on this machine's loopback, not the bed's cluster that `bed_client` points at.
        env={**{k: v for k, v in environ.items() if k != "MAILQ_SPARK_MASTER"}, "SPARK_LOCAL_IP": LOOPBACK},
        capture_output=True,
        text=True,
        timeout=900,
    )
    across = subprocess.run(
        host_bed.host("driver").command([sys.executable, "-c", RUN_JOBS, bed_url, *JOBS]),
        env={**environ, **running_facts().client_env()},
        capture_output=True,
        text=True,
        timeout=900,
    )

    assert local.returncode == 0, local.stderr[-3000:]
    assert across.returncode == 0, across.stderr[-3000:]
    assert figures(across) == figures(local)
    assert figures(local)["collected_blobs"]["deleted_blobs"] == 1
    assert state(bed_url, seeded[bed_url]) == state(embedded_url, seeded[embedded_url])
    assert state(bed_url, seeded[bed_url]) == ({"live"}, (2, 2))
    # The outputs went to the bucket on the objects host, none to a disk of the driver's.
    s3 = Settings.from_url(bed_url).s3
    assert s3 is not None
    listed = running_facts().s3_server.client().list_objects_v2(Bucket=s3.bucket, Prefix="pipeline/")
    written = {item["Key"] for item in listed.get("Contents", ())}
    assert {"pipeline/reference_generations.json", "pipeline/deletion_sets/_SUCCESS"} <= written
    driver_files = host_bed.host("driver").directory
    assert not any(driver_files.rglob("*.parquet"))
