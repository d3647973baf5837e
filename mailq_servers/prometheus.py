"""A Prometheus server (Debian's `prometheus` package) that scrapes every second the targets a test names,
for the tests that check mailq's metrics with PromQL through its HTTP API.

The targets come by file-based discovery: `PrometheusServer.scraping` writes one file per target into
the server's targets directory and removes it afterwards, so one running server serves every test
session on the machine, each target labelled with its own `run`."""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import LOOPBACK, Place, Proc, Server, ServerError, fresh_log, spawn, wait_for
from .system_packages import missing_program

SCRAPE_INTERVAL = "1s"
CONFIG = """\
global:
  scrape_interval: {interval}
  evaluation_interval: {interval}
scrape_configs:
  - job_name: mailq
    file_sd_configs:
      - files: ["{targets}/*.json"]
        refresh_interval: {interval}
"""


@dataclass(frozen=True)
class PrometheusServer:
    """How to reach the server: its HTTP API at `url`, the directory its targets are discovered in."""

    url: str
    targets: str

    @contextmanager
    def scraping(self, address: str, run: str) -> Iterator[None]:
        """Scrape http://`address`/metrics while inside, its series labelled `run`."""
        path = Path(self.targets) / f"{run}-{address.replace(':', '_')}.json"
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps([{"targets": [address], "labels": {"run": run}}]))
        temporary.replace(path)  # whole, or the discovery may read half a file
        try:
            yield
        finally:
            path.unlink(missing_ok=True)

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector of `promql` now: each element's `metric` (labels) and `value` [time, text]."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as response:
            answer = json.load(response)
        if answer.get("status") != "success" or answer["data"]["resultType"] != "vector":
            raise ServerError(f"prometheus: query {promql!r} answered {answer}")
        return answer["data"]["result"]

    def value(self, promql: str) -> float | None:
        """The single value of `promql`, or None while it has no sample."""
        result = self.query(promql)
        if len(result) > 1:
            raise ServerError(f"prometheus: {promql!r} has {len(result)} series, not one")
        return float(result[0]["value"][1]) if result else None

    def await_value(self, promql: str, expected: float, timeout: float = 30.0) -> float | None:
        """The value of `promql` once it is `expected`, or the last one seen after `timeout` seconds (the
        target is scraped every second, and discovered within a few)."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.value(promql)
            if value == expected or time.monotonic() > deadline:
                return value
            time.sleep(0.5)


class Prometheus(Server):
    name = "prometheus"
    port_settings = {"http": ("MAILQ_PROMETHEUS_PORT", 19090)}

    def __init__(
        self, cache: Path | None = None, *, place: Place = LOOPBACK, run_dir: Path | None = None
    ) -> None:
        """On this machine's loopback by default; on a host of the bed at its place, data in run_dir."""
        super().__init__(cache, run_dir=run_dir)
        self.place = place
        self.log = self.run_dir / "prometheus.log"
        self.targets = self.run_dir / "targets"

    def installed(self) -> bool:
        return shutil.which("prometheus") is not None

    def install(self) -> None:
        raise missing_program("prometheus")

    def launch(self) -> dict[str, Proc]:
        binary = shutil.which("prometheus")
        if binary is None:
            raise ServerError("prometheus: not on PATH after its installation")
        self.targets.mkdir(parents=True, exist_ok=True)
        config = self.run_dir / "prometheus.yml"
        config.write_text(CONFIG.format(interval=SCRAPE_INTERVAL, targets=self.targets))
        argv = [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={self.run_dir / 'data'}",
            # The tests read what they just did: a day of samples is plenty.
            "--storage.tsdb.retention.time=1d",
            f"--web.listen-address={self.place.address}:{self.ports()['http']}",
        ]
        return {"server": spawn(self.place.command(argv), env={}, log=fresh_log(self.log), cwd=self.run_dir)}

    def wait_ready(self, procs: dict[str, Proc]) -> None:
        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"{self._url()}/-/ready", timeout=2) as response:
                    return response.status == 200
            except (urllib.error.URLError, OSError):
                return False

        wait_for("prometheus", ready, alive=procs["server"].alive, logs=[self.log])

    def facts(self) -> dict[str, Any]:
        return {"url": self._url(), "targets": str(self.targets)}

    def _url(self) -> str:
        return f"http://{self.place.address}:{self.ports()['http']}"
