"""A queue that never idles keeps exact counts: producers and consumers work the whole time, on the
distributed deployment, with no fault or with Cassandra's replies held back past the driver's timeout in
the middle (tests/forwarder.py: every request reaches the node and is applied, its answer comes late).
Whenever the producers pause and the consumers hold what they took, and once the counts' bound has
passed since the fault (docs/distributed.md, "Exact counts"), size(), the overview and the counts by
destination domain equal a browse, and a mailbox's counters its messages. The recount runs meanwhile,
under traffic, on its schedule; it never makes a count wrong.

The bound is shortened here as the settling of counts allows (epochs of 1 s, settled 6 s after their
end, a recount every 3 s: 10 s where the defaults make 70 s), with a driver timeout of 2 s."""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from urllib.parse import quote, urlsplit

import pytest

import mailq_runtime.stores.cassandra
from mailq_runtime import Runtime
from mailq_runtime.errors import BACKEND_FAILURES
from mailq_runtime.queue import MailQueue, dequeuer
from mailq_runtime.stores.cassandra import CassandraOptions, slice_counts
from mailq_servers import CassandraServer, RabbitMQServer, S3Server
from mailq_servers.rabbitmq import Vhosts
from mailq_servers.s3 import remove_bucket
from mailq_servers.urls import distributed_url
from tests.forwarder import Forwarder
from tests.servers.fixtures import fresh_keyspace

from .helpers import make_mail

DOMAIN = "example.org"
TIMEOUT = 2.0  # the driver's request timeout, seconds
HELD = 3.0  # seconds of replies held back: past a try's timeout, within the store's retries
EPOCH, SETTLE, RECOUNT_INTERVAL = 1.0, 6.0, 3.0
BOUND = EPOCH + SETTLE + RECOUNT_INTERVAL
PRODUCERS, CONSUMERS = 2, 2
QUIET = 1.5  # seconds for the calls under way at a pause to end


@pytest.fixture
def deployment(
    cassandra_server: CassandraServer,
    s3_server: S3Server,
    rabbitmq_server: RabbitMQServer,
    rabbitmq_vhosts: Vhosts,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[str, Forwarder]]:
    """A fresh distributed deployment whose runtime reaches Cassandra through a forwarder, the bound
    shortened: its URL and the forwarder."""
    for variable, value in s3_server.env().items():  # the AWS chain finds the harness's keys
        monkeypatch.setenv(variable, value)
    monkeypatch.setattr(slice_counts, "EPOCH", EPOCH)
    monkeypatch.setattr(slice_counts, "SETTLE", SETTLE)
    monkeypatch.setattr(dequeuer, "RECOUNT_INTERVAL", RECOUNT_INTERVAL)
    cable = Forwarder(cassandra_server.host, cassandra_server.port)
    bucket = f"mailq-busy-{time.time_ns():x}"
    vhost = quote(rabbitmq_vhosts.take(), safe="")
    with fresh_keyspace(cassandra_server) as keyspace:
        s3 = urlsplit(s3_server.endpoint_url)
        url = distributed_url(
            replace(cassandra_server, port=cable.port),
            replace(s3_server, endpoint_url=f"http://{s3.hostname}:{s3.port}"),
            keyspace,
            bucket,
            broker=f"amqp://{rabbitmq_server.host}:{rabbitmq_server.port}/{vhost}",
        )
        with Runtime.open(url, create=True):
            pass  # the schema, whose statements take longer than the short timeout
        monkeypatch.setattr(
            mailq_runtime.stores.cassandra,
            "CassandraOptions",
            functools.partial(CassandraOptions, request_timeout=TIMEOUT),
        )
        try:
            yield url, cable
        finally:
            cable.close()
            remove_bucket(s3_server.client(), bucket)


