"""The code location: it loads, exposes every asset, check, job, sensor and schedule by name, and the
Dagster webserver really serves it from workspace.yaml."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import dagster as dg

from assets.definitions import defs

ROOT = Path(__file__).resolve().parents[2]
ASSETS = {
    "reference_generations",
    "deletion_sets",
    "live_reference_filter",
    "collected_blobs",
    "orphan_blobs",
    "mailbox_counters",
    "mail_queue_slices",
    "mail_queue_cleanup",
}
CHECKS = {
    "collected_blobs": {"no_live_blob_collected"},
    "mailbox_counters": {"counters_match_source_of_truth"},
    "mail_queue_slices": {"slice_counters_match_recount", "browse_start_not_ahead_of_live_mail"},
}
JOBS = {
    "blob_gc_job",
    "orphan_sweep_job",
    "mailbox_counters_job",
    "queue_cleanup_job",
    "maintenance_job",
    "rotate_generation_job",
}
SENSORS = {"deletions_waiting_sensor", "queue_cleanup_sensor", "counter_drift_sensor"}
SCHEDULES = {"rotate_generation_schedule"}
SERVER_START_S = 90


def test_the_definitions_load_and_expose_everything_by_name() -> None:
    dg.Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    assert {key.to_user_string() for key in graph.get_all_asset_keys()} == ASSETS
    checks: dict[str, set[str]] = {}
    for key in graph.asset_check_keys:
        checks.setdefault(key.asset_key.to_user_string(), set()).add(key.name)
    assert checks == CHECKS
    for name in JOBS:
        assert defs.resolve_job_def(name).name == name
    assert {sensor.name for sensor in defs.sensors} == SENSORS
    assert {schedule.name for schedule in defs.schedules} == SCHEDULES
    # The GC job is one iteration of record 39, in lineage order; the sweep is a job of its own.
    gc = defs.resolve_job_def("blob_gc_job").asset_layer.selected_asset_keys
    assert {key.to_user_string() for key in gc} == {
        "reference_generations",
        "deletion_sets",
        "live_reference_filter",
        "collected_blobs",
    }


QUERY = """
{
  workspaceOrError {
    ... on Workspace {
      locationEntries { name locationOrLoadError { __typename ... on PythonError { message } } }
    }
  }
  repositoriesOrError {
    ... on RepositoryConnection {
      nodes {
        name
        assetNodes {
          assetKey { path }
          assetChecksOrError { ... on AssetChecks { checks { name } } }
        }
        jobs { name }
        sensors { name }
        schedules { name }
      }
    }
    ... on PythonError { message }
  }
}
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get(url: str, data: bytes | None = None) -> bytes:
    headers = {"Content-Type": "application/json"} if data is not None else {}
    request = urllib.request.Request(url, data=data, headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.read()


def test_the_webserver_serves_the_code_location(tmp_path: Path) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    environment = {**os.environ, "DAGSTER_HOME": str(home), "MAILQ_URL": f"embedded://{tmp_path / 'data'}"}
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "webserver.log"
    with log.open("wb") as output:
        server = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("dagster-webserver")),
                "-w",
                "workspace.yaml",
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
            ],
            cwd=ROOT,
            env=environment,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            assert server.poll() is None, f"the webserver exited:\n{log.read_text()[-3000:]}"
            try:
                assert json.loads(get(f"{base}/server_info"))["dagster_webserver_version"]
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, f"not up in {SERVER_START_S}s:\n{log.read_text()[-3000:]}"
                time.sleep(1)

        answer = json.loads(get(f"{base}/graphql", json.dumps({"query": QUERY}).encode()))
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the webserver and the code server it started
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()

    assert "errors" not in answer, answer["errors"]
    (location,) = answer["data"]["workspaceOrError"]["locationEntries"]
    assert location["locationOrLoadError"]["__typename"] == "RepositoryLocation", location
    (repository,) = answer["data"]["repositoriesOrError"]["nodes"]
    served_checks: dict[str, set[str]] = {}
    for node in repository["assetNodes"]:
        names = {check["name"] for check in node["assetChecksOrError"]["checks"]}
        if names:
            served_checks["/".join(node["assetKey"]["path"])] = names
    assert {"/".join(node["assetKey"]["path"]) for node in repository["assetNodes"]} == ASSETS
    assert served_checks == CHECKS
    assert JOBS <= {job["name"] for job in repository["jobs"]}
    assert {sensor["name"] for sensor in repository["sensors"]} == SENSORS
    assert {schedule["name"] for schedule in repository["schedules"]} == SCHEDULES
