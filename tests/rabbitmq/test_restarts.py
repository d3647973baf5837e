"""RabbitMQ stopped gracefully, and killed with SIGKILL, while publishers and consumers run, on a private
node of this module's own (never the shared one): nothing confirmed is lost, nothing whose enqueue
returned is lost, and the same brokers, runtimes and processes carry on by themselves once it is back.
The runtime's tests run the whole distributed deployment: Cassandra and S3 from the harness."""

from __future__ import annotations

import logging
import secrets
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mailq_runtime import Runtime
from mailq_runtime.errors import BrokerUnavailable
from mailq_servers.rabbitmq import RabbitMQ
from tests.runtime.helpers import make_mail

from .conftest import Deployment, broker_factory, private_server

AGENT = Path(__file__).parents[1] / "runtime" / "consumer_agent.py"
RESTARTS = {"stopped": RabbitMQ.stop, "killed": RabbitMQ.kill}


def restart(node: RabbitMQ, how: str) -> None:
    RESTARTS[how](node)
    time.sleep(1)
    node.ensure()


def wait_until(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.parametrize("how", list(RESTARTS))
def test_rabbitmq_restarting_under_a_publisher_and_a_consumer_loses_no_confirmed_message(
    private_node: RabbitMQ, how: str, caplog: pytest.LogCaptureFixture
):
    make, made = broker_factory(private_server(private_node), "/")
    queue = f"broker-{how}-{secrets.token_hex(3)}"
    publisher, consumer = make(publish_timeout=180), make()
    total, payload = 400, '{"v": 1, "body": "' + "x" * 1024 + '"}'
    confirmed: list[str] = []
    refused: list[str] = []
    received: set[str] = set()
    failures: list[BaseException] = []
    done = threading.Event()

    def publish() -> None:
        # While the broker is away a publish fails at once; the queue would keep the mail as a delayed
        # mail, and this publisher sends it again a little later.
        try:
            for n in range(total):
                enqueue_id = f"m{n:04d}"
                while True:
                    try:
                        publisher.publish(queue, enqueue_id, payload, n % 10)
                        break
                    except BrokerUnavailable:
                        refused.append(enqueue_id)
                        time.sleep(0.1)
                confirmed.append(enqueue_id)
                time.sleep(0.005)
        except BaseException as error:  # reported by the test's thread
            failures.append(error)

    def consume() -> None:
        try:
            while not done.is_set():
                delivery = consumer.receive(queue, 0.5)
                if delivery is not None:
                    received.add(delivery.enqueue_id)
                    try:
                        consumer.ack(delivery)
                    except BrokerUnavailable:
                        pass  # a delivery of the lost connection: it comes again
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=publish), threading.Thread(target=consume)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: len(confirmed) >= 100 or failures, 60, "no publishes before the restart")
        at_outage = len(confirmed)
        restart(private_node, how)
        threads[0].join(200)
        assert not failures, failures
        assert len(confirmed) == total and at_outage < total, "the publisher went on across the outage"
        assert refused, "no publish failed at once during the outage"
        wait_until(lambda: not set(confirmed) - received, 90, "confirmed messages were never delivered")
    finally:
        done.set()
        threads[1].join(30)
        for broker in made:
            broker.close()
    assert not failures, failures
    # One line per event (lost, cannot connect, connected again) from each of the two brokers: no
    # traceback, and none of pika's own lines.
    lines = [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert not [record for record in lines if record.exc_info or record.name.startswith("pika")], lines
    assert any("connection lost" in record.getMessage() for record in lines), "the outage was logged"
    assert len(lines) <= 2 * 3, [record.getMessage() for record in lines]


@pytest.fixture
def distributed_url(private_node: RabbitMQ, deployment: Deployment) -> Callable[..., str]:
    """The URL of the distributed deployment on the private RabbitMQ node."""
    return deployment.url(private_server(private_node), "/")


@pytest.mark.parametrize("how", list(RESTARTS))
def test_enqueues_and_consumers_go_on_across_a_rabbitmq_restart_and_no_accepted_mail_is_lost(
    distributed_url: Callable[..., str], private_node: RabbitMQ, how: str, tmp_path: Path
):
    name = f"restart-{how}-{secrets.token_hex(3)}"
    runtime = Runtime.open(distributed_url(), create=True)
    queue = runtime.queue(name)
    queue.enqueue(make_mail("first"))
    accepted: list[str] = ["first"]
    consumed: set[str] = set()
    failures: list[BaseException] = []
    stop = threading.Event()

    def produce() -> None:
        try:
            for n in range(150):
                queue.enqueue(make_mail(f"m{n:03d}"))
                accepted.append(f"m{n:03d}")
                time.sleep(0.02)
        except BaseException as error:  # reported by the test's thread
            failures.append(error)

    def consume() -> None:
        try:
            while not stop.is_set():
                item = queue.dequeue(timeout=0.5)
                if item is not None:
                    consumed.add(item.mail.name)
                    item.done()  # a delivery of the lost connection fails nothing: the mark absorbs its copy
        except BaseException as error:
            failures.append(error)

    log = tmp_path / "process.log"
    errors = tmp_path / "process.err"
    with errors.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, str(AGENT), distributed_url(), name, str(log), "0", "600"], stderr=stderr
        )
    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for thread in threads:
        thread.start()

    def by_the_process() -> set[str]:
        lines = log.read_text().splitlines() if log.exists() else []
        return {line.split(" ", 1)[1] for line in lines if not line.startswith("start ")}

    try:
        wait_until(lambda: len(accepted) >= 40 or failures, 120, "no enqueues before the restart")
        at_outage = len(accepted)
        restart(private_node, how)
        threads[0].join(300)
        assert not failures, failures
        assert len(accepted) == 151 and at_outage < 151, "the producer went on across the outage"
        wait_until(
            lambda: not set(accepted) - consumed - by_the_process(),
            120,
            "accepted mails were never delivered",
        )
        # The consumer process, alone now, still serves the queue: it reconnected by itself.
        stop.set()
        threads[1].join(30)
        after = {f"after-{n}" for n in range(20)}
        for mail_name in sorted(after):
            queue.enqueue(make_mail(mail_name))
        carried_on = f"the consumer process did not carry on: {errors.read_text()[-3000:]}"
        wait_until(lambda: after <= by_the_process(), 120, carried_on)
        assert process.poll() is None, errors.read_text()[-3000:]
        assert queue.size() == 0
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        process.send_signal(signal.SIGTERM)
        process.wait(30)
        runtime.close()
    assert not failures, failures


