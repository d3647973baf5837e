"""What a newcomer meets after `make demo`, through the webserver's GraphQL (the UI's own calls) of a real
`dagster dev`, started by `make ui`'s launcher: every asset has a materialisation, the GC's plan then
apply as the Launchpad launches them (the apply of an empty plan succeeds and says so), the automation
an asset's page names, a sensor turned on and the run it starts; then the launcher stops everything
within seconds of a SIGTERM."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from mailq_cli.main import main
from mailq_demo.ui import GRACE_SECONDS
from mailq_runtime import Runtime

from .test_definitions import ROOT, SERVER_START_S, free_port, get, graphql

# A demo, the UI's start and three runs, each a process with Spark, on a loaded two-core machine.
pytestmark = [pytest.mark.alone, pytest.mark.timeout(2400)]
RUN_S = 600
TICK_S = 300  # the daemon's first tick of a sensor turned on, then its run's start
REPOSITORY = {"repositoryLocationName": "mailq", "repositoryName": "__repository__"}
ASSETS = """
{
  assetNodes {
    assetKey { path }
    metadataEntries { label ... on TextMetadataEntry { text } }
    targetingInstigators { ... on Sensor { name } ... on Schedule { name } }
    assetMaterializations(limit: 1) { runId }
  }
}
"""
LAUNCH = """
mutation ($job: String!) {
  launchRun(executionParams: {selector: {repositoryLocationName: "mailq", repositoryName: "__repository__",
                                         jobName: $job}, runConfigData: {}}) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}
"""
RUN = """
query ($id: ID!) {
  runOrError(runId: $id) {
    ... on Run {
      status
      pipelineName
      assetMaterializations { assetKey { path } metadataEntries { label ... on TextMetadataEntry { text }
                                                                  ... on IntMetadataEntry { intValue } } }
    }
  }
}
"""
START_SENSOR = """
mutation ($selector: SensorSelector!) {
  startSensor(sensorSelector: $selector) { __typename ... on Sensor { sensorState { status } } }
}
"""
TICKS = """
query ($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) {
    ... on Sensor { sensorState { ticks(limit: 10) { status runIds skipReason error { message } } } }
  }
}
"""


@contextmanager
def ui(tmp_path: Path, environment: dict[str, str]) -> Iterator[str]:
    """`make ui`'s launcher on a free port; yields the webserver's base URL, and at the end checks that a
    SIGTERM stops it and every process of dagster dev within GRACE_SECONDS and a margin."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "ui.log"
    with log.open("wb") as output:
        launcher = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mailq_demo.ui",
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
        deadline = time.monotonic() + SERVER_START_S * 2
        while True:
            assert launcher.poll() is None, f"the UI exited:\n{log.read_text()[-3000:]}"
            try:
                json.loads(get(f"{base}/server_info"))
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, f"not up:\n{log.read_text()[-3000:]}"
                time.sleep(1)
        (dagster_dev,) = [
            int(pid) for pid in Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split()
        ]
        yield base
        asked = time.monotonic()
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=GRACE_SECONDS + 30) == 0
        while group_alive(dagster_dev):
            assert time.monotonic() - asked < GRACE_SECONDS + 10, "dagster dev's processes outlived the stop"
            time.sleep(0.2)
    finally:
        for group in (launcher.pid, locals().get("dagster_dev")):
            if group is not None and group_alive(group):
                os.killpg(group, signal.SIGKILL)
        launcher.wait()


