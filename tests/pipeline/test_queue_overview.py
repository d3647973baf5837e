"""What the queues hold, as assets: the per-queue table, the per-domain one from the counters, the dead
letters by reason and age with their check that warns on growth, and the sensor that notifies and asks
for a run only on growth."""

from __future__ import annotations

import http.server
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from assets import automation, jobs
from assets import queue_overview as overview_assets
from assets.metadata import when
from assets.notify import NOTIFY_VARIABLE
from assets.runner import summarise
from mailq_cli.pipeline_output import describe_run
from mailq_runtime import Mail, Runtime
from mailq_runtime.clock import MICROS_PER_SECOND
from mailq_runtime.model import creation_time
from mailq_runtime.stores.records import DestinationNote
from resources import MailqRuntime

from .pipeline import materialized

ALICE = "alice@example.com"


def mail(*recipients: str, **fields: str) -> Mail:
    return Mail(recipients=recipients, message=b"Subject: hi\r\n\r\nHello.\r\n", sender=ALICE, **fields)


def mailq_resource(runtime: Runtime) -> dict:
    return {"mailq": MailqRuntime(url=f"embedded://{runtime.settings.data_dir}")}


def records(metadata: dict, key: str) -> list[dict]:
    return [dict(record.data) for record in metadata[key].records]


def reject(runtime: Runtime, queue: str, reason: str, *recipients: str) -> None:
    runtime.queue(queue).enqueue(mail(*(recipients or ("bob@example.org",))))
    runtime.queue(queue).dequeue(timeout=0).reject(reason)


def test_the_overview_table_holds_the_traffic(runtime: Runtime) -> None:
    outbound = runtime.queue("outbound")
    first = outbound.enqueue(mail("bob@Example.ORG", "carol@example.net"))
    outbound.enqueue(mail("dave@example.org"))
    outbound.enqueue(mail("erin@example.net"), delay="1h")
    outbound.enqueue(mail("frank@gone.example", name="gone"))
    assert outbound.remove(name="gone") == 1
    item = outbound.dequeue(timeout=0)
    assert item.enqueue_id == first
    reject(runtime, "spool", "550 no such user")

    result = dg.materialize([overview_assets.mail_queue_overview], resources=mailq_resource(runtime))
    assert result.success
    queues = materialized(result, "mail_queue_overview")
    assert (queues["queues"], queues["live_mails"], queues["dead_letters"]) == (2, 3, 1)
    event = result.asset_materializations_for_node("mail_queue_overview")[0]
    (outbound_row, spool_row) = records(event.metadata, "per_queue")
    assert {
        k: outbound_row[k] for k in ("queue", "size", "ready", "in_flight", "delayed", "dead_letters")
    } == {
        "queue": "outbound",
        "size": 3,
        "ready": 1,
        "in_flight": 1,
        "delayed": 1,
        "dead_letters": 0,
    }
    assert outbound_row["oldest_in_flight"] == when(creation_time(first))
    assert (spool_row["queue"], spool_row["size"], spool_row["dead_letters"]) == ("spool", 0, 1)
    item.done()


def domain_run(runtime: Runtime, instance: dg.DagsterInstance) -> tuple[dict, list[dict]]:
    result = dg.materialize(
        [overview_assets.mail_queue_domains], resources=mailq_resource(runtime), instance=instance
    )
    assert result.success
    event = result.asset_materializations_for_node("mail_queue_domains")[0]
    return materialized(result, "mail_queue_domains"), records(event.metadata, "by_domain")


