"""Prometheus on the metrics host scrapes `mailq smtp` on the smtp host and `mailq worker` on worker1
across the bed's network, and counts the work they did."""

from __future__ import annotations

import secrets
import smtplib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from mailq_servers import ServerError
from mailq_servers.host_bed import HostBed
from mailq_servers.prometheus import Prometheus, PrometheusServer
from tests.smtp.helpers import SmtpProcess

from .conftest import mailq_on, run_on

LOCAL = "example.org"
USER = f"alice@{LOCAL}"
MAILS = 4


@pytest.fixture(scope="module")
def bed_prometheus(host_bed: HostBed) -> Iterator[PrometheusServer]:
    metrics = host_bed.host("metrics")
    server = Prometheus(place=metrics.place(), run_dir=metrics.directory / "prometheus")
    try:
        running, _ = server.ensure()
    except ServerError as error:
        pytest.fail(f"prometheus could not start on the metrics host: {error}", pytrace=False)
    yield PrometheusServer(**running.facts)
    server.stop()


def test_prometheus_on_its_host_counts_the_work_of_smtp_and_a_worker_on_theirs(
    host_bed: HostBed, bed_url: str, bed_env: dict[str, str], bed_prometheus: PrometheusServer, tmp_path: Path
):
    smtp_host, worker_host = host_bed.host("smtp"), host_bed.host("worker1")
    assert bed_prometheus.url == f"http://{host_bed.host('metrics').address}:19090"
    run_on(host_bed, "smtp", bed_url, bed_env, "schema", "create")
    run_on(host_bed, "smtp", bed_url, bed_env, "users", "add", USER)
    run = secrets.token_hex(4)
    smtp_metrics, worker_metrics = f"{smtp_host.address}:9101", f"{worker_host.address}:9102"
    smtp = SmtpProcess(
        mailq_on(
            host_bed,
            "smtp",
            bed_url,
            "smtp",
            "--listen",
            f"{smtp_host.address}:2525",
            "--domain",
            LOCAL,
            "--metrics",
            smtp_metrics,
        ),
        2525,
        env=bed_env,
    )
    try:
        with bed_prometheus.scraping(smtp_metrics, f"{run}-smtp"):
            with smtplib.SMTP(smtp_host.address, 2525, local_hostname="client.example", timeout=60) as client:
                for n in range(MAILS):
                    client.sendmail("bob@elsewhere.example", [USER], f"Subject: {n}\r\n\r\nhi\r\n".encode())
            labels = f'run="{run}-smtp"'
            expected = {
                f"up{{{labels}}}": 1,
                f'mailq_queue_enqueued_mails_total{{{labels},queue="spool"}}': MAILS,
            }
            assert {
                query: bed_prometheus.await_value(query, want) for query, want in expected.items()
            } == expected
    finally:
        status, _ = smtp.stop()
    assert status == 0, "".join(smtp.log)
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        worker = subprocess.Popen(
            mailq_on(host_bed, "worker1", bed_url, "worker", "--domain", LOCAL, "--metrics", worker_metrics),
            env=bed_env,
            stdout=out,
            stderr=out,
        )
    try:
        with bed_prometheus.scraping(worker_metrics, f"{run}-worker"):
            labels = f'run="{run}-worker",queue="spool"'
            expected = {
                f'mailq_queue_settled_mails_total{{{labels},outcome="delivered"}}': MAILS,
                f'mailq_queue_mails{{{labels},state="ready"}}': 0,
            }
            found = {
                query: bed_prometheus.await_value(query, want, timeout=120)
                for query, want in expected.items()
            }
            assert found == expected, log.read_text()
    finally:
        worker.terminate()
        assert worker.wait(60) == 0, log.read_text()
