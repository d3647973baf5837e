"""The maintenance commands of the `mailq` console script (`mailq_cli.pipeline_commands`, which
`mailq_cli.main` imports when one is named), run in-process with Spark local[2] on small data dirs: what
each run reports, what it changes, its JSON shape, its errors."""

from __future__ import annotations

import json

import pytest

from assets import definitions
from mailq_cli import demo
from mailq_cli.main import main
from mailq_cli.pipeline_output import describe_run
from mailq_runtime import InvalidInput, Mail, Runtime
from mailq_runtime.clock import MICROS_PER_SECOND, system_clock
from mailq_runtime.faults import AFTER_PROJECTION, AFTER_SOURCE_OF_TRUTH
from mailq_runtime.mailbox import INBOX, SEEN
from mailq_runtime.settings import Settings
from mailq_runtime.worker import run_worker
from resources import MailqRuntime
from tests.runtime.backends import EmbeddedBackend
from tests.runtime.test_store_files import snapshot

LOCAL = "example.org"
USERS = ("alice@example.org", "bob@example.org", "carol@example.org")
SPAMMER = "promo@deals.example"


@pytest.fixture(scope="module", autouse=True)
def spark_environment():
    """Spark on two local cores, bound to the loopback; runs on an ephemeral Dagster instance."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
        patch.setenv("MAILQ_SPARK_CONF", "spark.master=local[2]")
        for name in ("DAGSTER_HOME", "MAILQ_URL", "MAILQ_PIPELINE_DIR"):
            patch.delenv(name, raising=False)
        yield


def message(sender: str, recipient: str, body: str) -> bytes:
    return f"From: {sender}\r\nTo: {recipient}\r\nSubject: test\r\n\r\n{body}\r\n".encode()


def traffic(url: str) -> None:
    """Nine mails delivered to three INBOXes, one expunged, three spam mails removed from the queue: the
    spam's and the expunged message's blobs have no reference left; the others live in the mailboxes."""
    with Runtime.open(url, create=True) as runtime:
        for user in USERS:  # the local users, as `mailq users add` makes them
            runtime.mailboxes.create(user, INBOX)
        queue = runtime.queue("spool")
        for n in range(9):
            user = USERS[n % 3]
            mail = Mail(recipients=(user,), sender="dave@example.net", message=message("dave", user, f"m{n}"))
            queue.enqueue(mail)
        run_worker(runtime, "spool", local_domains=[LOCAL], idle_timeout=0.2)
        for n in range(3):
            spam = Mail(recipients=(USERS[0],), sender=SPAMMER, message=message(SPAMMER, USERS[0], f"s{n}"))
            queue.enqueue(spam)
        assert queue.remove(sender=SPAMMER) == 3
        inbox = runtime.mailboxes.get(USERS[1], INBOX)
        assert runtime.mailboxes.expunge(inbox, [runtime.mailboxes.list_messages(inbox)[0].uid]) == 1


def probes(url: str) -> EmbeddedBackend:
    return EmbeddedBackend(Settings.from_url(url).data_dir)


def tables(url: str) -> tuple[int, int]:
    """How many blob rows and deletions there are."""
    state = probes(url).blob_state()
    return len(state.blobs), len(state.deletions)


@pytest.fixture
def mailq_json(mailq):
    """As the package's, but a pipeline command may note things on stderr."""

    def run(*args: str) -> dict:
        status, out, err = mailq("--json", *args)
        assert status == 0, (out, err)
        return json.loads(out)

    return run


def assert_bad_input(result: tuple[int, str, str], *words: str) -> None:
    status, out, err = result
    assert (status, out) == (2, "")
    assert err.startswith("mailq: error: ") and err.count("\n") == 1, err
    for word in words:
        assert word in err


