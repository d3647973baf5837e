"""Spark for the maintenance assets: `local[*]` by default; MAILQ_SPARK_MASTER and MAILQ_SPARK_CONF
(`key=value,key=value`) point the same code at a cluster. Outputs in an object store add s3a's settings
(s3a.py)."""

import os
import sys
from pathlib import Path

from dagster_pyspark import LazyPySparkResource

from .outputs import Outputs

_LOG4J = Path(__file__).with_name("log4j2.properties").resolve()
# The Parquet outputs hold mail metadata: private to their owner (0700 directories, 0600 files) whatever
# the process umask, as the store is. Hadoop applies this umask to every file and directory it creates,
# on the local file system too, where changing the umask of the process (and its JVM) would not be ours.
PRIVATE_OUTPUTS = {"spark.hadoop.fs.permissions.umask-mode": "077"}


def spark_config(environ: dict[str, str] | None = None, outputs: Outputs | None = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    config = {
        "spark.master": environ.get("MAILQ_SPARK_MASTER", "local[*]"),
        "spark.app.name": "mailq-maintenance",
        "spark.ui.enabled": "false",
        # No progress bars on the console and no start-up chatter: the command line prints its report,
        # the runs' events are in Dagster.
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": f"-Dlog4j.configurationFile={_LOG4J.as_uri()}",
        "spark.sql.shuffle.partitions": "8",
        # The address the executors reach the driver at: loopback, or its host's on a cluster of machines.
        "spark.driver.host": environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
        "spark.driver.bindAddress": environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
        **PRIVATE_OUTPUTS,
    }
    for key, value in (outputs.spark_settings() if outputs is not None else {}).items():
        # Java options add up: the driver's log configuration stays beside a trust store's.
        joined = key.endswith("extraJavaOptions") and key in config
        config[key] = f"{config[key]} {value}" if joined else value
    for pair in filter(None, environ.get("MAILQ_SPARK_CONF", "").split(",")):
        key, _, value = pair.partition("=")
        config[key.strip()] = value.strip()
    return config


def spark_resource(outputs: Outputs | None = None) -> LazyPySparkResource:
    """Lazy: sensors and the assets that need no Spark never pay for starting a session."""
    # Python workers (the data source's readers included) run this interpreter, where mailq is installed.
    # PySpark reads the variable when the context starts; the spark.pyspark.python setting it ignores.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return LazyPySparkResource(spark_config=spark_config(outputs=outputs))
