"""The code location: every asset, check, job, sensor and schedule of mailq's maintenance pipeline, and the
resources they run with."""

import os
import warnings
from pathlib import Path

import dagster as dg

from mailq_runtime.settings import DEFAULT_URL, EMBEDDED, URL_VARIABLE, Settings
from resources import MailqRuntime, s3a, spark_resource
from resources.outputs import Outputs
from resources.parquet_io import SparkParquetIOManager
from resources.spark import spark_config

from . import automation, blobs, gc_plan, jobs, mailboxes, orphan_sweep, queue, queue_overview

# Dagster warns that SensorDefinition's `owners` is in beta each time it re-creates a sensor to bind its job's
# resources, passing on the owners that mailq never sets: a warning about nothing mailq does.
warnings.filterwarnings(
    "ignore",
    message=r"Parameter `owners` of initializer `SensorDefinition.__init__`",
    category=dg.BetaWarning,
)

# The GC's destructive steps are asset specs (reported.py), which no "Materialize all" selects: their ops
# run only in their jobs.
ASSETS = [
    *dg.load_assets_from_modules([blobs, mailboxes, queue, queue_overview]),
    blobs.COLLECTED_BLOBS,
    gc_plan.GC_PLAN,
    gc_plan.APPLIED_GC_PLAN,
    orphan_sweep.ORPHAN_BLOBS,
]
CHECKS = dg.load_asset_checks_from_modules([blobs, gc_plan, mailboxes, orphan_sweep, queue])
PIPELINE_DIR_VARIABLE = "MAILQ_PIPELINE_DIR"
PIPELINE_PREFIX = "pipeline"


def pipeline_dir(settings: Settings) -> str:
    """Where the assets' outputs go: MAILQ_PIPELINE_DIR (a directory, or an s3a:// location), else the
    embedded deployment's `<data dir>/pipeline`, else `pipeline/` in the distributed deployment's bucket
    (beside its blobs, under its key prefix: keys no blob has, which the blob store never reads), where a
    Spark cluster's driver and workers all reach it."""
    configured = os.environ.get(PIPELINE_DIR_VARIABLE)
    if configured:
        return configured
    if settings.backend == EMBEDDED:
        return str(Path(settings.data_dir, PIPELINE_PREFIX).resolve())
    assert settings.s3 is not None  # a distributed deployment keeps its content in a bucket
    return f"{s3a.SCHEME}{settings.s3.bucket}/{settings.s3.prefix}{PIPELINE_PREFIX}"


def outputs(settings: Settings) -> Outputs:
    return Outputs.of(pipeline_dir(settings), settings)


def build_resources(url: str | dg.EnvVar, data_dir_url: str) -> dict:
    """The resources of every asset: the runtime at `url`, Spark, and the Parquet hand-over. Their place
    is not checked here: a place the deployment cannot hold fails the runs that use it, while the code
    location loads."""
    settings = Settings.from_url(data_dir_url)
    place = Outputs(pipeline_dir(settings), settings.s3, settings.tls_files.ca)
    pyspark = spark_resource(place)
    return {
        "mailq": MailqRuntime(url=url),
        "pyspark": pyspark,
        "spark_parquet": SparkParquetIOManager(base_path=place.base, url=url, pyspark=pyspark),
    }


def resources_config(url: str) -> dict:
    """Run config that points a run of this code location at the runtime of `url`, whatever MAILQ_URL
    the location was loaded with: a command-line run carries its store in its config, so a re-execution
    from the UI acts on the same store, with the Spark settings its outputs' place needs (none secret)."""
    place = outputs(Settings.from_url(url))  # a bad URL is refused whether or not the variable is set
    return {
        "resources": {
            "mailq": {"config": {"url": url}},
            "pyspark": {"config": {"spark_config": spark_config(outputs=place)}},
            "spark_parquet": {"config": {"base_path": place.base, "url": url}},
        }
    }


def _runtime_url() -> str | dg.EnvVar:
    # EnvVar: the UI shows the variable's name, not its value. The URL holds no secret anyway: a mailq
    # URL never carries a password (Settings refuses one, and shows the URL redacted).
    return dg.EnvVar(URL_VARIABLE) if URL_VARIABLE in os.environ else DEFAULT_URL


defs = dg.Definitions(
    assets=ASSETS,
    asset_checks=CHECKS,
    jobs=[
        jobs.blob_gc_job,
        jobs.orphan_sweep_job,
        jobs.blob_gc_and_orphan_sweep_job,
        jobs.gc_plan_job,
        jobs.gc_plan_and_orphan_sweep_job,
        jobs.gc_apply_job,
        jobs.mailbox_counters_job,
        jobs.queue_cleanup_job,
        jobs.queue_overview_job,
        jobs.dead_letters_job,
        jobs.maintenance_job,
        jobs.rotate_generation_job,
    ],
    sensors=[
        automation.deletions_waiting_sensor,
        automation.queue_cleanup_sensor,
        automation.counter_drift_sensor,
        automation.dead_letters_sensor,
    ],
    schedules=[automation.rotate_generation_schedule],
    resources=build_resources(_runtime_url(), os.environ.get(URL_VARIABLE, DEFAULT_URL)),
    executor=dg.in_process_executor,
)