def test_gc_dry_run_then_collect_after_two_rotations(url, mailq, mailq_json):
    traffic(url)
    blobs = len(probes(url).blob_state().blobs)

    assert mailq_json("generation", "rotate") == {
        "reference_generation": 2,
        "gc_iteration": 2,
        "eligible_generations": [],
    }
    status, out, _ = mailq("generation", "rotate")
    assert status == 0
    assert out == "rotated to reference generation rg3, GC iteration gci3; eligible for collection: rg1\n"

    dry = mailq_json("gc", "--dry-run")

    assert set(dry) == {"job", "run_id", "success", "assets", "checks", "failures", "seconds", "instance"}
    assert dry["job"] == "gc_plan_job"
    assert list(dry["assets"]) == [
        "reference_generations",
        "deletion_sets",
        "live_reference_filter",
        "gc_plan",
    ]
    assert dry["assets"]["reference_generations"]["eligible_generations"] == [1]
    figures = dry["assets"]["gc_plan"]
    # The spam's header (the same for all three: stored once) and bodies, the expunged message's body;
    # the Bloom filter may keep one back as a false positive (1% each, a new salt every run).
    garbage = 5
    assert figures["blobs_to_delete"] + figures["kept_by_filter_false_positive"] == garbage
    assert figures["kept_still_referenced"] > 0  # the queue's deletions of blobs the INBOX copies still use
    assert (dry["success"], dry["failures"], dry["instance"]) == (True, [], None)
    assert len(probes(url).blob_state().blobs) == blobs

    status, out, err = mailq("gc")

    assert status == 0, err
    state = probes(url).blob_state()
    collected = blobs - len(state.blobs)
    left = sum(
        generation == 1 and blob_id not in state.referenced() for blob_id, generation in state.blobs.items()
    )
    assert collected + left == garbage  # what a false positive kept back waits for the next iteration
    assert f"collected    {collected} of " in out and "check        no_live_blob_collected: passed" in out
    assert out.splitlines()[-1].startswith("run          ") and "ephemeral" in out
    with Runtime.open(url) as runtime:  # every message is still readable
        for mailbox in runtime.mailboxes.list():
            for entry in runtime.mailboxes.list_messages(mailbox):
                assert runtime.mailboxes.read(mailbox, entry.uid).startswith(b"From: ")


def test_exact_gc_with_orphans_and_a_failed_check_exits_1(url, mailq, capsys):
    traffic(url)
    for _ in range(2):
        assert mailq("generation", "rotate")[0] == 0
    # A referenced blob gone, which the collector must never cause; and a blob nothing names.
    damaged = probes(url)
    referenced = [blob_id for _, blob_id, _ in damaged.blob_state().references]
    once = next(blob_id for blob_id in referenced if referenced.count(blob_id) == 1)
    damaged.damage_blob_rows(lose=once, add=("g1_" + "0" * 64, 1))

    status, out, _ = mailq("--json", "gc", "--exact", "--orphans")

    report = json.loads(out)
    assert status == 1 and report["success"] is False
    assert report["assets"]["collected_blobs"]["mode"] == "exact anti-join"
    # The row nothing names (the content whose row went is still referenced: not an orphan).
    assert report["assets"]["orphan_blobs"]["orphans_found"] == 1
    assert report["checks"]["no_live_blob_collected"]["passed"] is True  # it took no referenced blob
    check = report["checks"]["every_reference_finds_its_blob"]
    assert check["passed"] is False and check["metadata"]["dangling_references"] == 1
    text = "\n".join(describe_run(report))
    assert "check        every_reference_finds_its_blob: FAILED" in text and "dangling_references: 1" in text
    assert "orphans      1 orphan blob(s), 1 deleted" in text


