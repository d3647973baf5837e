"""What the GC's destructive steps did, reported on asset specs.

The GC (collected_blobs), its dry run (gc_plan), the application of a plan (applied_gc_plan) and the orphan
sweep (orphan_blobs) are ops of their jobs (jobs.py), not assets: an asset is selected by the UI's
"Materialize all", and these delete blobs or write plans. Each is an `AssetSpec` (an external asset: in
Lineage and the Catalog, which never materialise it) that its op reports a materialisation of, with the
figures it always had, and the evaluations of its checks, blocking as the assets' were: a failed one
fails the op's step, and so the run.
"""

from collections.abc import Sequence

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import functions as F

from resources import MailqRuntime
from resources.parquet_io import STORED_AS, SparkParquetIOManager

from . import gc_records
from .gc_mark import no_live_blob_among

# What starts a step that no sensor or schedule starts.
BY_AN_OPERATOR = "none: an operator launches its job"


def spec(
    name: str, deps: Sequence, group: str, job: str, description: str, *, started_by: str = BY_AN_OPERATOR
) -> dg.AssetSpec:
    """The asset spec of a step that only its job runs; the Catalog's description says which job and what
    starts it (`started_by`: a sensor, or BY_AN_OPERATOR). Dagster links a sensor to the assets of the
    asset jobs it requests, not to an op-based job's, so the asset's page names it in its definition's
    metadata (`automation`) instead of under Automation details."""
    return dg.AssetSpec(
        name,
        deps=deps,
        group_name=group,
        kinds={"spark"},
        description=f"{description}\n\nRun by {job} (Jobs, then Launchpad): Materialize never selects it. "
        f"Automation: {started_by}.",
        metadata={"job": job, "automation": started_by},
    )


def stored(asset: str) -> dg.Out:
    """An op's output stored where the asset `asset`'s goes (resources/parquet_io.py)."""
    return dg.Out(io_manager_key="spark_parquet", metadata={STORED_AS: asset})


def materialization(asset: dg.AssetSpec | dg.AssetsDefinition, output: dg.Output) -> dg.AssetMaterialization:
    """The materialisation of `asset` with the figures of an op's `output`."""
    return dg.AssetMaterialization(asset_key=asset.key, metadata=output.metadata)


def evaluation(asset: dg.AssetSpec, check: str, result: dg.AssetCheckResult) -> dg.AssetCheckEvaluation:
    """The evaluation of `asset`'s check, blocking: a failed one fails the step that yields it."""
    return dg.AssetCheckEvaluation(
        asset_key=asset.key, check_name=check, passed=result.passed, metadata=result.metadata, blocking=True
    )


def no_live_blob_in_latest_record(
    context: dg.AssetCheckExecutionContext,
    asset: dg.AssetSpec,
    mailq: MailqRuntime,
    pyspark: LazyPySparkResource,
    spark_parquet: SparkParquetIOManager,
) -> dg.AssetCheckResult:
    """No blob that `asset`'s latest run deleted has a reference: the blobs its record lists as deleted
    (none when the run examined nothing and wrote no record). The check as the UI runs it by itself; the
    run's own evaluation is its op's."""
    event = context.instance.get_latest_materialization_event(asset.key)
    metadata = event.asset_materialization.metadata if event and event.asset_materialization else {}
    deleted = pyspark.spark_session.createDataFrame([], "blob_id string, generation long")
    if "record_id" in metadata:
        record = pyspark.spark_session.read.schema(gc_records.RUN_SCHEMA).parquet(
            gc_records.path(spark_parquet.outputs, gc_records.RUNS, metadata["record_id"].value)
        )
        deleted = record.where(F.col("outcome") == gc_records.DELETED)
    return no_live_blob_among(deleted, mailq.settings)