class Traffic:
    """Producers enqueueing and consumers delivering into a mailbox, the whole time, until `stop`; on
    `pause`, producers stop enqueueing and consumers hold what they took, unsettled."""

    def __init__(self, runtime: Runtime, queue: MailQueue) -> None:
        self.runtime, self.queue = runtime, queue
        self.mailbox = runtime.mailboxes.get_or_create(f"user@{DOMAIN}", "INBOX")
        self.paused, self.stopped = threading.Event(), threading.Event()
        self.enqueued = self.delivered = 0
        self.threads = [threading.Thread(target=self._produce, args=(n,)) for n in range(PRODUCERS)]
        self.threads += [threading.Thread(target=self._consume) for _ in range(CONSUMERS)]
        for thread in self.threads:
            thread.start()

    def _produce(self, producer: int) -> None:
        n = 0
        while not self.stopped.is_set():
            if self.paused.is_set():
                time.sleep(0.05)
                continue
            try:
                self.queue.enqueue(make_mail(f"p{producer}-{n}", recipients=(f"user@{DOMAIN}",)))
                self.enqueued += 1
            except BACKEND_FAILURES:
                pass  # not accepted: its producer keeps it, as an SMTP client does after a 4xx
            n += 1
            time.sleep(0.02)

    def _consume(self) -> None:
        while not self.stopped.is_set():
            if self.paused.is_set():
                time.sleep(0.05)
                continue
            try:
                item = self.queue.dequeue(timeout=0.2)
            except BACKEND_FAILURES:
                continue
            if item is None:
                continue
            while self.paused.is_set() and not self.stopped.is_set():
                time.sleep(0.05)  # holds what it took
            try:
                self.runtime.mailboxes.append(self.mailbox, item.mail.message)
                item.done()
                self.delivered += 1
            except BACKEND_FAILURES:
                pass  # delivered again once its lease ends or the broker sees it given back

    def check(self) -> tuple[int, int, str]:
        """Pause, compare every count with a browse, resume: the mails enqueued and delivered so far,
        and what was compared, for the report."""
        self.paused.set()
        try:
            time.sleep(QUIET)
            browsed = [item.name for item in self.queue.browse()]
            overview = self.queue.overview()
            by_domain = {
                shape.domain: sum(map(shape.total, shape.buckets)) for shape in self.queue.by_domain()
            }
            report = (
                f"browse {len(browsed)}, size {self.queue.size()}, overview {overview.size}, "
                f"by domain {by_domain}, enqueued {self.enqueued}, delivered {self.delivered}"
            )
            assert self.queue.size() == len(browsed), report
            assert overview.size == len(browsed), report
            assert by_domain.get(DOMAIN, 0) == len(browsed), report
            boxes = self.runtime.mailboxes
            assert boxes.counters(self.mailbox) == boxes.recount(self.mailbox), report
            return self.enqueued, self.delivered, report
        finally:
            self.paused.clear()

    def stop(self) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join(timeout=60)


@pytest.mark.parametrize("fault", ["none", "lost-replies"])
def test_a_busy_queue_counts_exactly_within_the_bound(deployment, fault, caplog):
    url, cable = deployment
    caplog.set_level(logging.WARNING, logger="mailq_runtime.queue.mail_view")
    with Runtime.open(url) as runtime:
        queue = runtime.queue("busy")
        traffic = Traffic(runtime, queue)
        try:
            time.sleep(4)
            reports = [traffic.check()]  # no fault yet: exact at once
            if fault == "lost-replies":
                with cable.replies_held():
                    time.sleep(HELD)
            time.sleep(BOUND + 2)
            reports.append(traffic.check())
            time.sleep(RECOUNT_INTERVAL + 1)
            reports.append(traffic.check())
        finally:
            traffic.stop()
        print(reports)
        # Traffic between every two checks, through the fault too.
        for (enqueued, delivered, _), (later_enqueued, later_delivered, _) in itertools.pairwise(reports):
            assert later_enqueued > enqueued and later_delivered > delivered, reports
        if fault == "none":
            assert "counters corrected" not in caplog.text, caplog.text