def test_the_domain_table_shows_each_destination_by_state_from_the_counters(runtime: Runtime) -> None:
    outbound = runtime.queue("outbound")
    first = outbound.enqueue(mail("bob@Example.ORG", "carol@example.net"))
    outbound.enqueue(mail("dave@example.org"))
    # Remote delivery's way: example.org took the first mail, example.net answered 451.
    item = outbound.dequeue(timeout=0)
    assert item.enqueue_id == first
    now = runtime.clock()
    due = now + 600 * MICROS_PER_SECOND
    outbound.overviews.note_destination(DestinationNote("example.net", "451 4.3.0 try later", now, due))
    item.retry("10m", recipients=["carol@example.net"])
    instance = dg.DagsterInstance.ephemeral()

    figures, rows = domain_run(runtime, instance)
    keys = ("domains", "waiting_by_domain", "deferred_by_domain", "domains_retrying")
    assert {key: figures[key] for key in keys} == {
        "domains": 2,
        "waiting_by_domain": 2,
        "deferred_by_domain": 1,
        "domains_retrying": 1,
    }
    # The top domains' figures are numbers of their own, which the UI plots across materialisations.
    assert (figures["example.net deferred"], figures["example.org waiting"]) == (1, 1)
    assert 0 <= figures["example.net oldest_minutes"] < 5 and 0 <= figures["oldest_minutes"] < 5
    # A row per state that holds mails: none of a state without any, no figure on a row without one.
    shown = {(r["domain"], r["state"]): r for r in rows}
    assert {key: (r["mails"], r["min_0_5"], r["min_160_plus"]) for key, r in shown.items()} == {
        ("example.net", "deferred"): (1, 1, 0),
        ("example.org", "queued"): (1, 1, 0),
    }
    deferred = shown["example.net", "deferred"]
    assert (deferred["last_error"], deferred["next_attempt"]) == ("451 4.3.0 try later", when(due))
    assert (shown["example.org", "queued"]["last_error"], shown["example.org", "queued"]["next_attempt"]) == (
        "",
        "",
    )

    # dave's mail delivered: the next materialisation has one mail waiting fewer.
    outbound.dequeue(timeout=0).done()
    figures, _ = domain_run(runtime, instance)
    assert (figures["waiting_by_domain"], figures["deferred_by_domain"], figures["example.net deferred"]) == (
        1,
        1,
        1,
    )
    history = instance.fetch_materializations(dg.AssetKey("mail_queue_domains"), limit=10).records
    waiting = [r.asset_materialization.metadata["waiting_by_domain"].value for r in history]
    assert sorted(waiting) == [1, 2]

    # carol's mail held by the operator: it waits as held, no longer deferred.
    assert outbound.holds.hold(domain="example.net") == 1
    figures, rows = domain_run(runtime, instance)
    assert (figures["waiting_by_domain"], figures["deferred_by_domain"], figures["held_by_domain"]) == (
        1,
        0,
        1,
    )
    shown = {(r["domain"], r["state"]): r["mails"] for r in rows}
    assert shown == {("example.net", "held"): 1}


def test_empty_tables_say_why(runtime: Runtime) -> None:
    result = dg.materialize(
        [overview_assets.mail_queue_overview, overview_assets.mail_queue_domains],
        resources=mailq_resource(runtime),
    )
    for asset, key, note in (
        ("mail_queue_overview", "per_queue", "no mail queue yet"),
        ("mail_queue_domains", "by_domain", "no mail waiting for any domain"),
    ):
        metadata = result.asset_materializations_for_node(asset)[0].metadata
        assert records(metadata, key) == [] and metadata[f"{key}_note"].value == note
    figures = materialized(result, "mail_queue_domains")
    assert (figures["domains"], figures["waiting_by_domain"], figures["oldest_minutes"]) == (0, 0, -1)


def dead_letter_run(runtime: Runtime, instance: dg.DagsterInstance) -> tuple[dict, dg.AssetCheckEvaluation]:
    result = dg.materialize(
        [overview_assets.mail_queue_dead_letters], resources=mailq_resource(runtime), instance=instance
    )
    assert result.success
    (check,) = result.get_asset_check_evaluations()
    event = result.asset_materializations_for_node("mail_queue_dead_letters")[0]
    return {
        **materialized(result, "mail_queue_dead_letters"),
        "rows": records(event.metadata, "by_reason"),
    }, check


def test_dead_letters_by_reason_and_age_and_the_check_warns_on_growth(runtime: Runtime) -> None:
    instance = dg.DagsterInstance.ephemeral()
    reject(runtime, "spool", "550 no such user")
    reject(runtime, "spool", "550 no such user")
    reject(runtime, "spool", "552 mailbox full")

    figures, check = dead_letter_run(runtime, instance)
    assert figures["dead_letters"] == 3
    assert [
        (r["queue"], r["reason"], r["letters"], r["died_within_1h"], r["died_over_7d"])
        for r in figures["rows"]
    ] == [
        ("spool", "550 no such user", 2, 2, 0),
        ("spool", "552 mailbox full", 1, 1, 0),
    ]
    assert check.check_name == "dead_letters_not_growing" and check.passed  # nothing to compare with
    assert check.severity == dg.AssetCheckSeverity.WARN

    _, check = dead_letter_run(runtime, instance)
    assert check.passed  # as many as before

    reject(runtime, "outbound", "554 spam")
    result = dg.materialize(
        [overview_assets.mail_queue_dead_letters], resources=mailq_resource(runtime), instance=instance
    )
    assert materialized(result, "mail_queue_dead_letters")["queues_with_dead_letters"] == 2
    (check,) = result.get_asset_check_evaluations()
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN
    assert (check.metadata["dead_letters"].value, check.metadata["dead_letters_before"].value) == (4, 3)
    # A warning, not a failure: the command line's report says so and exits with success.
    summary = {**summarise(result), "instance": None, "job": jobs.dead_letters_job.name, "seconds": 0}
    assert summary["success"]
    assert "check        dead_letters_not_growing: WARNING" in describe_run(summary)

    runtime.queue("outbound").dead_letters.purge(older_than="0s")
    _, check = dead_letter_run(runtime, instance)
    assert check.passed  # fewer