def test_an_enqueue_while_rabbitmq_is_down_returns_and_is_delivered_once_it_is_back(
    distributed_url: Callable[..., str], private_node: RabbitMQ
):
    name = f"down-{secrets.token_hex(3)}"
    with Runtime.open(distributed_url(), create=True) as runtime:
        queue = runtime.queue(name)
        queue.enqueue(make_mail("before"))  # declares the queue
        private_node.stop()
        try:
            # The link knows RabbitMQ is away: each enqueue returns in the time of its other writes.
            times, during = [], []
            for n in range(20):
                started = time.monotonic()
                during.append(queue.enqueue(make_mail(f"during-{n}")))
                times.append(time.monotonic() - started)
            # None waits for the publish's timeout (30 s); a stall of the loaded machine may slow one.
            assert max(times[1:]) < 5.0 and statistics.median(times[1:]) < 1.0, times
            # Accepted: held as delayed mails due now, for the next publisher of due mails.
            assert sorted(mail.enqueue_id for mail in queue.backends.delayed.all(name)) == sorted(during)
        finally:
            private_node.ensure()
        received = []
        deadline = time.monotonic() + 120
        while len(received) < 21 and time.monotonic() < deadline:
            item = queue.dequeue(timeout=1)  # no republish: the dequeue publishes the due mail
            if item is not None:
                received.append(item.mail.name)
                item.done()
        assert sorted(received) == sorted(["before", *(f"during-{n}" for n in range(20))])
        assert queue.backends.delayed.all(name) == [] and queue.size() == 0
