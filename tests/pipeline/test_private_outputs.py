"""The pipeline's outputs are mail data too: under the usual umask 022, a GC run leaves the data dir, the
store's files and every Parquet directory and file private to their owner (0700 / 0600)."""

from __future__ import annotations

import os
import stat

from assets import jobs
from mailq_runtime import Mail, Runtime
from resources.spark import PRIVATE_OUTPUTS, spark_config


def test_a_gc_run_under_umask_022_writes_only_private_files(runtime: Runtime, pipeline_resources) -> None:
    data_dir = runtime.settings.data_dir
    queue = runtime.queue("spool")
    queue.enqueue(Mail(recipients=("r@example.com",), message=b"Subject: x\r\n\r\nhello"))
    queue.dequeue(timeout=5).done()  # deletions for the GC to find
    runtime.generations.rotate()
    runtime.generations.rotate()
    previous = os.umask(0o022)
    try:
        result = jobs.blob_gc_job.execute_in_process(resources=pipeline_resources(data_dir))
    finally:
        os.umask(previous)
    assert result.success

    written = [data_dir, *data_dir.rglob("*")]
    assert any(path.suffix == ".parquet" for path in written)
    loose = {
        str(path.relative_to(data_dir)): f"{stat.S_IMODE(path.stat().st_mode):04o}"
        for path in written
        if stat.S_IMODE(path.stat().st_mode) != (0o700 if path.is_dir() else 0o600)
    }
    assert loose == {}


def test_the_maintenance_spark_settings_make_the_outputs_private() -> None:
    assert PRIVATE_OUTPUTS.items() <= spark_config({}).items()
