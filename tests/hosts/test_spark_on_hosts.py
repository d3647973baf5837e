"""The bed's Spark cluster: a driver on the driver host, its tasks run by executors of the workers on the
three server hosts, each in its own host's directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from mailq_servers.host_bed import SERVER_HOSTS, HostBed, running_facts

JOB = """
import json, os, socket, sys, time
from pyspark.sql import SparkSession

builder = SparkSession.builder.appName("mailq-bed-check")
for key, value in json.loads(sys.argv[1]).items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()

def where(number):
    time.sleep(0.3)
    return os.getcwd(), socket.gethostname(), number * number

print(json.dumps(spark.sparkContext.parallelize(range(12), 12).map(where).collect()))
spark.stop()
"""


def test_a_driver_on_the_driver_host_runs_its_tasks_on_the_three_server_hosts(host_bed: HostBed):
    cluster = running_facts().spark_cluster
    assert cluster.driver_host == host_bed.host("driver").address
    conf = {
        **cluster.conf(),
        "spark.ui.enabled": "false",
        "spark.executor.memory": "512m",
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
        "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1",
        "spark.cores.max": str(cluster.cores),
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
    }
    done = subprocess.run(
        host_bed.host("driver").command([sys.executable, "-c", JOB, json.dumps(conf)]),
        env={**running_facts().client_env(), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    placed = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(square for _cwd, _host, square in placed) == [n * n for n in range(12)]
    # An executor runs in <its host's directory>/spark/<application>/<executor>, on a host named alike.
    hosts = {(Path(cwd).relative_to(host_bed.run_dir).parts[0], host) for cwd, host, _square in placed}
    assert hosts == {(name, name) for name in SERVER_HOSTS}