def test_gc_plan_reviewed_applied_and_its_blobs_explained(url, mailq, mailq_json):
    traffic(url)
    for _ in range(2):
        assert mailq("generation", "rotate")[0] == 0
    with Runtime.open(url) as runtime:
        fresh = str(runtime.blobs.save("fresh-owner", b"saved in the current generation"))
    state = probes(url).blob_state()
    live = min(set(state.deleted()) & state.referenced())
    before = tables(url)

    report = mailq_json("gc", "--dry-run", "--exact")

    plan = report["assets"]["gc_plan"]
    plan_id = plan["plan_id"]
    assert (plan["mode"], plan["blobs_to_delete"], plan["kept_by_filter_false_positive"]) == (
        "exact anti-join",
        5,
        0,
    )
    assert {b["found_by"] for b in plan["blobs"]} == {"exact anti-join"}
    text = describe_run(report)
    assert any(line.startswith(f"plan         {plan_id}: would delete 5 of ") for line in text)
    assert f"plan         review it, then: mailq gc --apply {plan_id}" in text
    assert "plan         no Bloom filter was built" in text  # exact: the mark built none
    assert tables(url) == before
    planned = plan["blobs"][0]["blob_id"]
    status, out, _ = mailq("blobs", "explain", planned)
    assert status == 0
    assert f"last GC      in plan {plan_id} of " in out and "not applied since: exact anti-join" in out
    assert "references   0" in out and "blobs row    yes" in out
    owners = plan["blobs"][0]["owners"].split(", ")  # the releases that made it garbage, named by both
    assert owners and all(f"released by {owner}\n" in out + "\n" for owner in owners)

    # Refused before anything runs: a plan that does not exist, a malformed id, options beside --apply.
    assert_bad_input(mailq("gc", "--apply", "20260101T000000Z-0badc0de"), "unknown GC plan 20260101T000000Z")
    assert_bad_input(mailq("gc", "--apply", "../pipeline"), "invalid GC plan id")
    assert_bad_input(mailq("gc", "--apply", plan_id, "--exact"), "takes no other option")
    assert tables(url) == before

    status, out, err = mailq("gc", "--apply", plan_id)

    assert status == 0, err
    assert f"applied      plan {plan_id}: 5 of 5 blob(s) deleted" in out and "none kept" in out
    assert tables(url)[0] == before[0] - 5
    again = mailq_json("gc", "--apply", plan_id)["assets"]["applied_gc_plan"]
    assert (again["deleted_blobs"], again["kept"]) == (
        0,
        [{"reason": "kept: gone already (no blobs row)", "blobs": 5}],
    )
    assert again["note"].startswith("nothing deleted: the plan's 5 blob(s) are all gone already")
    assert mailq("gc")[0] == 0  # finds the live blobs' deletions: kept, still referenced

    explained = {}
    for blob_id in (planned, live, fresh):
        status, out, _ = mailq("--json", "blobs", "explain", blob_id)
        assert status == 0
        explained[blob_id] = json.loads(out)
    deleted = explained[planned]
    assert (deleted["blobs_row"], deleted["content"], deleted["references"]) == (False, False, [])
    assert deleted["last_gc"]["outcome"] == "deleted" and deleted["last_gc"]["plan_id"] == plan_id
    assert deleted["last_gc"]["summary"].startswith("deleted by run ")
    kept = explained[live]
    assert (kept["state"], kept["blobs_row"], kept["content"]) == ("eligible", True, True)
    assert kept["references"] and kept["deletions"]
    assert kept["last_gc"]["outcome"] == "kept: still referenced" and kept["last_gc"]["plan_id"] is None
    never = explained[fresh]
    assert (never["state"], never["references"], never["deletions"]) == (
        "current",
        [{"owner": "fresh-owner", "generation": 3}],
        [],
    )
    assert never["last_gc"] == {"summary": "never examined by a GC run or plan kept here"}

    assert_bad_input(mailq("blobs", "explain", "g1_not-a-hash"), "invalid blob id")
    status, out, _ = mailq("blobs", "explain", "g1_" + "0" * 64)
    assert status == 0 and "nothing of this blob anywhere" in out


def test_counters_recompute_repairs_what_a_fault_left(url, mailq, mailq_json):
    traffic(url)
    with Runtime.open(url) as runtime:
        mailboxes = runtime.mailboxes
        alice, carol = mailboxes.get(USERS[0], INBOX), mailboxes.get(USERS[2], INBOX)
        for inbox, point in ((alice, AFTER_PROJECTION), (carol, AFTER_SOURCE_OF_TRUTH)):
            mailboxes.faults.arm(point)
            with pytest.raises(RuntimeError, match="fault injected"):
                mailboxes.set_flags(inbox, mailboxes.list_messages(inbox)[0].uid, add=[SEEN])
        assert mailboxes.counters(alice) != mailboxes.recount(alice)

    report = mailq_json("counters", "recompute")

    figures = report["assets"]["mailbox_counters"]
    assert (figures["processed_mailboxes"], figures["corrected_counters"]) == (3, 2)
    assert (figures["projection_inconsistencies"], figures["outdated_projection_entry"]) == (1, 1)
    assert report["checks"]["counters_match_source_of_truth"]["passed"] is True
    with Runtime.open(url) as runtime:
        for mailbox in runtime.mailboxes.list():
            assert runtime.mailboxes.counters(mailbox) == runtime.mailboxes.recount(mailbox)
    again = mailq_json("counters", "recompute")["assets"]["mailbox_counters"]
    assert again["corrections"] == [] and "nothing corrected" in again["corrections_note"]

    # Each correction names the mailbox by its owner and name, with its counters before and after.
    corrections = {(c["user"], c["mailbox"]): c for c in figures["corrections"]}
    assert set(corrections) == {(USERS[0], INBOX), (USERS[2], INBOX)}
    assert all(c["count_before"] == c["count_after"] for c in corrections.values())
    assert all(c["unseen_before"] != c["unseen_after"] for c in corrections.values())
    text = describe_run(report)
    # A correction's line: the mailbox, its figures, then its owner (assets/mailboxes.py's columns).
    assert any(line.split()[0] == INBOX and line.split()[-1] == USERS[0] for line in text)
    assert "counters     3 mailbox(es) processed, 2 counter(s) corrected, 0 failed" in text
    assert "projection   1 entry healed from the source of truth (0 orphan, 0 missing, 1 outdated)" in text


def test_counters_recompute_scoped_to_a_user_paced_and_listed_with_a_cap(url, mailq, mailq_json):
    # 22 of alice's mailboxes and bob's INBOX each hold one unseen message their counters missed.
    with Runtime.open(url, create=True) as runtime:
        boxes = runtime.mailboxes
        names = {}
        for user, name in [*((USERS[0], f"box{n:02d}") for n in range(22)), (USERS[1], INBOX)]:
            names[user, name] = mailbox = boxes.create(user, name)
            boxes.faults.arm(AFTER_PROJECTION)
            with pytest.raises(RuntimeError, match="fault injected"):
                boxes.append(mailbox, message("dave", user, name))
    before = snapshot(Settings.from_url(url).data_dir)

    assert_bad_input(mailq("counters", "recompute", "--user", "nobody@example.org"), "unknown user")
    assert_bad_input(
        mailq("counters", "recompute", "--user", USERS[0], "--mailbox", INBOX), "unknown mailbox 'INBOX'"
    )
    assert_bad_input(mailq("counters", "recompute", "--mailbox", INBOX), "give its user too")
    assert_bad_input(mailq("counters", "recompute", "--rate", "0"), "invalid rate")
    assert snapshot(Settings.from_url(url).data_dir) == before

    report = mailq_json("counters", "recompute", "--user", USERS[0].upper(), "--rate", "10")

    figures = report["assets"]["mailbox_counters"]
    assert (figures["processed_mailboxes"], figures["corrected_counters"], figures["repairs"]) == (22, 22, 22)
    # 22 repairs at 10 a second: 2.1 s at least from the first to the last.
    assert 2.1 <= figures["repair_seconds"] < 10
    assert figures["corrections"][0] == {
        "user": USERS[0],
        "mailbox": "box00",
        "count_before": 0,
        "count_after": 1,
        "unseen_before": 0,
        "unseen_after": 1,
    }
    assert report["checks"]["counters_match_source_of_truth"]["passed"] is True
    text = describe_run(report)
    assert f"scope        the mailboxes of {USERS[0]}; repairs at most 10 a second" in text
    listed = [line for line in text if line.split()[-1:] == [USERS[0]]]
    assert [line.split()[0] for line in listed] == [f"box{n:02d}" for n in range(20)]
    assert "    ... and 2 more" in text
    with Runtime.open(url) as runtime:
        boxes = runtime.mailboxes
        for (user, _), mailbox in names.items():
            assert (boxes.counters(mailbox) == boxes.recount(mailbox)) is (user == USERS[0])

    one = mailq_json("counters", "recompute", "--user", USERS[1], "--mailbox", "inbox")["assets"]
    assert one["mailbox_counters"]["scope"] == f"mailbox INBOX of {USERS[1]}"
    assert [c["mailbox"] for c in one["mailbox_counters"]["corrections"]] == [INBOX]


def test_queue_cleanup_advances_browse_start_and_deletes_old_slices(url, mailq_json):
    # Mails enqueued and delivered three hours ago; browse_start stayed where they were.
    three_hours_ago = system_clock() - 3 * 3600 * MICROS_PER_SECOND
    with Runtime(Settings.from_url(url), lambda: three_hours_ago, create=True) as runtime:
        queue = runtime.queue("spool")
        for n in range(4):
            queue.enqueue(Mail(recipients=(USERS[0],), message=message("d", USERS[0], f"{n}")))
        while (item := queue.dequeue(timeout=0)) is not None:
            item.done()
        before = queue.maintenance.browse_start()
    assert probes(url).queue_rows("spool").rows() == 4

    report = mailq_json("queue", "cleanup")

    assert list(report["assets"]) == ["mail_queue_slices", "mail_queue_cleanup"]
    assert report["assets"]["mail_queue_slices"]["live_mails"] == 0
    assert report["assets"]["mail_queue_cleanup"]["queues_cleaned"] == 1
    assert {name for name, check in report["checks"].items() if check["passed"]} == {
        "slice_counters_match_recount",
        "browse_start_not_ahead_of_live_mail",
    }
    assert probes(url).queue_rows("spool").rows() == 0
    with Runtime.open(url) as runtime:
        assert runtime.queue("spool").maintenance.browse_start() > before


def test_demo_end_to_end(tmp_path, capsys):
    data_dir = tmp_path / "demo"

    assert main(["--json", "demo", "--mails", "200", "--data-dir", str(data_dir)]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)

    assert "[5/5] pipeline" in captured.err
    assert summary["generations"]["eligible"] == [1]
    assert summary["collected"]["blobs"] > 0 and summary["collected"]["bytes"] > 0
    assert summary["collected"]["kept_still_referenced"] > 0
    assert len(summary["faults"]) == 4
    assert summary["repaired"]["counters"] >= 4 and summary["repaired"]["projection_entries"] >= 2
    pipeline = summary["pipeline"]
    assert pipeline["success"] is True
    assert set(pipeline["assets"]) == {
        "reference_generations",
        "deletion_sets",
        "live_reference_filter",
        "collected_blobs",
        "orphan_blobs",
        "gc_plan",
        "applied_gc_plan",
        "mailbox_counters",
        "mail_queue_slices",
        "mail_queue_cleanup",
        # The overviews too: every asset's page in the UI has a materialisation after the demo.
        "mail_queue_overview",
        "mail_queue_domains",
        "mail_queue_dead_letters",
    }
    assert len(pipeline["checks"]) == 6 and all(c["passed"] for c in pipeline["checks"].values())
    assert [run["job"] for run in pipeline["runs"]] == [
        "blob_gc_and_orphan_sweep_job",
        "gc_plan_job",
        "gc_apply_job",
        "maintenance_job",
        "queue_overview_job",
        "dead_letters_job",
    ]
    overview = pipeline["assets"]["mail_queue_overview"]
    assert overview["live_mails"] == summary["mailboxes"]["queue_size_after"]
    plan, applied = pipeline["assets"]["gc_plan"], pipeline["assets"]["applied_gc_plan"]
    assert applied["deleted_blobs"] == plan["blobs_to_delete"]
    tables = summary["tables"]
    assert tables["after"]["blobs"] == tables["before"]["blobs"] - summary["collected"]["blobs"]
    text = "\n".join(demo.describe(summary))
    for heading in (
        "collected    ",
        "repaired     ",
        "cleaned      ",
        "checks       6 of 6 passed",
        "queues       ",
    ):
        assert heading in text


