"""How the pipeline's commands run the code location's jobs: on the URL's store, made absolute and checked
before Dagster and Spark start, recorded in DAGSTER_HOME's instance when it is set (`assets.runner`), and
summarised as plain figures (`runner.summarise`). Dagster's console log is kept at WARNING; the run's events
all go to the instance, so the UI shows the runs."""

import os
import time

from assets import definitions, runner
from mailq_runtime.deployments import build
from mailq_runtime.errors import InvalidInput, shown
from mailq_runtime.settings import Settings

EXIT_RUN_FAILED = 1


def pipeline_settings(url: str | None) -> Settings:
    """The settings the Spark jobs read: the URL's, with the data dir made absolute. The store must exist:
    maintenance of a place that holds none is a mistake (NoStore), not an empty run."""
    settings = Settings.from_url(url).absolute()  # a bad URL is bad input before anything runs
    # Opened once here, writing nothing, so a missing or unusable store is one line before Dagster and
    # Spark start.
    build(settings).close()
    return settings


def check_dagster_home() -> None:
    """Runs are recorded in DAGSTER_HOME's instance when it is set: it must then be an existing directory."""
    home = os.environ.get("DAGSTER_HOME")
    if home and not (os.path.isabs(os.path.expanduser(home)) and os.path.isdir(os.path.expanduser(home))):
        raise InvalidInput(
            f"DAGSTER_HOME {shown(home)} is not an existing directory given by its absolute path"
        )


def run_pipeline(job: str, settings: Settings, command: str, run_config: dict | None = None) -> dict:
    """Run the code location's job named `job` on the store of `settings` and return `runner.summarise`'s
    figures, with the job's name, the run's duration and where it was recorded."""
    check_dagster_home()
    # A place of the outputs that cannot be written is one line too, before Spark starts.
    definitions.outputs(settings).check_writable()
    started = time.monotonic()
    result = runner.run_job(
        job, settings.url, {**runner.QUIET_CONSOLE, **(run_config or {})}, command=command
    )
    summary = {"job": job, **runner.summarise(result)}
    summary["seconds"] = round(time.monotonic() - started, 1)
    summary["instance"] = os.environ.get("DAGSTER_HOME") or None
    return summary
