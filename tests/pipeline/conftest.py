"""Shared by the Spark tests: one local[2] session for the whole run, and empty embedded stores."""

from __future__ import annotations

import os
import sqlite3
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from mailq_runtime import Runtime
from mailq_runtime.stores.embedded import DATABASE_FILE
from resources.spark import PRIVATE_OUTPUTS
from tests.runtime.backends import Backend, open_backend

from .pipeline import resources_for

# The deployments a module's `backend` tests run on: the embedded store, and Cassandra + S3 (with the
# embedded broker: the pipeline never uses the broker).
DEPLOYMENTS = ("embedded", "cassandra")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend", getattr(metafunc.module, "DEPLOYMENTS", DEPLOYMENTS), indirect=True)


@pytest.fixture
def backend(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Backend]:
    with open_backend(request, tmp_path, monkeypatch) as opened:
        yield opened


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # The S3 keys its tasks need on the distributed deployment are in the environment before any test
    # (tests/servers/fixtures.py, pytest_collection_finish).
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    # Every Python worker, data source planning included, runs this interpreter (the one with pyarrow):
    # the variable is read when the session starts, the spark.pyspark.python setting is not.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("mailq-pipeline-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
    )
    for key, value in PRIVATE_OUTPUTS.items():
        builder = builder.config(key, value)
    # The JVM keeps the umask it starts with: the usual 022, under which files are readable by all
    # unless PRIVATE_OUTPUTS makes them private (test_private_outputs).
    umask = os.umask(0o022)
    try:
        session = builder.getOrCreate()
    finally:
        os.umask(umask)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@dataclass
class Store:
    data_dir: Path
    connection: sqlite3.Connection  # autocommit, kept open while Spark reads, as the runtime would

    @property
    def url(self) -> str:
        return f"embedded://{self.data_dir}"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """An embedded store with the runtime's schema and no rows."""
    connection = sqlite3.connect(tmp_path / DATABASE_FILE, isolation_level=None)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.executescript(files("mailq_runtime.stores.embedded").joinpath("schema.sql").read_text())
    yield Store(tmp_path, connection)
    connection.close()


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    """A runtime on an empty data dir, `tmp_path / "data"` (its url: `runtime.settings.data_dir`)."""
    opened = Runtime.open(f"embedded://{tmp_path / 'data'}", create=True)
    yield opened
    opened.close()


@pytest.fixture
def pipeline_resources(spark: SparkSession):
    """Dagster resources on a data dir, sharing the session's Spark (getOrCreate finds it)."""
    return lambda data_dir: resources_for(f"embedded://{data_dir}", Path(data_dir) / "pipeline")


@pytest.fixture
def deployment_resources(spark: SparkSession, backend: Backend, tmp_path: Path) -> dict:
    """Dagster resources on the backend's deployment, sharing the session's Spark."""
    return resources_for(backend.url(), tmp_path / "pipeline")
