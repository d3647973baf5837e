"""The code location: every asset, check, job, sensor and schedule of mailq's maintenance pipeline."""


import os

import dagster as dg

from mailq_runtime.settings import DEFAULT_URL, URL_VARIABLE
from resources import MailqRuntime, spark_resource
from resources.parquet_io import SparkParquetIOManager

from . import automation, blobs, jobs, mailboxes, queue


def _runtime_url() -> str | dg.EnvVar:
    # EnvVar keeps a URL that may carry credentials out of the UI; the default has none to hide.
    return dg.EnvVar(URL_VARIABLE) if URL_VARIABLE in os.environ else DEFAULT_URL


def _pipeline_dir() -> str:
    return os.environ.get("MAILQ_PIPELINE_DIR", os.path.abspath(".mailq/pipeline"))


pyspark = spark_resource()

defs = dg.Definitions(
    assets=dg.load_assets_from_modules([blobs, mailboxes, queue]),
    asset_checks=dg.load_asset_checks_from_modules([blobs, mailboxes, queue]),
    jobs=[
        jobs.blob_gc_job,
        jobs.orphan_sweep_job,
        jobs.mailbox_counters_job,
        jobs.queue_cleanup_job,
        jobs.maintenance_job,
        jobs.rotate_generation_job,
    ],
    sensors=[automation.deletions_waiting_sensor, automation.queue_cleanup_sensor, automation.counter_drift_sensor],
    schedules=[automation.rotate_generation_schedule],
    resources={
        "mailq": MailqRuntime(url=_runtime_url()),
        "pyspark": pyspark,
        "spark_parquet": SparkParquetIOManager(base_path=_pipeline_dir(), pyspark=pyspark),
    },
    executor=dg.in_process_executor,
)
