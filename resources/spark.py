"""Spark for the maintenance assets: `local[*]` by default; MAILQ_SPARK_MASTER and MAILQ_SPARK_CONF
(`key=value,key=value`) point the same code at a cluster."""

from __future__ import annotations

import os
import sys

from dagster_pyspark import LazyPySparkResource


def spark_config(environ: dict[str, str] | None = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    config = {
        "spark.master": environ.get("MAILQ_SPARK_MASTER", "local[*]"),
        "spark.app.name": "mailq-maintenance",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "8",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        # Executors run the data source's Python code: use this interpreter, where mailq is installed.
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
    }
    for pair in filter(None, environ.get("MAILQ_SPARK_CONF", "").split(",")):
        key, _, value = pair.partition("=")
        config[key.strip()] = value.strip()
    return config


def spark_resource() -> LazyPySparkResource:
    """Lazy: sensors and the assets that need no Spark never pay for starting a session."""
    return LazyPySparkResource(spark_config=spark_config())
