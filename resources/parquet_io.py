"""Hands the assets' outputs to each other under one base path (outputs.py): a Spark DataFrame as
Parquet, so each output is data a person can inspect and a downstream asset (or a rerun of one) reads
without recomputing the upstream work; a plain value (reference_generations' generations) as JSON."""

import json

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import DataFrame

from mailq_runtime.settings import DEFAULT_URL, Settings

from .outputs import Outputs

STORED_AS = "stored_as"


class SparkParquetIOManager(dg.ConfigurableIOManager):
    """Outputs under `base_path`, a directory or an s3a:// location of the object store of the
    deployment at `url` (the runtime's URL: its settings say how to reach the store; nothing is opened)."""

    base_path: str
    url: str = DEFAULT_URL
    pyspark: dg.ResourceDependency[LazyPySparkResource]

    @property
    def outputs(self) -> Outputs:
        return Outputs.of(self.base_path, Settings.from_url(self.url))

    def _path(self, context: dg.OutputContext | dg.InputContext) -> str:
        if context.has_asset_key:
            return self.outputs.path(*context.asset_key.path)
        # An op of an op-based job (jobs.py) that runs an asset's computation stores its output where
        # the asset's goes: its Out names the asset (`stored_as`).
        output = context if isinstance(context, dg.OutputContext) else context.upstream_output
        return self.outputs.path(output.definition_metadata[STORED_AS])

    def handle_output(self, context: dg.OutputContext, obj: DataFrame | dict) -> None:
        path = self._path(context)
        if isinstance(obj, DataFrame):
            obj.write.mode("overwrite").parquet(path)
        else:
            # Written without Spark: an asset with no Spark work never starts a session.
            self.outputs.write(path + ".json", json.dumps(obj).encode())
        context.add_output_metadata({"path": dg.MetadataValue.path(path)})

    def load_input(self, context: dg.InputContext) -> DataFrame | dict:
        path = self._path(context)
        if context.dagster_type.typing_type is dict:
            return json.loads(self.outputs.read(path + ".json"))
        return self.pyspark.spark_session.read.parquet(path)
