"""The code location: it loads, exposes every asset, check, job, sensor and schedule by name and with a
description, and the Dagster webserver really serves it from workspace.yaml: a command-line run is a run of
its job there, with table metadata, and the webserver re-executes it."""

from __future__ import annotations

import inspect
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pytest

from assets.definitions import defs
from mailq_cli.main import main
from mailq_runtime import Mail, Runtime

ROOT = Path(__file__).resolve().parents[2]
ASSETS = {
    "reference_generations",
    "deletion_sets",
    "live_reference_filter",
    "collected_blobs",
    "gc_plan",
    "applied_gc_plan",
    "orphan_blobs",
    "mailbox_counters",
    "mail_queue_slices",
    "mail_queue_cleanup",
    "mail_queue_overview",
    "mail_queue_domains",
    "mail_queue_dead_letters",
}
CHECKS = {
    "collected_blobs": {"no_live_blob_collected"},
    "applied_gc_plan": {"no_live_blob_collected"},
    "orphan_blobs": {"every_reference_finds_its_blob"},
    "mailbox_counters": {"counters_match_source_of_truth"},
    "mail_queue_slices": {"slice_counters_match_recount", "browse_start_not_ahead_of_live_mail"},
    "mail_queue_dead_letters": {"dead_letters_not_growing"},
}
JOBS = {
    "blob_gc_job",
    "orphan_sweep_job",
    "blob_gc_and_orphan_sweep_job",
    "gc_plan_job",
    "gc_plan_and_orphan_sweep_job",
    "gc_apply_job",
    "mailbox_counters_job",
    "queue_cleanup_job",
    "queue_overview_job",
    "dead_letters_job",
    "maintenance_job",
    "rotate_generation_job",
}
# What the GC's op-based jobs run: the read-only steps report their assets, the others report the specs of
# the destructive steps, which no asset job (and so no "Materialize all") selects.
MARK = {"read_reference_generations", "read_deletion_sets", "build_live_reference_filter"}
DESTRUCTIVE = {"collected_blobs", "gc_plan", "applied_gc_plan", "orphan_blobs"}
OP_JOBS = {
    "blob_gc_job": MARK | {"collected_blobs"},
    "orphan_sweep_job": {"read_reference_generations", "orphan_blobs"},
    "blob_gc_and_orphan_sweep_job": MARK | {"collected_blobs", "orphan_blobs"},
    "gc_plan_job": MARK | {"gc_plan"},
    "gc_plan_and_orphan_sweep_job": MARK | {"gc_plan", "orphan_blobs"},
    "gc_apply_job": {"applied_gc_plan"},
}
SENSORS = {"deletions_waiting_sensor", "queue_cleanup_sensor", "counter_drift_sensor", "dead_letters_sensor"}
SCHEDULES = {"rotate_generation_schedule"}
SERVER_START_S = 90
RUN_S = 300  # a re-execution starts a process, then Spark, on a loaded two-core machine


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
    # The overviews only look: they run in jobs of their own, not in the clean-up or the maintenance;
    # the GC's steps run in its op-based jobs.
    for name, expected in (
        ("maintenance_job", {"mailbox_counters", "mail_queue_slices", "mail_queue_cleanup"}),
        ("queue_cleanup_job", {"mail_queue_slices", "mail_queue_cleanup"}),
        ("queue_overview_job", {"mail_queue_overview", "mail_queue_domains"}),
        ("dead_letters_job", {"mail_queue_dead_letters"}),
    ):
        selected = defs.resolve_job_def(name).asset_layer.selected_asset_keys
        assert {key.to_user_string() for key in selected} == expected, name
    for name, ops in OP_JOBS.items():
        assert set(defs.resolve_job_def(name).graph.node_dict) == ops, name
    # The destructive steps are in Lineage and the Catalog, but not executable: no asset job selects them.
    assert {
        key.to_user_string() for key in graph.get_all_asset_keys() if not graph.get(key).is_executable
    } == (DESTRUCTIVE)


def test_every_asset_check_and_job_says_what_it_does() -> None:
    graph = defs.resolve_asset_graph()
    for key in graph.get_all_asset_keys():
        assert graph.get(key).description, key
    for check in defs.resolve_asset_graph().asset_check_keys:
        assert graph.get_check_spec(check).description, check
    for name in JOBS:
        assert defs.resolve_job_def(name).description, name
    for sensor in defs.sensors:
        assert sensor.description == inspect.cleandoc(sensor._raw_fn.__doc__), sensor.name


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
          isExecutable
          isObservable
          assetChecksOrError { ... on AssetChecks { checks { name } } }
        }
        jobs { name }
        sensors { name description }
        schedules { name }
      }
    }
    ... on PythonError { message }
  }
}
"""
# What the Launchpad of gc_apply_job shows and launches.
APPLY_CONFIG = """
{
  runConfigSchemaOrError(
    selector: {
      pipelineName: "gc_apply_job", repositoryName: "__repository__", repositoryLocationName: "mailq"
    }
  ) {
    ... on RunConfigSchema {
      rootDefaultYaml
      isRunConfigValid(runConfigData: {}) { __typename }
      allConfigTypes { ... on CompositeConfigType { fields { name isRequired description } } }
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


@contextmanager
def webserver(tmp_path: Path, environment: dict[str, str]) -> Iterator[str]:
    """`dagster-webserver -w workspace.yaml` on a free port; yields its base URL."""
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
        yield base
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the webserver and the code server it started
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def graphql(base: str, query: str, variables: dict | None = None) -> dict:
    answer = json.loads(get(f"{base}/graphql", json.dumps({"query": query, "variables": variables}).encode()))
    assert "errors" not in answer, answer["errors"]
    return answer["data"]


def test_the_webserver_serves_the_code_location(tmp_path: Path) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    environment = {**os.environ, "DAGSTER_HOME": str(home), "MAILQ_URL": f"embedded://{tmp_path / 'data'}"}
    with webserver(tmp_path, environment) as base:
        answer = json.loads(get(f"{base}/graphql", json.dumps({"query": QUERY}).encode()))
        apply_config = graphql(base, APPLY_CONFIG)

    assert "errors" not in answer, answer["errors"]
    (location,) = answer["data"]["workspaceOrError"]["locationEntries"]
    assert location["locationOrLoadError"]["__typename"] == "RepositoryLocation", location
    assert location["name"] == "mailq"
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
    for sensor in repository["sensors"]:
        assert sensor["description"] == defs.resolve_sensor_def(sensor["name"]).description, sensor
    assert {schedule["name"] for schedule in repository["schedules"]} == SCHEDULES
    # "Materialize all" (Lineage, the Catalog) selects the asset nodes that are executable and not
    # observable: none of the destructive steps, which are in the graph all the same.
    materializable = {
        "/".join(n["assetKey"]["path"])
        for n in repository["assetNodes"]
        if n["isExecutable"] and not n["isObservable"]
    }
    assert materializable == ASSETS - DESTRUCTIVE
    # gc_apply_job launched as the Launchpad scaffolds it, with no plan id, applies the newest plan.
    schema = apply_config["runConfigSchemaOrError"]
    assert schema["isRunConfigValid"]["__typename"] == "PipelineConfigValidationValid", schema
    (plan_id,) = [f for t in schema["allConfigTypes"] for f in t.get("fields", []) if f["name"] == "plan_id"]
    assert plan_id["isRequired"] is False
    assert "default: the newest plan with blobs that is not applied yet" in plan_id["description"]


MATERIALIZATIONS = """
query ($path: [String!]!) {
  assetOrError(assetKey: {path: $path}) {
    ... on Asset {
      assetMaterializations(limit: 1) {
        runId
        metadataEntries {
          __typename
          label
          ... on TableMetadataEntry { table { records schema { columns { name type description } } } }
        }
      }
    }
  }
}
"""
REEXECUTE = """
mutation ($parent: String!) {
  launchPipelineReexecution(reexecutionParams: {parentRunId: $parent, strategy: ALL_STEPS}) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
  }
}
"""
RUN = """
query ($id: ID!) { runOrError(runId: $id) { ... on Run { status pipelineName parentRunId tags { key } } } }
"""


@pytest.fixture
def recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """An instance in DAGSTER_HOME and a store with a queue that holds one mail; the environment of both
    the command line and the webserver."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    # Runs launch at once, as `dagster dev` (`make ui`) does with its daemon dequeuing them.
    (home / "dagster.yaml").write_text(
        "run_coordinator:\n  module: dagster._core.run_coordinator\n  class: DefaultRunCoordinator\n"
    )
    url = f"embedded://{tmp_path / 'data'}"
    with Runtime.open(url, create=True) as runtime:
        runtime.queue("spool").enqueue(
            Mail(recipients=("bob@example.org",), message=b"Subject: hi\r\n\r\nhi")
        )
    environment = {
        "DAGSTER_HOME": str(home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "MAILQ_SPARK_CONF": "spark.master=local[2]",
    }
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    # The webserver's code location opens another store: the run's config names the one it acts on.
    return {**os.environ, **environment, "MAILQ_URL": f"embedded://{tmp_path / 'other'}", "url": url}


def test_a_command_line_run_is_a_run_of_the_job_that_the_webserver_reexecutes(
    tmp_path: Path, recorded: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    url = recorded.pop("url")
    assert main(["--url", url, "--json", "queue", "cleanup"]) == 0
    report = json.loads(capsys.readouterr().out)

    (run,) = dg.DagsterInstance.get().get_runs(filters=dg.RunsFilter(job_name="queue_cleanup_job"))
    assert (run.run_id, run.is_success, report["job"]) == (report["run_id"], True, "queue_cleanup_job")
    assert "started by `mailq queue cleanup`" in [
        e.message for e in dg.DagsterInstance.get().all_logs(run.run_id)
    ]
    assert report["assets"]["mail_queue_slices"]["per_queue"][0]["queue"] == "spool"
    assert main(["--url", url, "gc"]) == 0

    with webserver(tmp_path, recorded) as base:
        slices = graphql(base, MATERIALIZATIONS, {"path": ["mail_queue_slices"]})["assetOrError"]
        collected = graphql(base, MATERIALIZATIONS, {"path": ["collected_blobs"]})["assetOrError"]
        launched = graphql(base, REEXECUTE, {"parent": run.run_id})["launchPipelineReexecution"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        child = launched["run"]["runId"]
        deadline = time.monotonic() + RUN_S
        while (status := graphql(base, RUN, {"id": child})["runOrError"])["status"] not in {
            "SUCCESS",
            "FAILURE",
        }:
            assert time.monotonic() < deadline, f"the re-execution is still {status['status']}"
            time.sleep(2)

    (materialization,) = slices["assetMaterializations"]
    assert materialization["runId"] == run.run_id
    tables = {e["label"]: e["table"] for e in materialization["metadataEntries"] if "table" in e}
    per_queue = tables["per_queue"]
    assert [c["name"] for c in per_queue["schema"]["columns"]] == [
        "queue",
        "slices",
        "enqueued",
        "live",
        "browse_start",
        "content_start",
    ]
    assert all(c["description"] for c in per_queue["schema"]["columns"])
    types = {c["name"]: c["type"] for c in per_queue["schema"]["columns"]}
    assert (types["live"], types["browse_start"], types["content_start"]) == ("int", "datetime", "datetime")
    (record,) = [json.loads(r) for r in per_queue["records"]]
    assert (record["queue"], record["enqueued"], record["live"]) == ("spool", 1, 1)
    assert record["browse_start"].endswith(" UTC") and record["browse_start"][:2] == "20"
    # A re-execution from the UI was not started by the command.
    assert all(tag["key"].startswith("dagster/") for tag in status.pop("tags")), status
    assert status == {
        "status": "SUCCESS",
        "pipelineName": "queue_cleanup_job",
        "parentRunId": run.run_id,
    }
    # Figures as Dagster types, which the UI plots across materialisations: a time as a timestamp, sizes
    # and counts as integers in bytes and blobs, no second copy of a size as text.
    (gc,) = collected["assetMaterializations"]
    kinds = {e["label"]: e["__typename"] for e in gc["metadataEntries"]}
    assert kinds["examined_through"] == "TimestampMetadataEntry"
    assert (
        kinds["bytes_reclaimed"] == kinds["deleted_blobs"] == kinds["concerned_blobs"] == "IntMetadataEntry"
    )
    assert not [label for label in kinds if label.startswith("size")]
    assert (
        dg.DagsterInstance.get().get_run_by_id(child).run_config["resources"]["mailq"]["config"]["url"] == url
    )
