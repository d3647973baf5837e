"""The mailbox_counters asset repairs record 23's inconsistencies, whatever left them: a process dying
between the writes of an operation, or rows damaged directly.

Every fault gets a mailbox of its own, so each expected figure of the materialisation is an exact count.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import dagster as dg
import pytest

from assets import mailboxes as mailbox_assets
from assets.spark.table_source import read_table
from mailq_runtime import Runtime
from mailq_runtime.faults import AFTER_PROJECTION, AFTER_SOURCE_OF_TRUTH, InjectedFault
from mailq_runtime.mailbox import Counters
from mailq_runtime.mailboxes import Mailboxes
from mailq_runtime.model import MailboxId
from mailq_runtime.settings import Settings
from tests.runtime.backends import Backend

from .pipeline import checks_passed, materialized

USER = "alice@example.com"
SEEN = "\\Seen"
KINDS = ("orphan_projection_entry", "missing_projection_entry", "outdated_projection_entry")
ASSETS = [mailbox_assets.mailbox_counters, mailbox_assets.counters_match_source_of_truth]


def message(n: int) -> bytes:
    return b"Subject: message %d\r\nFrom: bob@example.com\r\n\r\nBody of message %d.\r\n" % (n, n)


def fill(boxes: Mailboxes, mailbox: MailboxId, count: int) -> None:
    """`count` messages, every other one seen (uids 1, 2, ...: unseen, seen, ...)."""
    for n in range(count):
        boxes.append(mailbox, message(n), flags=[SEEN] if n % 2 else [])


def recompute(resources: dict) -> dg.ExecuteInProcessResult:
    return dg.materialize(ASSETS, resources=resources, raise_on_error=False)


def assert_consistent(runtime: Runtime, backend: Backend) -> None:
    """Counters equal a recount of the source of truth, and the projection is a copy of it."""
    boxes = runtime.mailboxes
    for mailbox in boxes.list():
        assert boxes.counters(mailbox) == boxes.recount(mailbox), mailbox.name
    assert backend.mailbox_state().projection == backend.mailbox_state().source_of_truth


def projection_disagreements(backend: Backend) -> dict[str, int]:
    """The projection entries that disagree with the source of truth, by kind, as the asset counts them:
    both tables joined on (mailbox, message)."""
    truth = {
        (mailbox, message_id): (uid, flags)
        for mailbox, uid, message_id, flags in backend.mailbox_state().source_of_truth
    }
    projection = backend.mailbox_state().projection
    found = dict.fromkeys(KINDS, 0)
    for mailbox, uid, message_id, flags in projection:
        entry = truth.get((mailbox, message_id))
        if entry is None:
            found["orphan_projection_entry"] += 1
        elif entry != (uid, flags):
            found["outdated_projection_entry"] += 1
    found["missing_projection_entry"] = len(truth.keys() - {(m, message) for m, _, message, _ in projection})
    return found


def fault(boxes: Mailboxes, point: str, operation: Callable[[], object]) -> None:
    boxes.faults.arm(point)
    with pytest.raises(InjectedFault, match=point):
        operation()


def test_recompute_repairs_every_fault_and_damaged_row_with_exact_figures(
    backend: Backend, deployment_resources: dict
) -> None:
    runtime = backend.open()
    boxes = runtime.mailboxes
    sizes = {
        "append-sot": 2,
        "append-projection": 2,
        "flags-sot": 2,
        "flags-projection": 2,
        "move-sot-from": 2,
        "move-sot-to": 1,
        "move-proj-from": 2,
        "move-proj-to": 1,
        "expunge-sot": 2,
        "expunge-projection": 2,
        "no-counters": 2,
        "bad-projection-flags": 2,
        "orphan-projection-row": 0,
        "untouched": 2,
    }
    box = {name: boxes.create(USER, name) for name in sizes}
    for name, count in sizes.items():
        fill(boxes, box[name], count)
    assert_consistent(runtime, backend)

    # A death after the source of truth: the projection misses the change (missing, orphan or outdated
    # entry) and the counters too. A death after the projection: only the counters miss it.
    fault(boxes, AFTER_SOURCE_OF_TRUTH, lambda: boxes.append(box["append-sot"], message(10)))
    fault(boxes, AFTER_PROJECTION, lambda: boxes.append(box["append-projection"], message(11)))
    fault(boxes, AFTER_SOURCE_OF_TRUTH, lambda: boxes.set_flags(box["flags-sot"], 1, add=[SEEN]))
    fault(boxes, AFTER_PROJECTION, lambda: boxes.set_flags(box["flags-projection"], 1, add=[SEEN]))
    fault(boxes, AFTER_SOURCE_OF_TRUTH, lambda: boxes.move(box["move-sot-from"], 1, box["move-sot-to"]))
    fault(boxes, AFTER_PROJECTION, lambda: boxes.move(box["move-proj-from"], 1, box["move-proj-to"]))
    fault(boxes, AFTER_SOURCE_OF_TRUTH, lambda: boxes.expunge(box["expunge-sot"], [1]))
    fault(boxes, AFTER_PROJECTION, lambda: boxes.expunge(box["expunge-projection"], [2]))
    # Rows damaged directly.
    backend.lose_counters(box["no-counters"])
    (damaged,) = [
        e for e in backend.mailbox_state().projection if e[0] == box["bad-projection-flags"] and e[1] == 2
    ]
    backend.put_projection_entry(damaged[0], 2, damaged[2], "\\Flagged")
    backend.put_projection_entry(box["orphan-projection-row"], 7, "0" * 31 + "1", "")
    consistent_counters = {"bad-projection-flags", "orphan-projection-row", "untouched"}
    assert set(boxes.sample_drift(len(box))) == {box[name] for name in set(sizes) - consistent_counters}

    assert projection_disagreements(backend) == {kind: EXPECTED[kind] for kind in KINDS}

    result = recompute(deployment_resources)

    assert result.success
    assert checks_passed(result) == {"counters_match_source_of_truth": True}
    figures = materialized(result, "mailbox_counters")
    assert {key: figures[key] for key in EXPECTED} == EXPECTED
    assert_consistent(runtime, backend)
    assert boxes.counters(box["no-counters"]) == Counters(count=2, unseen=1)


EXPECTED = {
    "processed_mailboxes": 14,
    "failed_mailboxes": [],
    # every mailbox whose counters an operation missed, and the one with no counters row
    "corrected_counters": 11,
    # the source of the faulty move and of the faulty expunge, and the row inserted directly
    "orphan_projection_entry": 3,
    # the faulty append, and the target of the faulty move
    "missing_projection_entry": 2,
    # the faulty flag change, and the row damaged directly
    "outdated_projection_entry": 2,
    "projection_inconsistencies": 7,
}


class Traffic(threading.Thread):
    """Appends, flags, moves and expunges at random among the mailboxes, some of them dying half way."""

    def __init__(self, runtime: Runtime, mailboxes: list[MailboxId], stop: threading.Event) -> None:
        super().__init__(name="mailbox-traffic", daemon=True)
        self.boxes = runtime.mailboxes
        self.mailboxes = mailboxes
        self.stop = stop
        self.random = random.Random(23)
        self.operations = self.faults = 0
        self.error: BaseException | None = None

    def _operation(self) -> None:
        rng, boxes = self.random, self.boxes
        mailbox = rng.choice(self.mailboxes)
        uids = boxes.tables.uids(mailbox)
        kind = rng.choice(["append", "append", "flag", "move", "expunge"] if uids else ["append"])
        if kind == "append":
            boxes.append(mailbox, message(self.operations), flags=rng.choice([[], [SEEN]]))
        elif kind == "flag":
            boxes.set_flags(mailbox, rng.choice(uids), **{rng.choice(["add", "remove"]): [SEEN]})
        elif kind == "move":
            boxes.move(mailbox, rng.choice(uids), rng.choice([m for m in self.mailboxes if m != mailbox]))
        else:
            boxes.expunge(mailbox, [rng.choice(uids)])

    def run(self) -> None:
        deadline = time.monotonic() + 120
        try:
            while not self.stop.is_set() and time.monotonic() < deadline:
                if self.random.random() < 0.2:
                    self.boxes.faults.arm(self.random.choice([AFTER_SOURCE_OF_TRUTH, AFTER_PROJECTION]))
                try:
                    self._operation()
                except InjectedFault:
                    self.faults += 1
                self.operations += 1
                time.sleep(0.01)
        except BaseException as error:  # reported by the main thread
            self.error = error


def test_a_recompute_during_live_traffic_then_one_after_it_converge(
    backend: Backend, deployment_resources: dict
) -> None:
    runtime = backend.open()
    boxes = runtime.mailboxes
    mailboxes = [boxes.create(USER, f"box{n}") for n in range(4)]
    for mailbox in mailboxes:
        fill(boxes, mailbox, 5)
    fault(boxes, AFTER_PROJECTION, lambda: boxes.append(mailboxes[0], message(99)))  # drift before the run
    resources = deployment_resources

    stop = threading.Event()
    traffic = Traffic(runtime, mailboxes, stop)
    traffic.start()
    try:
        while traffic.operations < 20 and traffic.is_alive():
            time.sleep(0.05)
        during = recompute(resources)
    finally:
        stop.set()
        traffic.join(timeout=60)
    assert traffic.error is None and not traffic.is_alive()
    assert traffic.faults > 0 and traffic.operations > 20
    # The run itself never fails: a counter that moved under it is left for the next run, and its check
    # may fail, since the traffic went on after the recompute.
    figures = materialized(during, "mailbox_counters")
    assert figures["failed_mailboxes"] == [] and figures["processed_mailboxes"] == 4

    # Whatever the traffic and the first run left, a run on a quiet store repairs exactly that.
    drifting = boxes.sample_drift(len(mailboxes))
    disagreeing = projection_disagreements(backend)

    after = recompute(resources)

    assert after.success
    assert checks_passed(after) == {"counters_match_source_of_truth": True}
    settled = materialized(after, "mailbox_counters")
    assert settled["failed_mailboxes"] == []
    assert settled["corrected_counters"] == len(drifting)
    assert {kind: settled[kind] for kind in disagreeing} == disagreeing
    assert_consistent(runtime, backend)


def scoped(resources: dict, **config: object) -> dg.ExecuteInProcessResult:
    run_config = {"ops": {"mailbox_counters": {"config": config}}}
    return dg.materialize(ASSETS, resources=resources, run_config=run_config, raise_on_error=False)


def drifting(boxes: Mailboxes, mailbox: MailboxId) -> None:
    """Two messages (one seen), then a third unseen one whose counting a fault skipped: counters (2, 1)
    where the source of truth has (3, 2)."""
    fill(boxes, mailbox, 2)
    fault(boxes, AFTER_PROJECTION, lambda: boxes.append(mailbox, message(50)))


def test_a_scoped_recompute_reads_and_repairs_its_scope_only_with_values_before_and_after(
    backend: Backend, deployment_resources: dict, spark
) -> None:
    runtime = backend.open()
    boxes = runtime.mailboxes
    alice_inbox, alice_work = boxes.create(USER, "INBOX"), boxes.create(USER, "Work")
    bob_inbox = boxes.create("bob@example.com", "INBOX")
    for mailbox in (alice_inbox, alice_work, bob_inbox):
        drifting(boxes, mailbox)
    # Work's projection misses a message too: healed by the run scoped to alice, not by the one to INBOX.
    fault(boxes, AFTER_SOURCE_OF_TRUTH, lambda: boxes.append(alice_work, message(60), flags=[SEEN]))
    drift = {m: boxes.counters(m) for m in (alice_inbox, alice_work, bob_inbox)}

    # The scoped read names its mailboxes (a partition or index read on Cassandra): no other mailbox's rows.
    read = read_table(spark, Settings.from_url(backend.url()), "imap_uid_table", mailboxes=[alice_inbox])
    assert {row["mailbox_id"] for row in read.collect()} == {alice_inbox}

    one = scoped(deployment_resources, user=USER.upper(), mailbox="inbox")

    assert one.success
    assert checks_passed(one) == {"counters_match_source_of_truth": True}
    figures = materialized(one, "mailbox_counters")
    assert figures["scope"] == f"mailbox INBOX of {USER}"
    assert (figures["processed_mailboxes"], figures["corrected_counters"]) == (1, 1)
    assert figures["projection_inconsistencies"] == 0
    assert [record.data for record in figures["corrections"].records] == [
        {
            "user": USER,
            "mailbox": "INBOX",
            "count_before": 2,
            "count_after": 3,
            "unseen_before": 1,
            "unseen_after": 2,
        }
    ]
    assert boxes.counters(alice_inbox) == Counters(3, 2)
    assert {m: boxes.counters(m) for m in (alice_work, bob_inbox)} == {
        m: drift[m] for m in (alice_work, bob_inbox)
    }

    user = scoped(deployment_resources, user=USER)

    assert user.success
    figures = materialized(user, "mailbox_counters")
    assert (figures["processed_mailboxes"], figures["corrected_counters"]) == (2, 1)
    assert figures["missing_projection_entry"] == 1
    assert [
        (r.data["mailbox"], r.data["count_before"], r.data["count_after"])
        for r in figures["corrections"].records
    ] == [("Work", 2, 4)]
    assert boxes.counters(alice_work) == boxes.recount(alice_work) == Counters(4, 2)
    assert boxes.counters(bob_inbox) == drift[bob_inbox] != boxes.recount(bob_inbox)
    assert set(boxes.sample_drift(3)) == {bob_inbox}


def test_an_unknown_user_or_mailbox_fails_the_run_and_changes_nothing(
    backend: Backend, deployment_resources: dict
) -> None:
    runtime = backend.open()
    boxes = runtime.mailboxes
    inbox = boxes.create(USER, "INBOX")
    drifting(boxes, inbox)
    fault(boxes, AFTER_SOURCE_OF_TRUTH, lambda: boxes.append(inbox, message(60)))
    before = (backend.mailbox_state().projection, boxes.counters(inbox))

    for config, problem in (
        ({"user": "nobody@example.com"}, "unknown user nobody@example.com"),
        ({"user": USER, "mailbox": "Archive"}, "unknown mailbox 'Archive'"),
        ({"mailbox": "INBOX"}, "give its user too"),
        ({"max_repairs_per_second": 0.0}, "invalid rate"),
    ):
        result = scoped(deployment_resources, **config)
        assert not result.success
        (failure,) = [e for e in result.all_events if e.is_step_failure]
        assert problem in str(failure.step_failure_data.user_failure_data.description)
        assert (backend.mailbox_state().projection, boxes.counters(inbox)) == before
