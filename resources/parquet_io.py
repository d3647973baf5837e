"""Hands Spark DataFrames between assets as Parquet, so each asset's output is data a person can inspect
and a downstream asset (or a rerun of one) reads without recomputing the upstream work."""

import os
from pathlib import Path

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import DataFrame


class SparkParquetIOManager(dg.ConfigurableIOManager):
    base_path: str = os.path.abspath(".mailq/pipeline")
    pyspark: dg.ResourceDependency[LazyPySparkResource]

    def _path(self, context: dg.OutputContext | dg.InputContext) -> str:
        return str(Path(self.base_path, *context.asset_key.path))

    def handle_output(self, context: dg.OutputContext, obj: DataFrame) -> None:
        path = self._path(context)
        obj.write.mode("overwrite").parquet(path)
        context.add_output_metadata({"path": dg.MetadataValue.path(path)})

    def load_input(self, context: dg.InputContext) -> DataFrame:
        return self.pyspark.spark_session.read.parquet(self._path(context))
