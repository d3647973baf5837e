"""A Spark standalone cluster on loopback, a master and two workers of one core each, run by the pip
pyspark's own `spark-class` (its package directory is a SPARK_HOME). Executors run their Python workers
with this harness's interpreter, the project's venv, where mailq and pyarrow are installed. The host bed
(host_bed.py) runs the same class with its master and a worker on each server host."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .base import HOST, LOOPBACK, Place, Proc, Server, ServerError, fresh_log, spawn, wait_for

if TYPE_CHECKING:
    from .s3 import S3Server

WORKERS = 2
WORKER_CORES = 1
WORKER_MEMORY = "2g"


@dataclass(frozen=True)
class SparkCluster:
    """How to use the cluster: a driver at `driver_host` (this machine's loopback, or the bed's driver
    host) with `conf()`, and PYSPARK_PYTHON set to `python` before its session starts (PySpark takes its
    workers' interpreter from that variable only)."""

    master_url: str
    web_ui_url: str
    workers: int
    cores: int
    python: str
    driver_host: str = HOST

    def conf(self) -> dict[str, str]:
        """The settings a client-mode driver at `driver_host` needs for this cluster."""
        return {
            "spark.master": self.master_url,
            "spark.driver.host": self.driver_host,
            "spark.driver.bindAddress": self.driver_host,
        }

    def env(self) -> dict[str, str]:
        return {
            "MAILQ_SPARK_MASTER": self.master_url,
            "SPARK_LOCAL_IP": self.driver_host,
            "PYSPARK_PYTHON": self.python,
        }


class SparkStandalone(Server):
    name = "spark"
    port_settings = {"master": ("MAILQ_SPARK_PORT", 7077), "webui": ("MAILQ_SPARK_WEBUI_PORT", 18090)}
    main_process = "master"

    def __init__(
        self,
        cache: Path | None = None,
        *,
        run_dir: Path | None = None,
        master: Place = LOOPBACK,
        workers: Sequence[tuple[Place, Path]] | None = None,
        ports: dict[str, int] | None = None,
        s3: S3Server | None = None,
        driver_host: str = HOST,
    ) -> None:
        """The loopback cluster by default; a bed's gives the master's place, each worker's place and
        directory, the ports, the S3 endpoint whose keys the executors get and the driver's address."""
        super().__init__(cache, run_dir=run_dir)
        self.logs = self.run_dir / "logs"
        self.master = master
        self.workers = list(
            workers or ((LOOPBACK, self.run_dir / f"worker-{n}") for n in range(1, WORKERS + 1))
        )
        self._ports = ports
        self._s3 = s3
        self.driver_host = driver_host

    def ports(self) -> dict[str, int]:
        return dict(self._ports) if self._ports is not None else super().ports()

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
        master_log = fresh_log(self.logs / "master.log")
        master = spawn(
            self.master.command(
                [
                    spark_class,
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    self.master.address,
                    "--port",
                    str(ports["master"]),
                    "--webui-port",
                    str(ports["webui"]),
                ]
            ),
            env=self._env(self.master.address, self.run_dir / "tmp"),
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
            for number, (place, work_dir) in enumerate(self.workers, 1):
                work_dir.mkdir(parents=True, exist_ok=True)
                procs[f"worker-{number}"] = spawn(
                    place.command(
                        [
                            spark_class,
                            "org.apache.spark.deploy.worker.Worker",
                            "--host",
                            place.address,
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
                        ]
                    ),
                    env=self._env(place.address, work_dir / "tmp"),
                    log=fresh_log(self._worker_log(number)),
                    cwd=work_dir,
                )
        except BaseException:
            self.shut_down(procs)
            raise
        return procs

    def wait_ready(self, procs: dict[str, Proc]) -> None:
        ports = self.ports()
        master = procs["master"]
        logs = [self.logs / "master.log", *(self._worker_log(n) for n in range(1, len(self.workers) + 1))]

        def all_workers_alive() -> bool:
            return master.owns_listener(ports["webui"]) and self._alive_workers(ports["webui"]) == len(
                self.workers
            )

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
                workers=len(self.workers),
                cores=len(self.workers) * WORKER_CORES,
                python=self._python(),
                driver_host=self.driver_host,
            )
        )

    def serving(self, running) -> bool:
        # The workers listen on ports of their choosing; alive is enough for them, and the master must
        # still count them (a worker that lost its master is alive but serves nothing).
        alive_workers = self._alive_workers(running.ports["webui"])
        return super().serving(running) and alive_workers == len(running.procs) - 1

    def _alive_workers(self, webui_port: int) -> int:
        try:
            with urllib.request.urlopen(
                f"http://{self.master.address}:{webui_port}/json/", timeout=5
            ) as answer:
                return int(json.load(answer).get("aliveworkers", 0))
        except (OSError, ValueError):
            return 0

    def _master_url(self) -> str:
        return f"spark://{self.master.address}:{self.ports()['master']}"

    def _web_ui_url(self) -> str:
        return f"http://{self.master.address}:{self.ports()['webui']}"

    def _worker_log(self, number: int) -> Path:
        """In the worker's own directory: on the bed, its host's."""
        return self.workers[number - 1][1] / "worker.log"

    def _python(self) -> str:
        return os.environ.get("PYSPARK_PYTHON") or sys.executable

    def _env(self, address: str, local_dirs: Path) -> dict[str, str]:
        conf_dir = self.run_dir / "conf"
        conf_dir.mkdir(parents=True, exist_ok=True)
        # The executors inherit the workers' environment, where an operator's spark-env.sh puts the
        # credentials of the stores: here the harness's S3 endpoint's, started first if need be (Cassandra
        # needs none). Nothing secret goes through a Spark setting or a mailq URL.
        from . import ensure

        s3 = self._s3 or ensure("s3")
        return {
            **os.environ,
            **s3.env(),
            **s3.keys_env(),
            "SPARK_HOME": str(_spark_home()),
            "SPARK_CONF_DIR": str(conf_dir),
            # Without it a worker advertises the machine's non-loopback address.
            "SPARK_LOCAL_IP": address,
            "SPARK_LOCAL_DIRS": str(local_dirs),
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