def group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def launch(base: str, job: str) -> dict:
    """The job launched as the Launchpad launches it with its default config; its run once finished."""
    launched = graphql(base, LAUNCH, {"job": job})["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    return finished(base, launched["run"]["runId"])


def finished(base: str, run_id: str) -> dict:
    deadline = time.monotonic() + RUN_S
    while (run := graphql(base, RUN, {"id": run_id})["runOrError"])["status"] not in {"SUCCESS", "FAILURE"}:
        assert time.monotonic() < deadline, f"run {run_id} still {run['status']}"
        time.sleep(2)
    return run


def figures(run: dict, asset: str) -> dict:
    (materialization,) = [m for m in run["assetMaterializations"] if m["assetKey"]["path"] == [asset]]
    return {e["label"]: e.get("text", e.get("intValue")) for e in materialization["metadataEntries"]}


def test_a_newcomer_s_walk_after_the_demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home, data = tmp_path / "dagster_home", tmp_path / "demo"
    home.mkdir()
    shutil.copy(ROOT / "mailq_demo" / "dagster.yaml", home)  # the instance `make demo` makes
    for name, value in (
        ("DAGSTER_HOME", str(home)),
        ("SPARK_LOCAL_IP", "127.0.0.1"),
        ("MAILQ_SPARK_CONF", "spark.master=local[2]"),
    ):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MAILQ_URL", raising=False)
    assert main(["demo", "--mails", "100", "--data-dir", str(data)]) == 0
    url = f"embedded://{data}"
    with Runtime.open(url) as runtime:
        drifting = runtime.mailboxes.list()[0]
        runtime.mailboxes.tables.add_to_counters(drifting.id, 1, 0)  # as a crash between writes leaves it
    environment = {**os.environ, "MAILQ_URL": url, "MAILQ_COUNTER_SAMPLE": "1000"}

    with ui(tmp_path, environment) as base:
        nodes = {"/".join(n["assetKey"]["path"]): n for n in graphql(base, ASSETS)["assetNodes"]}
        # Every asset's page has data after the demo, the overviews and the GC's plan and its application
        # too: none is "Never materialized".
        never = {name for name, node in nodes.items() if not node["assetMaterializations"]}
        assert never == set()
        # The automation that drives an asset: Dagster's own link for an asset job's sensor, the
        # definition's metadata for the GC's op-based jobs.
        assert [i["name"] for i in nodes["mailbox_counters"]["targetingInstigators"]] == [
            "counter_drift_sensor"
        ]
        assert [i["name"] for i in nodes["mail_queue_dead_letters"]["targetingInstigators"]] == [
            "dead_letters_sensor"
        ]
        automation = {e["label"]: e.get("text") for e in nodes["collected_blobs"]["metadataEntries"]}
        assert automation["automation"].startswith("deletions_waiting_sensor")

        # The GC's documented path on the demo's data, which the demo's GC collected already: the plan
        # is empty, and its application succeeds and says so.
        plan = launch(base, "gc_plan_job")
        assert plan["status"] == "SUCCESS", plan
        planned = figures(plan, "gc_plan")
        assert planned["blobs_to_delete"] == 0
        applied = launch(base, "gc_apply_job")
        assert applied["status"] == "SUCCESS", applied
        note = figures(applied, "applied_gc_plan")
        assert note["note"] == f"the newest plan, {planned['plan_id']}, holds no blob: nothing to apply"
        assert (note["deleted_blobs"], note["bytes_reclaimed"]) == (0, 0)

        # A sensor turned on starts its job by itself: the drift found, the counters recomputed.
        selector = {**REPOSITORY, "sensorName": "counter_drift_sensor"}
        started = graphql(base, START_SENSOR, {"selector": selector})["startSensor"]
        assert started["sensorState"]["status"] == "RUNNING", started
        deadline = time.monotonic() + TICK_S
        while not (runs := [r for t in ticks(base, selector) for r in t["runIds"]]):
            assert time.monotonic() < deadline, ticks(base, selector)
            time.sleep(2)
        repaired = finished(base, runs[0])
        assert (repaired["status"], repaired["pipelineName"]) == ("SUCCESS", "mailbox_counters_job")
    with Runtime.open(url) as runtime:
        assert runtime.mailboxes.counters(drifting.id) == runtime.mailboxes.recount(drifting.id)


def ticks(base: str, selector: dict) -> list[dict]:
    return graphql(base, TICKS, {"selector": selector})["sensorOrError"]["sensorState"]["ticks"]
