"""A Spark standalone cluster on loopback, a master and two workers of one core each, run by the pip
pyspark's own `spark-class` (its package directory is a SPARK_HOME). Executors run their Python workers
with this harness's interpreter, the project's venv, where mailq and pyarrow are installed."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from .base import HOST, Proc, Server, ServerError, fresh_log, spawn, wait_for

WORKERS = 2
WORKER_CORES = 1
WORKER_MEMORY = "2g"


@dataclass(frozen=True)
class SparkCluster:
    """How to use the cluster: a driver on this machine with `conf()`, and PYSPARK_PYTHON set to `python`
    before its session starts (PySpark takes its workers' interpreter from that variable only)."""

    master_url: str
    web_ui_url: str
    workers: int
    cores: int
    python: str

    def conf(self) -> dict[str, str]:
        """The settings a client-mode driver on this machine needs for this cluster."""
        return {
            "spark.master": self.master_url,
            "spark.driver.host": HOST,
            "spark.driver.bindAddress": HOST,
        }

    def env(self) -> dict[str, str]:
        return {"MAILQ_SPARK_MASTER": self.master_url, "SPARK_LOCAL_IP": HOST, "PYSPARK_PYTHON": self.python}


class SparkStandalone(Server):
    name = "spark"
    port_settings = {"master": ("MAILQ_SPARK_PORT", 7077), "webui": ("MAILQ_SPARK_WEBUI_PORT", 18090)}
    main_process = "master"

    def __init__(self, cache: Path | None = None) -> None:
        super().__init__(cache)
        self.logs = self.run_dir / "logs"

    def installed(self) -> bool:
        return _spark_home() is not None

    def install(self) -> None:
        raise ServerError(
            f"pyspark is not installed for {sys.executable}: run the harness with the project's venv "
            "(`make setup`, then `.venv/bin/python -m mailq_servers up`)"
        )

    def launch(self) -> dict[str, Proc]:
        ports = self.ports()
        spark_class = str(_spark_home() / "bin" / "spark-class")
        env = self._env()
        master_log = fresh_log(self.logs / "master.log")
        master = spawn(
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                HOST,
                "--port",
                str(ports["master"]),
                "--webui-port",
                str(ports["webui"]),
            ],
            env=env,
            log=master_log,
            cwd=self.run_dir,
        )
        procs = {"master": master}
        try:
            # Workers started before the master listens wait 5-15 s for their next registration attempt.
            wait_for(
                "spark master",
                lambda: master.owns_listener(ports["master"]),
                alive=master.alive,
                logs=[master_log],
            )
            for number in range(1, WORKERS + 1):
                work_dir = self.run_dir / f"worker-{number}"
                work_dir.mkdir(parents=True, exist_ok=True)
                procs[f"worker-{number}"] = spawn(
                    [
                        spark_class,
                        "org.apache.spark.deploy.worker.Worker",
                        "--host",
                        HOST,
                        "--cores",
                        str(WORKER_CORES),
                        "--memory",
                        WORKER_MEMORY,
                        "--work-dir",
                        str(work_dir),
                        # Any free port for the workers' own pages: only the master's is looked up.
                        "--webui-port",
                        "0",
                        self._master_url(),
                    ],
                    env=env,
                    log=fresh_log(self.logs / f"worker-{number}.log"),
                    cwd=self.run_dir,
                )
        except BaseException:
            self.shut_down(procs)
            raise
        return procs

    def wait_ready(self, procs: dict[str, Proc]) -> None:
        ports = self.ports()
        master = procs["master"]
        logs = [self.logs / f"{role}.log" for role in procs]

        def all_workers_alive() -> bool:
            return master.owns_listener(ports["webui"]) and self._alive_workers(ports["webui"]) == WORKERS

        wait_for(
            "spark",
            all_workers_alive,
            alive=lambda: all(proc.alive() for proc in procs.values()),
            logs=logs,
        )

    def facts(self) -> dict:
        return asdict(
            SparkCluster(
                master_url=self._master_url(),
                web_ui_url=self._web_ui_url(),
                workers=WORKERS,
                cores=WORKERS * WORKER_CORES,
                python=self._python(),
            )
        )

    def serving(self, running) -> bool:
        # The workers listen on ports of their choosing; alive is enough for them, and the master must
        # still count them (a worker that lost its master is alive but serves nothing).
        alive_workers = self._alive_workers(running.ports["webui"])
        return super().serving(running) and alive_workers == len(running.procs) - 1

    def _alive_workers(self, webui_port: int) -> int:
        try:
            with urllib.request.urlopen(f"http://{HOST}:{webui_port}/json/", timeout=5) as answer:
                return int(json.load(answer).get("aliveworkers", 0))
        except (OSError, ValueError):
            return 0

    def _master_url(self) -> str:
        return f"spark://{HOST}:{self.ports()['master']}"

    def _web_ui_url(self) -> str:
        return f"http://{HOST}:{self.ports()['webui']}"

    def _python(self) -> str:
        return os.environ.get("PYSPARK_PYTHON") or sys.executable

    def _env(self) -> dict[str, str]:
        conf_dir = self.run_dir / "conf"
        conf_dir.mkdir(parents=True, exist_ok=True)
        # The executors inherit the workers' environment, where an operator's spark-env.sh puts the
        # credentials of the stores: here the harness's S3 endpoint's, started first if need be (Cassandra
        # needs none). Nothing secret goes through a Spark setting or a mailq URL.
        from . import ensure

        return {
            **os.environ,
            **ensure("s3").env(),
            "SPARK_HOME": str(_spark_home()),
            "SPARK_CONF_DIR": str(conf_dir),
            # Without it a worker advertises the machine's non-loopback address.
            "SPARK_LOCAL_IP": HOST,
            "SPARK_LOCAL_DIRS": str(self.run_dir / "tmp"),
            "PYSPARK_PYTHON": self._python(),
            # The master and the workers only schedule: small heaps, and the C1 compiler only (on 2 cores
            # C2 compilations compete with the work).
            "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_DAEMON_JAVA_OPTS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
            # No REST submission server (it would hold port 6066): clients run in client mode.
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            # Finished applications' directories are removed after an hour, so long-lived workers do not
            # fill the cache.
            "SPARK_WORKER_OPTS": (
                "-Dspark.worker.cleanup.enabled=true -Dspark.worker.cleanup.interval=600 "
                "-Dspark.worker.cleanup.appDataTtl=3600"
            ),
        }


def _spark_home() -> Path | None:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent
