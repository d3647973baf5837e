"""The code location: every asset, check, job, sensor and schedule of mailq's maintenance pipeline."""

import os

import dagster as dg

from mailq_runtime.settings import DEFAULT_URL, URL_VARIABLE

from . import automation, jobs
from .runner import ASSETS, CHECKS, build_resources


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
        jobs.mailbox_counters_job,
        jobs.queue_cleanup_job,
        jobs.maintenance_job,
        jobs.rotate_generation_job,
    ],
    sensors=[
        automation.deletions_waiting_sensor,
        automation.queue_cleanup_sensor,
        automation.counter_drift_sensor,
    ],
    schedules=[automation.rotate_generation_schedule],
    resources=build_resources(_runtime_url(), os.environ.get(URL_VARIABLE, DEFAULT_URL)),
    executor=dg.in_process_executor,
)
