"""Every measure of benchmarks/ at its `--quick` size, so that none breaks unseen: each runs as a user runs
it (`python benchmarks/X.py --quick`), on the harness's servers where it needs them (on a deployment the run
makes and removes), and must end with its JSON object. A quick run's figures say nothing of speed: the
tests check that each measure ran whole, on as many mails as it was given."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

from mailq_runtime.settings import AMQP_PASSWORD_VARIABLE
from mailq_servers.cassandra import CassandraServer
from mailq_servers.rabbitmq import RabbitMQServer
from mailq_servers.s3 import S3Server
from mailq_servers.urls import distributed_url
from tests.servers.fixtures import fresh_bucket_name, fresh_keyspace_name

REPOSITORY = Path(__file__).resolve().parents[1]
BENCHMARKS = REPOSITORY / "benchmarks"
# A bound against a hung run only: a quick run takes seconds on an idle two-core machine, and a Spark
# measure's many minutes when other work keeps it at a load average of 30.
RUN_SECONDS = 1500
pytestmark = pytest.mark.timeout(RUN_SECONDS + 60)
# The measures, each tested below; every other module of benchmarks/ says it is "Not a benchmark itself".
MEASURES = {
    "blob_store_rates.py",
    "cassandra_calls.py",
    "counters.py",
    "gc.py",
    "gc_churn.py",
    "queue_throughput.py",
    "rabbitmq_broker.py",
    "relay.py",
    "relay_drain.py",
    "run_cost.py",
    "smtp_end_to_end.py",
    "spark_read.py",
}
HELPER = "Not a benchmark itself"
# What would load a measure's module past the import statements.
LOADERS = {"spec_from_file_location", "import_module"}


def run_quick(script: str, *arguments: str, env: dict[str, str] | None = None) -> dict:
    """`script --quick` with `arguments`, as a user runs it; the JSON object of its last line. The run is a
    process group of its own, ended whole should the test end first (a measure starts servers, Spark and
    `mailq` processes of its own)."""
    process = subprocess.Popen(
        [sys.executable, str(BENCHMARKS / script), "--quick", *arguments],
        cwd=REPOSITORY,
        env={**os.environ, "PYTHONPATH": str(REPOSITORY), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=RUN_SECONDS)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 0, f"{script} failed:\n{stderr[-4000:]}"
    return json.loads(stdout.splitlines()[-1])


def fresh_url(cassandra: CassandraServer, s3: S3Server, broker: str) -> str:
    """A distributed deployment that does not exist yet, on the harness's servers: the run makes it and
    removes it."""
    return distributed_url(cassandra, s3, fresh_keyspace_name(), fresh_bucket_name(), broker)


def helper_or_measure(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def test_every_measure_is_run_here_and_helpers_say_so() -> None:
    modules = {path.name: helper_or_measure(path) for path in BENCHMARKS.glob("*.py")}
    measures = {name for name, tree in modules.items() if HELPER not in (ast.get_docstring(tree) or "")}
    assert measures == MEASURES


def test_no_measure_imports_another() -> None:
    stems = {name.removesuffix(".py") for name in MEASURES}
    imported = set()
    for path in BENCHMARKS.glob("*.py"):
        for node in ast.walk(helper_or_measure(path)):
            if isinstance(node, ast.ImportFrom) and node.module in stems:
                imported.add((path.name, node.module))
            elif isinstance(node, ast.Import):
                imported |= {(path.name, alias.name) for alias in node.names if alias.name in stems}
            elif isinstance(node, ast.Attribute) and node.attr in LOADERS:
                imported.add((path.name, node.attr))  # a module loaded by path or by name
    assert imported == set()


def test_queue_throughput_embedded() -> None:
    figures = run_quick("queue_throughput.py")
    assert (figures["deployment"], figures["mails"]) == ("embedded", 80)
    assert figures["targets"]["size_equals_live"]
    assert figures["processes"]["mails_a_turn"] == 80


def test_queue_throughput_on_cassandra_s3_rabbitmq(
    cassandra_server: CassandraServer, s3_server: S3Server, rabbitmq_server: RabbitMQServer
) -> None:
    rabbitmq = rabbitmq_server
    broker = f"amqp://{rabbitmq.username}@{rabbitmq.host}:{rabbitmq.port}/{quote(rabbitmq.vhost, safe='')}"
    url = fresh_url(cassandra_server, s3_server, broker)
    env = {**s3_server.env(), AMQP_PASSWORD_VARIABLE: rabbitmq.password}
    figures = run_quick("queue_throughput.py", "--url", url, env=env)
    assert (figures["deployment"], figures["mails"]) == ("cassandra", 80)
    assert figures["targets"]["size_equals_live"]
    assert figures["messaging_leg"]["messages"] > 0
    assert set(figures["cost"]["ratios_to_james"]) == {"enqueue", "dequeue"}


def test_rabbitmq_broker(rabbitmq_server: RabbitMQServer) -> None:
    figures = run_quick("rabbitmq_broker.py", env=rabbitmq_server.env())
    assert figures["rounds"] == 1
    assert all(figures[measure] > 0 for measure in ("raw_publish", "mailq_publish", "mailq_consume_n"))


def test_blob_store_rates(s3_server: S3Server) -> None:
    figures = run_quick("blob_store_rates.py", env=s3_server.env())
    assert len(figures["delete_many_1000_seconds"]) == 1


def test_cassandra_calls(cassandra_server: CassandraServer) -> None:
    figures = run_quick("cassandra_calls.py", env=cassandra_server.env())
    assert figures["calls"] == 20


def test_smtp_end_to_end_against_postfix() -> None:
    result = run_quick("smtp_end_to_end.py")
    assert result["postfix"]["mails"] >= 200
    assert result["embedded"]["1 process"]["mails"] >= 200
    assert result["end_to_end_ratio"]


def test_relay_against_postfix() -> None:
    result = run_quick("relay.py")
    assert result["postfix"]["mails"] >= 200
    assert result["embedded"]["mails"] >= 200
    assert set(result["ratio"]) == {"embedded"}


def test_relay_drain() -> None:
    result = run_quick("relay_drain.py")
    assert result["received"] == result["mails"] == 40
    assert result["within_limits"]


def test_gc_mark() -> None:
    figures = run_quick("gc.py")
    assert figures["references"] == 20_000
    assert set(figures["masters"]) == {"local[1]"}


def test_counters() -> None:
    figures = run_quick("counters.py")
    assert figures["messages"] == 20_000
    assert set(figures["masters"]) == {"local[1]"}


def test_gc_churn() -> None:
    figures = run_quick("gc_churn.py")
    assert figures["references"] == 20_000


def test_spark_read() -> None:
    figures = run_quick("spark_read.py")
    assert figures["rows"] == 20_000


def test_run_cost() -> None:
    figures = run_quick("run_cost.py")
    assert set(figures["jobs"]) == {"queue_overview_job"}
