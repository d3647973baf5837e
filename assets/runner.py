"""Runs the code location's jobs in-process on a given runtime URL: what `mailq gc`, `mailq counters
recompute`, `mailq queue cleanup` and the demo call, so a command-line run is a run of the very job the UI
shows, which the UI can open and re-execute.

Dagster's public `execute_job` records a run without the code location's origin, which the UI needs to
re-execute it; so this module alone creates and executes the run through `dagster._core`, and
tests/pipeline/test_definitions.py, whose webserver re-executes a command-line run, fails if those
internals change under it."""

import os
from pathlib import Path

import dagster as dg
from dagster._core.definitions.reconstruct import ReconstructableRepository
from dagster._core.definitions.repository_definition.valid_definitions import SINGLETON_REPOSITORY_NAME
from dagster._core.execution.api import execute_run
from dagster._core.execution.execution_result import ExecutionResult
from dagster._core.remote_origin import RemoteJobOrigin, RemoteRepositoryOrigin
from dagster._core.workspace.load import location_origins_from_yaml_paths

from . import definitions

ROOT = Path(__file__).resolve().parents[1]
# The workspace `make ui` serves: its code location is the one a run names, so the UI finds the run's job.
WORKSPACE = ROOT / "workspace.yaml"


def instance() -> dg.DagsterInstance:
    """The instance of DAGSTER_HOME when set, so runs from the command line show in the UI; else ephemeral."""
    return dg.DagsterInstance.get() if os.environ.get("DAGSTER_HOME") else dg.DagsterInstance.ephemeral()


def _remote_origin(job_name: str) -> RemoteJobOrigin:
    # The origin a run launched from the UI carries: the UI re-executes a run through its code location
    # and repository, which a run executed in-process would otherwise lack.
    (location,) = location_origins_from_yaml_paths([str(WORKSPACE)])
    return RemoteJobOrigin(RemoteRepositoryOrigin(location, SINGLETON_REPOSITORY_NAME), job_name)


def run_job(
    job_name: str, url: str, run_config: dict | None = None, *, command: str | None = None
) -> ExecutionResult:
    """Run the code location's job `job_name` in this process on the runtime at `url`, recorded in
    `instance()` as a run of that job (with its code location), so the UI lists it under the job and can
    re-execute it. The store is in the run's config; the job's failures are in the result, not raised.
    `command`, the mailq command that started the run, is the first line of the run's event log."""
    recon_job = ReconstructableRepository.for_module(
        definitions.__name__, "defs", working_directory=str(ROOT)
    ).get_reconstructable_job(job_name)
    job_def = definitions.defs.resolve_job_def(job_name)
    config = {**definitions.resources_config(url), **(run_config or {})}
    recorded = instance()
    run = recorded.create_run_for_job(
        job_def,
        run_config=config,
        tags=job_def.run_tags,
        remote_job_origin=_remote_origin(job_name),
        job_code_origin=recon_job.get_python_origin(),
    )
    if command is not None:
        # An event, not a tag: a re-execution from the UI copies the parent run's tags, and it was not
        # started by the command.
        recorded.report_engine_event(f"started by `mailq {command}`", run)
    return execute_run(recon_job, run, recorded)


def plain(value: dg.MetadataValue) -> object:
    """A metadata value as JSON: a table as its records, one dict per row."""
    if isinstance(value, dg.TableMetadataValue):
        return [dict(record.data) for record in value.records]
    return value.value


def figures(result: ExecutionResult, asset: str) -> dict:
    """The metadata of the asset's materialisation in this run, as plain values. By its key, not its op:
    an op of the GC jobs reports an asset of another name (mark_steps.py)."""
    (event,) = [e for e in result.get_asset_materialization_events() if e.asset_key.to_user_string() == asset]
    return {key: plain(value) for key, value in event.materialization.metadata.items()}


def checks(result: ExecutionResult) -> dict[str, bool]:
    return {e.check_name: e.passed for e in result.get_asset_check_evaluations()}


# The console logger at WARNING: the command line prints its own report, while every event of the run
# (DEBUG included) still goes to the instance, where the UI shows it.
QUIET_CONSOLE = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def summarise(result: ExecutionResult) -> dict:
    """The run as plain values: its id, success, every materialisation's figures, every check's result
    and metadata, and the failed steps with their error."""
    assets = {}
    for event in result.get_asset_materialization_events():
        name = event.asset_key.to_user_string()
        assets[name] = figures(result, name)
    evaluations = {
        e.check_name: {
            "asset": e.asset_key.to_user_string(),
            "passed": e.passed,
            "severity": e.severity.value,
            "metadata": {key: plain(value) for key, value in e.metadata.items()},
        }
        for e in result.get_asset_check_evaluations()
    }
    failures = [
        {"step": e.step_key, "error": (e.step_failure_data.error.message or "").strip()}
        for e in result.get_step_failure_events()
    ]
    return {
        "run_id": result.run_id,
        # A check of severity WARN that fails (dead letters that grew) is news, not a failed run.
        "success": result.success
        and all(c["passed"] or c["severity"] == "WARN" for c in evaluations.values()),
        "assets": assets,
        "checks": evaluations,
        "failures": failures,
    }
