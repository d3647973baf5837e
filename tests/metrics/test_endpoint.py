"""`--metrics`'s endpoint scraped directly: each family counts the operations a test makes (the queue's on
the embedded store, an SMTP listener's, the backends' calls and failures), and the queue's sizes are
the overview's counts. The registry is the process's, so each test reads differences, on a queue name of
its own."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from mailq_cli.main import main
from mailq_cli.metrics_serving import serving_metrics
from mailq_runtime import Runtime
from mailq_runtime.blobs.s3_store import S3BlobStore
from mailq_runtime.blobs.store import BlobStore
from mailq_runtime.errors import BlobStoreUnavailable, InvalidInput
from mailq_runtime.metrics import count_calls
from mailq_runtime.model import BlobId
from mailq_servers.s3 import S3Server
from tests.metrics.helpers import delta, scrape, value
from tests.runtime.backends import Backend, EmbeddedBackend, open_backend
from tests.runtime.helpers import make_mail
from tests.smtp.conftest import USER, make_store, serving
from tests.smtp.helpers import Raw

LOOPBACK = ("127.0.0.1", 0)


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    with Runtime.open(f"embedded://{tmp_path / 'data'}", create=True) as opened:
        yield opened


def test_queue_counters_histograms_and_sizes(runtime: Runtime) -> None:
    name = f"metrics-{secrets.token_hex(4)}"
    queue = runtime.queue(name)
    with serving_metrics(LOOPBACK, runtime) as address:
        assert address is not None
        before = scrape(address)
        for _ in range(4):
            queue.enqueue(make_mail())
        queue.enqueue(make_mail(), delay="1h")
        removed = make_mail()
        queue.enqueue(removed, delay="1h")
        items = [queue.dequeue(timeout=5) for _ in range(3)]
        assert all(items)
        items[0].done()
        items[1].retry()  # requeued at once: ready again
        items[2].reject("no such user")
        assert queue.dequeue(timeout=5) is not None  # held: in flight
        assert queue.remove(name=removed.name) == 1
        after = scrape(address)

    counted = {
        "mailq_queue_enqueued_mails_total": 6,
        "mailq_queue_dequeued_mails_total": 4,
        "mailq_queue_enqueue_duration_seconds_count": 6,
        "mailq_queue_dequeue_duration_seconds_count": 4,
        "mailq_queue_time_in_queue_seconds_count": 1,
    }
    assert {metric: delta(before, after, metric, queue=name) for metric in counted} == counted
    assert {
        outcome: delta(before, after, "mailq_queue_settled_mails_total", queue=name, outcome=outcome)
        for outcome in ("delivered", "retried", "dead_lettered", "removed")
    } == {"delivered": 1, "retried": 1, "dead_lettered": 1, "removed": 1}
    sizes = {
        state: value(after, "mailq_queue_mails", queue=name, state=state)
        for state in ("ready", "in_flight", "delayed", "dead_letters")
    }
    assert sizes == {"ready": 1, "in_flight": 1, "delayed": 1, "dead_letters": 1}
    overview = queue.overviews.overview()
    assert (overview.ready, overview.in_flight, overview.delayed, overview.dead_letters) == (1, 1, 1, 1)
    assert value(after, "mailq_queue_enqueue_duration_seconds_sum", queue=name) > 0


def test_smtp_sessions_replies_and_bytes(tmp_path: Path) -> None:
    url = f"embedded://{tmp_path / 'data'}"
    make_store(url)
    with serving(url) as running, serving_metrics(LOOPBACK, running.runtime) as address:
        assert address is not None
        listener = f"127.0.0.1:{running.port}"
        before = scrape(address)
        sent = 0
        replies = []
        for _ in range(2):
            raw = Raw(running.port)
            replies.append(raw.reply())
            for line in (
                b"EHLO client.example\r\n",
                b"MAIL FROM:<bob@elsewhere.example>\r\n",
                b"RCPT TO:<not an address>\r\n",
                f"RCPT TO:<{USER}>\r\n".encode(),
                b"DATA\r\n",
                b"Subject: hi\r\n\r\nHello.\r\n.\r\n",
                b"QUIT\r\n",
            ):
                replies.append(raw.command(line))
                sent += len(line)
            raw.sock.close()
        assert [reply[:3] for reply in replies[:8]] == [
            "220",
            "250",
            "250",
            "501",
            "250",
            "354",
            "250",
            "221",
        ]
        after = scrape(address)
    assert delta(before, after, "mailq_smtp_sessions_total", listener=listener) == 2
    assert {
        code_class: delta(before, after, "mailq_smtp_replies_total", listener=listener, code_class=code_class)
        for code_class in ("2xx", "3xx", "4xx", "5xx")
    } == {"2xx": 12, "3xx": 2, "4xx": 0, "5xx": 2}
    assert delta(before, after, "mailq_smtp_received_bytes_total", listener=listener) == sent
    assert delta(before, after, "mailq_queue_enqueued_mails_total", queue="spool") >= 2


def test_smtp_refused_session(tmp_path: Path) -> None:
    """A connection past --max-sessions is a session too, and its 421 a 4xx reply."""
    url = f"embedded://{tmp_path / 'data'}"
    make_store(url)
    with serving(url, max_sessions=1) as running, serving_metrics(LOOPBACK, running.runtime) as address:
        assert address is not None
        listener = f"127.0.0.1:{running.port}"
        before = scrape(address)
        held = Raw(running.port)
        assert held.reply().startswith("220 ")
        refused = Raw(running.port)
        assert refused.reply().startswith("421 4.7.0")
        after = scrape(address)
        held.sock.close()
        refused.sock.close()
    assert delta(before, after, "mailq_smtp_sessions_total", listener=listener) == 2
    assert {
        code_class: delta(before, after, "mailq_smtp_replies_total", listener=listener, code_class=code_class)
        for code_class in ("2xx", "4xx")
    } == {"2xx": 1, "4xx": 1}


@pytest.fixture(params=("embedded", "rabbitmq"))
def backend(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Backend]:
    with open_backend(request, tmp_path, monkeypatch) as opened:
        yield opened


def test_backend_calls_by_backend_and_kind(backend: Backend) -> None:
    """Each call counted under the backend it goes to: SQLite for all of the embedded deployment;
    Cassandra, S3 and RabbitMQ for the distributed one."""
    embedded = isinstance(backend, EmbeddedBackend)
    metadata, content, broker = ("sqlite",) * 3 if embedded else ("cassandra", "s3", "rabbitmq")
    name = f"metrics-{secrets.token_hex(4)}"
    with backend.open() as runtime, serving_metrics(LOOPBACK, runtime) as address:
        assert address is not None
        before = scrape(address)
        queue = runtime.queue(name)
        queue.enqueue(make_mail())
        item = queue.dequeue(timeout=30)
        assert item is not None
        item.done()
        after = scrape(address)
    calls = {
        (label, kind): delta(before, after, "mailq_backend_calls_total", backend=label, kind=kind)
        for label, kind in (
            (metadata, "view.insert"),
            (metadata, "view.mark_done"),
            (content, "content.put"),
            (content, "content.get"),
            (broker, "broker.publish"),
            (broker, "broker.ack"),
        )
    }
    assert calls == {
        (metadata, "view.insert"): 1,
        (metadata, "view.mark_done"): 1,
        (content, "content.put"): 2,  # the headers and the body
        (content, "content.get"): 2,
        (broker, "broker.publish"): 1,
        (broker, "broker.ack"): 1,
    }
    # The sizes, the broker's counts included, read at the scrape.
    assert {
        state: after.get(("mailq_queue_mails", frozenset({("queue", name), ("state", state)})))
        for state in ("ready", "in_flight", "delayed", "dead_letters")
    } == {"ready": 0, "in_flight": 0, "delayed": 0, "dead_letters": 0}


def test_backend_errors_by_kind(
    s3_server: S3Server, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bucket that does not exist: each call fails as BlobStoreUnavailable, counted under s3."""
    for variable, setting in s3_server.env().items():
        monkeypatch.setenv(variable, setting)
    store = S3BlobStore(f"mailq-missing-{secrets.token_hex(4)}", endpoint_url=s3_server.endpoint_url)
    count_calls(store, BlobStore, "content")
    with serving_metrics(LOOPBACK, runtime) as address:
        assert address is not None
        before = scrape(address)
        with pytest.raises(BlobStoreUnavailable):
            store.put(BlobId(1, "0" * 64), b"a blob")
        after = scrape(address)
    store.close()
    labels = {"backend": "s3", "kind": "content.put"}
    assert delta(before, after, "mailq_backend_calls_total", **labels) == 1
    assert delta(before, after, "mailq_backend_errors_total", **labels) == 1


def test_metrics_address_taken(runtime: Runtime) -> None:
    with serving_metrics(LOOPBACK, runtime) as address:
        assert address is not None
        with pytest.raises(InvalidInput, match=f"cannot serve metrics on 127.0.0.1:{address[1]}"):
            with serving_metrics(address, runtime):
                pass


def test_metrics_argument_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["worker", "--domain", "example.com", "--metrics", "9464"]) == 2
    assert "invalid listen address '9464'" in capsys.readouterr().err
