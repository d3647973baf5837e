"""Hands the assets' outputs to each other under one base path (outputs.py): a Spark DataFrame as
Parquet, so each output is data a person can inspect and a downstream asset (or a rerun of one) reads
without recomputing the upstream work; a plain value (reference_generations' generations) as JSON."""

import json
import os

import dagster as dg
import pyarrow.fs as pafs
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
            _write_private(self.outputs, path + ".json", json.dumps(obj).encode())
        context.add_output_metadata({"path": dg.MetadataValue.path(path)})

    def load_input(self, context: dg.InputContext) -> DataFrame | dict:
        path = self._path(context)
        if context.dagster_type.typing_type is dict:
            fs, where = self.outputs.filesystem(path + ".json")
            with fs.open_input_stream(where) as stream:
                return json.loads(stream.read())
        return self.pyspark.spark_session.read.parquet(path)


def _write_private(outputs: Outputs, path: str, data: bytes) -> None:
    """Private to its owner whatever the umask, as Spark's outputs are (resources/spark.py); object storage
    has no modes."""
    fs, where = outputs.filesystem(path)
    if not isinstance(fs, pafs.LocalFileSystem):
        with fs.open_output_stream(where) as stream:
            stream.write(data)
        return
    os.makedirs(os.path.dirname(where), mode=0o700, exist_ok=True)
    with os.fdopen(os.open(where, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as output:
        output.write(data)