def test_bad_input_exits_2_with_one_line_and_changes_nothing(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "missing"

    def run(*args: str) -> tuple[int, str, str]:
        status = main(list(args))
        captured = capsys.readouterr()
        return status, captured.out, captured.err

    assert_bad_input(run("--url", f"embedded://{missing}", "gc"), "no mailq data")
    assert_bad_input(run("--url", f"embedded://{missing}", "generation", "rotate"), "no mailq data")
    assert not missing.exists()
    assert_bad_input(run("--url", "redis://nowhere", "counters", "recompute"), "unsupported mailq URL")
    # The store is opened before Dagster and Spark start: one that cannot be reached is one line (its bucket
    # is looked at first, and without credentials it is not reached).
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(variable, raising=False)
    unreachable = run(
        "--url", "cassandra://db1/mailq?s3=mail-blobs&broker=embedded:/var/lib/mailq", "counters", "recompute"
    )
    assert_bad_input(unreachable, "S3 bucket 'mail-blobs' at AWS S3: no credentials found")
    assert_bad_input(run("generation"), "required")
    assert_bad_input(run("queue", "purge"), "invalid choice")
    assert_bad_input(run("demo", "--mails", "5", "--data-dir", str(tmp_path / "d")), "at least 10 mails")
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "precious.txt").write_text("keep me")
    assert_bad_input(run("demo", "--data-dir", str(tmp_path / "keep")), "refusing to wipe")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "no-such-home"))
    assert_bad_input(run("demo", "--data-dir", str(tmp_path / "keep")), "DAGSTER_HOME")
    assert (tmp_path / "keep" / "precious.txt").read_text() == "keep me"


def test_the_demo_makes_its_deployment_and_never_wipes_one_a_url_names(tmp_path, monkeypatch, capsys):
    store = tmp_path / "store"
    traffic(f"embedded://{store}")
    before = snapshot(store)

    def run(*args: str) -> tuple[int, str, str]:
        status = main(list(args))
        captured = capsys.readouterr()
        return status, captured.out, captured.err

    assert_bad_input(run("--url", f"embedded://{store}", "demo"), "holds a mailq store already")
    monkeypatch.setenv("MAILQ_URL", f"embedded://{store}")
    assert_bad_input(run("demo"), "holds a mailq store already")
    both = run("--url", f"embedded://{tmp_path / 'new'}", "demo", "--data-dir", str(store))
    assert_bad_input(both, "not both")
    assert_bad_input(run("demo", "--mails", "5"), "at least 10 mails")
    assert snapshot(store) == before
    assert not (tmp_path / "new").exists()
    with Runtime.open(f"embedded://{store}") as runtime:
        assert runtime.queue("spool").size() == 0 and len(runtime.mailboxes.list()) == 3


def test_the_runtime_commands_are_all_still_there(url, mailq, mailq_json, capsys):
    assert main(["--help"]) == 0
    help_text = capsys.readouterr().out
    for command in ("queues", "enqueue", "worker", "config", "gc", "counters", "queue", "generation", "demo"):
        assert f"    {command} " in help_text or f"    {command}\n" in help_text
    traffic(url)
    assert [(q["name"], q["size"]) for q in mailq_json("queues")] == [("spool", 0)]
    assert_bad_input(mailq("size", "nope"), "unknown queue")


@pytest.mark.parametrize("url", ["redis://admin:secret@host/0", "embedded://admin:secret@data"])
def test_a_url_with_a_password_never_reaches_the_pipeline_or_its_output(tmp_path, monkeypatch, capsys, url):
    monkeypatch.chdir(tmp_path)
    for command in (
        ["gc"],
        ["--json", "gc", "--dry-run"],
        ["counters", "recompute"],
        ["generation", "rotate"],
    ):
        for argv in (["--url", url, *command], command):
            monkeypatch.setenv("MAILQ_URL", url)
            status = main(argv)
            captured = capsys.readouterr()
            assert_bad_input((status, captured.out, captured.err), "carries a password", ":***@")
            assert "secret" not in captured.out + captured.err
    # The Dagster side: the resource and the pipeline's output dir refuse it the same way.
    for attempt in (lambda: MailqRuntime(url=url).runtime, lambda: definitions.resources_config(url)):
        with pytest.raises(InvalidInput, match="carries a password") as refused:
            attempt()
        assert "secret" not in str(refused.value)
    assert list(tmp_path.iterdir()) == []