def evaluate(runtime: Runtime, cursor: str | None) -> dg.SensorResult:
    with dg.build_sensor_context(resources=mailq_resource(runtime), cursor=cursor) as context:
        return automation.dead_letters_sensor(context)


@pytest.fixture
def notified(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The hook is a command that writes what it reads to a file."""
    out = tmp_path / "notified.json"
    script = f"import sys; open({str(out)!r}, 'ab').write(sys.stdin.buffer.read() + b'\\n')"
    monkeypatch.setenv(NOTIFY_VARIABLE, f"{sys.executable} -c {json.dumps(script)}")
    return out


def test_the_sensor_notifies_and_requests_a_run_only_on_growth(runtime: Runtime, notified: Path) -> None:
    assert automation.dead_letters_sensor.job_name == jobs.dead_letters_job.name
    reject(runtime, "spool", "550 no such user")
    first = evaluate(runtime, None)
    assert not first.run_requests and "1 dead letter(s) now" in first.skip_reason.skip_message
    same = evaluate(runtime, first.cursor)
    assert not same.run_requests and "no growth" in same.skip_reason.skip_message
    assert not notified.exists()

    reject(runtime, "spool", "552 mailbox full")
    reject(runtime, "outbound", "554 spam")
    grew = evaluate(runtime, same.cursor)
    (request,) = grew.run_requests
    assert request.run_key and request.tags["dead_letters"] == "3"
    (news,) = [json.loads(line) for line in notified.read_text().splitlines()]
    assert news == {"event": "dead_letters_grew", "before": 1, "now": 3, "grew": {"outbound": 1, "spool": 1}}

    runtime.queue("spool").dead_letters.purge(older_than="0s")
    fewer = evaluate(runtime, grew.cursor)
    assert not fewer.run_requests and json.loads(fewer.cursor)["dead_letters"] == 1
    assert len(notified.read_text().splitlines()) == 1


@pytest.fixture
def webhook(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict]]:
    """A local HTTP server as the hook; yields the JSON bodies it received."""
    received: list[dict] = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv(NOTIFY_VARIABLE, f"http://127.0.0.1:{server.server_port}/hook")
    yield received
    server.shutdown()
    server.server_close()


def test_the_sensor_posts_to_a_webhook_and_a_failing_hook_does_not_stop_the_run(
    runtime: Runtime, webhook: list[dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = evaluate(runtime, None)
    reject(runtime, "spool", "550 no such user")
    grew = evaluate(runtime, first.cursor)
    assert len(grew.run_requests) == 1
    assert webhook == [{"event": "dead_letters_grew", "before": 0, "now": 1, "grew": {"spool": 1}}]

    monkeypatch.setenv(NOTIFY_VARIABLE, f"{sys.executable} -c 'raise SystemExit(3)'")
    reject(runtime, "spool", "550 no such user")
    assert len(evaluate(runtime, grew.cursor).run_requests) == 1


def test_a_domain_s_own_figures_are_on_its_first_row_only(runtime: Runtime) -> None:
    # example.net: a mail queued and one deferred, one note of remote delivery's; its rows: two states.
    outbound = runtime.queue("outbound")
    outbound.enqueue(mail("carol@example.net"))
    outbound.enqueue(mail("erin@example.net"), delay="10m")
    now = runtime.clock()
    outbound.overviews.note_destination(
        DestinationNote("example.net", "451 4.3.0 try later", now, now + 10**9)
    )

    _, rows = domain_run(runtime, dg.DagsterInstance.ephemeral())

    assert [(r["state"], r["mails"]) for r in rows] == [("queued", 1), ("deferred", 1)]
    first, second = rows
    assert 0 <= first["oldest_minutes"] < 5 and first["last_error"] == "451 4.3.0 try later"
    assert [second[k] for k in ("oldest_minutes", "next_attempt", "last_error", "suspended_until")] == [
        None
    ] * 4
