"""Spark for the maintenance assets: `local[*]` by default; MAILQ_SPARK_MASTER and MAILQ_SPARK_CONF
(`key=value,key=value`) point the same code at a cluster, whose executors get mailq's code from the
driver (`code_zip`). Outputs in an object store add s3a's settings (s3a.py)."""

import hashlib
import os
import sys
import tempfile
import zipfile
from pathlib import Path

from dagster_pyspark import LazyPySparkResource

from .cache import CACHE_DIR
from .outputs import Outputs

_LOG4J = Path(__file__).with_name("log4j2.properties").resolve()
_ROOT = Path(__file__).resolve().parents[1]
# What an executor imports of mailq: the runtime (the tables' readers, the blob store) and the assets'
# Spark functions; pure Python, beside the packages every worker has installed (pyspark, pyarrow, the
# drivers of the stores).
CODE_PACKAGES = ("mailq_runtime", "assets", "resources")
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
    if not config["spark.master"].startswith("local"):
        # Spark hands the zip to each executor, whose Python workers import from it first.
        config["spark.submit.pyFiles"] = str(code_zip())
    for pair in filter(None, environ.get("MAILQ_SPARK_CONF", "").split(",")):
        key, _, value = pair.partition("=")
        config[key.strip()] = value.strip()
    return config


def code_zip() -> Path:
    """mailq's own packages (CODE_PACKAGES) in one zip, so that a cluster's executors run the driver's
    code from no disk they share with it. Named by a digest of what it holds: a changed tree makes a new
    one, an unchanged one is made once."""
    # Their data too (the embedded store's schema.sql), which the code reads through importlib.resources.
    files = sorted(
        path
        for package in CODE_PACKAGES
        for path in (_ROOT / package).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    )
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(_ROOT)).encode() + b"\0" + path.read_bytes())
    target = CACHE_DIR / f"mailq-code-{digest.hexdigest()[:16]}.zip"
    if not target.exists():
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        # Written aside, then renamed: a process that finds the name finds the whole zip.
        with tempfile.NamedTemporaryFile(dir=CACHE_DIR, suffix=".zip", delete=False) as written:
            with zipfile.ZipFile(written, "w", zipfile.ZIP_DEFLATED) as archive:
                for path in files:
                    archive.write(path, path.relative_to(_ROOT))
        os.replace(written.name, target)
    return target


def spark_resource(outputs: Outputs | None = None) -> LazyPySparkResource:
    """Lazy: sensors and the assets that need no Spark never pay for starting a session."""
    # Python workers (the data source's readers included) run this interpreter, where mailq is installed.
    # PySpark reads the variable when the context starts; the spark.pyspark.python setting it ignores.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return LazyPySparkResource(spark_config=spark_config(outputs=outputs))
