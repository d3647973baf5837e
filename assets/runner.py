"""Runs the pipeline's jobs in-process on a given runtime URL: what `mailq gc`, `mailq counters recompute`,
`mailq queue cleanup` and the demo call, so the command line materialises the very assets the UI shows."""

import os
from pathlib import Path

import dagster as dg

from mailq_runtime.errors import InvalidInput
from mailq_runtime.settings import EMBEDDED, Settings
from resources import MailqRuntime, spark_resource
from resources.parquet_io import SparkParquetIOManager

from . import blobs, mailboxes, queue

ASSETS = dg.load_assets_from_modules([blobs, mailboxes, queue])
CHECKS = dg.load_asset_checks_from_modules([blobs, mailboxes, queue])
PIPELINE_DIR_VARIABLE = "MAILQ_PIPELINE_DIR"


def pipeline_dir(url: str) -> str:
    """Where the assets' Parquet outputs go: MAILQ_PIPELINE_DIR, else, for the embedded deployment,
    `<data dir>/pipeline`."""
    settings = Settings.from_url(url)  # a bad URL is refused whether or not the variable is set
    configured = os.environ.get(PIPELINE_DIR_VARIABLE)
    if configured:
        return configured
    if settings.backend != EMBEDDED:
        raise InvalidInput(
            f"set {PIPELINE_DIR_VARIABLE} to where the pipeline's outputs go: the deployment of "
            f"{settings.shown()} has no data dir of its own"
        )
    return str(Path(settings.data_dir, "pipeline").resolve())


def build_resources(url: str | dg.EnvVar, data_dir_url: str) -> dict:
    """The resources of every asset: the runtime at `url`, Spark, and the Parquet hand-over."""
    pyspark = spark_resource()
    return {
        "mailq": MailqRuntime(url=url),
        "pyspark": pyspark,
        "spark_parquet": SparkParquetIOManager(base_path=pipeline_dir(data_dir_url), pyspark=pyspark),
    }


def instance() -> dg.DagsterInstance:
    """The instance of DAGSTER_HOME when set, so runs from the command line show in the UI; else ephemeral."""
    return dg.DagsterInstance.get() if os.environ.get("DAGSTER_HOME") else dg.DagsterInstance.ephemeral()


def materialize(
    selection: dg.AssetSelection,
    url: str,
    run_config: dict | None = None,
    *,
    raise_on_error: bool = True,
    tags: dict[str, str] | None = None,
) -> dg.ExecuteInProcessResult:
    """Materialise `selection` (and run its checks) on the runtime at `url`; raises if a step fails,
    unless `raise_on_error` is False (then `result.success` says)."""
    return dg.materialize(
        [*ASSETS, *CHECKS],
        selection=selection,
        resources=build_resources(url, url),
        run_config=run_config,
        instance=instance(),
        raise_on_error=raise_on_error,
        tags=tags,
    )


def figures(result: dg.ExecuteInProcessResult, asset: str) -> dict:
    """The metadata of the asset's materialisation in this run, as plain values."""
    (event,) = result.asset_materializations_for_node(asset)
    return {key: value.value for key, value in event.metadata.items()}


def checks(result: dg.ExecuteInProcessResult) -> dict[str, bool]:
    return {e.check_name: e.passed for e in result.get_asset_check_evaluations()}


# The console logger at WARNING: the command line prints its own report, while every event of the run
# (DEBUG included) still goes to the instance, where the UI shows it.
QUIET_CONSOLE = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def summarise(result: dg.ExecuteInProcessResult) -> dict:
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
            "metadata": {key: value.value for key, value in e.metadata.items()},
        }
        for e in result.get_asset_check_evaluations()
    }
    failures = [
        {"step": e.step_key, "error": (e.step_failure_data.error.message or "").strip()}
        for e in result.get_step_failure_events()
    ]
    return {
        "run_id": result.run_id,
        "success": result.success and all(c["passed"] for c in evaluations.values()),
        "assets": assets,
        "checks": evaluations,
        "failures": failures,
    }
