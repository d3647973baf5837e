"""Helpers of the pipeline tests: resources on a temporary data dir, asset runs, tables in the record's
words."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
from dagster_pyspark import LazyPySparkResource

from assets import jobs
from mailq_runtime import Runtime
from resources import MailqRuntime
from resources.parquet_io import SparkParquetIOManager
from tests.runtime.backends import EmbeddedBackend


def resources_for(url: str, outputs: Path, spark_config: dict[str, str] | None = None) -> dict:
    """The pipeline's resources on `url`, the Parquet outputs in `outputs`; Spark on local[2] unless
    `spark_config` says otherwise (a session already running is shared: getOrCreate finds it)."""
    pyspark = LazyPySparkResource(spark_config=spark_config or {"spark.master": "local[2]"})
    return {
        "mailq": MailqRuntime(url=url),
        "pyspark": pyspark,
        "spark_parquet": SparkParquetIOManager(base_path=str(outputs), url=url, pyspark=pyspark),
    }


def materialized(result: dg.ExecuteInProcessResult, asset: str) -> dict:
    """The metadata of the asset's materialization, as plain values (by its key: the GC jobs' ops report
    assets of other names)."""
    (event,) = [e for e in result.get_asset_materialization_events() if e.asset_key == dg.AssetKey(asset)]
    return {key: value.value for key, value in event.materialization.metadata.items()}


def checks_passed(result: dg.ExecuteInProcessResult) -> dict[str, bool]:
    return {e.check_name: e.passed for e in result.get_asset_check_evaluations()}


def gc_run_config(filter_config: dict | None, collect_config: dict) -> dict | None:
    ops = {
        name: {"config": config}
        for name, config in (
            ("build_live_reference_filter", filter_config),
            ("collected_blobs", collect_config),
        )
        if config
    }
    return {"ops": ops} if ops else None


def run_gc(resources: dict, filter_config: dict | None = None, **collect_config: object) -> dict:
    """One GC iteration; returns the figures of `collected_blobs`, after its check passed."""
    run_config = gc_run_config(filter_config, collect_config)
    result = jobs.blob_gc_job.execute_in_process(resources=resources, run_config=run_config)
    assert result.success
    assert checks_passed(result) == {"no_live_blob_collected": True}
    return materialized(result, "collected_blobs")


def blob_tables(runtime: Runtime, labels: dict[str, str]) -> dict[str, list]:
    """`blobs`, `blob_references` and `blob_deletions` in the record's words (b1.., rgN, gciN)."""
    state = EmbeddedBackend(runtime.settings.data_dir).blob_state()
    return {
        "blobs": sorted((labels[b], f"rg{g}") for b, g in state.blobs.items()),
        "references": sorted((owner, labels[b], f"rg{g}") for owner, b, g in state.references),
        "deletions": sorted((labels[b], f"rg{g}", f"gci{i}") for b, g, i in state.deletions),
    }
