"""Mailboxes and their counters (record 23): operations keep the projections equal to the source of truth,
each injected fault leaves exactly the inconsistency the record describes, uids strictly increase under
concurrency, and bad input changes nothing."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable

import pytest

from mailq_runtime import (
    Counters,
    InjectedFault,
    InvalidInput,
    MailboxId,
    Runtime,
    UnknownMailbox,
)
from mailq_runtime.faults import AFTER_PROJECTION, AFTER_SOURCE_OF_TRUTH
from mailq_runtime.mailboxes import Mailboxes

from .backends import Backend
from .mailbox_checks import (
    Inconsistencies,
    agent,
    assert_message_blobs_referenced,
    inconsistencies,
    results,
)

USER = "alice@example.org"


def message(n: int = 1, body: bytes | None = None) -> bytes:
    return f"Subject: message {n}\r\nFrom: bob@example.org\r\n\r\n".encode() + (
        body or f"body {n}\r\n".encode()
    )


def assert_consistent(backend: Backend) -> None:
    assert not inconsistencies(backend), inconsistencies(backend)
    assert_message_blobs_referenced(backend)


@pytest.fixture
def mailboxes(runtime: Runtime) -> Mailboxes:
    return runtime.mailboxes


# mailboxes
def test_create_get_and_list_mailboxes(runtime: Runtime, mailboxes: Mailboxes, backend: Backend) -> None:
    inbox = mailboxes.create("Alice@Example.org", "inbox")
    archive = mailboxes.create(USER, "Archive.2024")
    other = mailboxes.create("bob@example.org", "INBOX")
    found = mailboxes.get("ALICE@example.org", "INBOX")
    assert (found.id, found.user, found.name) == (inbox, USER, "INBOX")
    assert [m.id for m in mailboxes.list(USER)] == [archive, inbox]
    assert {m.id for m in mailboxes.list()} == {inbox, archive, other}
    assert mailboxes.get_or_create(USER, "INBOX") == inbox
    created = mailboxes.get_or_create(USER, "Sent Items")
    assert mailboxes.get(USER, "Sent Items").id == created
    assert mailboxes.counters(inbox) == Counters(0, 0)
    assert_consistent(backend)


def test_a_maintenance_scope_is_all_a_users_or_one_mailbox_and_an_unknown_one_is_refused(
    mailboxes: Mailboxes,
) -> None:
    inbox, archive = mailboxes.create(USER, "INBOX"), mailboxes.create(USER, "Archive")
    other = mailboxes.create("bob@example.org", "INBOX")
    assert {m.id for m in mailboxes.scope()} == {inbox, archive, other}
    assert [m.id for m in mailboxes.scope("Alice@Example.org")] == [archive, inbox]
    assert [m.id for m in mailboxes.scope(USER, "inbox")] == [inbox]
    with pytest.raises(UnknownMailbox, match="unknown user carol@example.org: no mailbox"):
        mailboxes.scope("carol@example.org")
    with pytest.raises(UnknownMailbox, match="unknown mailbox 'Sent' of alice@example.org"):
        mailboxes.scope(USER, "Sent")
    with pytest.raises(InvalidInput, match="give its user too"):
        mailboxes.scope(None, "INBOX")
    with pytest.raises(InvalidInput, match="invalid mail address"):
        mailboxes.scope("not an address")


def test_get_or_create_is_safe_when_workers_race(
    runtime: Runtime, mailboxes: Mailboxes, backend: Backend
) -> None:
    start = threading.Barrier(6)
    ids: list[MailboxId] = []

    def ensure() -> None:
        start.wait()
        ids.append(mailboxes.get_or_create(USER, "INBOX"))

    threads = [threading.Thread(target=ensure) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(ids) == 6 and len(set(ids)) == 1
    assert len(backend.mailbox_state().mailboxes) == 1


# messages
def test_append_read_and_list(runtime: Runtime, mailboxes: Mailboxes, backend: Backend) -> None:
    inbox = mailboxes.create(USER, "INBOX")
    first = mailboxes.append(inbox, message(1))
    second = mailboxes.append(inbox, message(2), flags=["\\seen", "$Important", "\\FLAGGED"])
    assert (first.uid, second.uid) == (1, 2)
    assert mailboxes.read(inbox, 2) == message(2)
    listed = mailboxes.list_messages(inbox)
    assert [(m.uid, m.message_id) for m in listed] == [(1, first.message_id), (2, second.message_id)]
    assert listed[1].flags == {"\\Seen", "$Important", "\\Flagged"}
    assert mailboxes.counters(inbox) == Counters(2, 1)
    assert mailboxes.locate(first.message_id) == {inbox: 1}
    assert_consistent(backend)


def test_append_with_a_message_id_is_idempotent(
    runtime: Runtime, mailboxes: Mailboxes, backend: Backend
) -> None:
    inbox = mailboxes.create(USER, "INBOX")
    message_id = "0123456789abcdef0123456789abcdef"
    appended = mailboxes.append(inbox, message(1), message_id=message_id)
    before = backend.state()
    assert mailboxes.append(inbox, message(1), message_id=message_id) == appended == (message_id, 1)
    assert backend.state() == before


def test_set_flags_moves_the_unseen_counter(runtime: Runtime, mailboxes: Mailboxes, backend: Backend) -> None:
    inbox = mailboxes.create(USER, "INBOX")
    for n in range(3):
        mailboxes.append(inbox, message(n))
    assert mailboxes.set_flags(inbox, 2, add=["\\Seen", "$Label"]) == {"\\Seen", "$Label"}
    assert mailboxes.counters(inbox) == Counters(3, 2)
    assert mailboxes.set_flags(inbox, 2, add=["\\Seen"]) == {"\\Seen", "$Label"}  # no change, no write
    assert mailboxes.set_flags(inbox, 2, remove=["\\Seen"]) == {"$Label"}
    assert mailboxes.counters(inbox) == Counters(3, 3)
    assert_consistent(backend)


def test_move_keeps_flags_and_content_and_gives_a_new_uid(
    runtime: Runtime, mailboxes: Mailboxes, backend: Backend
) -> None:
    inbox, archive = mailboxes.create(USER, "INBOX"), mailboxes.create(USER, "Archive")
    mailboxes.append(archive, message(0))
    moved = mailboxes.append(inbox, message(1), flags=["\\Seen"])
    held = backend.blob_state().held()[moved.message_id]
    assert mailboxes.move(inbox, moved.uid, archive) == 2
    assert mailboxes.list_messages(inbox) == []
    assert mailboxes.list_messages(archive)[1].flags == {"\\Seen"}
    assert mailboxes.read(archive, 2) == message(1)
    assert (mailboxes.counters(inbox), mailboxes.counters(archive)) == (Counters(0, 0), Counters(2, 1))
    assert backend.blob_state().held()[moved.message_id] == held
    assert_consistent(backend)


def test_expunge_releases_the_blobs_of_a_message_in_no_mailbox(
    runtime: Runtime, mailboxes: Mailboxes, backend: Backend
) -> None:
    inbox = mailboxes.create(USER, "INBOX")
    gone = mailboxes.append(inbox, message(1, b"shared body\r\n"))
    kept = mailboxes.append(inbox, message(2, b"shared body\r\n"))
    runtime.generations.rotate()
    header, body = backend.mailbox_state().messages[gone.message_id]
    assert mailboxes.expunge(inbox, [gone.uid]) == 1
    assert gone.message_id not in backend.blob_state().held()
    assert list(backend.mailbox_state().messages) == [kept.message_id]
    assert sorted((b, i) for b, _, i in backend.blob_state().deletions) == sorted([(header, 2), (body, 2)])
    # The body both messages share, stored once, stays referenced by the one still in the mailbox.
    assert body in backend.blob_state().held()[kept.message_id]
    with pytest.raises(UnknownMailbox):
        mailboxes.read(inbox, gone.uid)
    assert mailboxes.read(inbox, kept.uid) == message(2, b"shared body\r\n")
    assert mailboxes.counters(inbox) == Counters(1, 1)
    # UIDs are never reused.
    assert mailboxes.append(inbox, message(3)).uid == 3
    assert_consistent(backend)


def test_delete_mailbox_expunges_everything_and_drops_its_counters(
    runtime: Runtime, mailboxes: Mailboxes, backend: Backend
) -> None:
    inbox, archive = mailboxes.create(USER, "INBOX"), mailboxes.create(USER, "Archive")
    for n in range(3):
        mailboxes.append(archive, message(n))
    kept = mailboxes.append(inbox, message(9))
    assert mailboxes.delete_mailbox(archive) == 3
    with pytest.raises(UnknownMailbox):
        mailboxes.get(USER, "Archive")
    with pytest.raises(UnknownMailbox):
        mailboxes.counters(archive)
    assert list(backend.mailbox_state().counters) == [inbox]
    assert set(backend.blob_state().held()) == {kept.message_id}
    assert_consistent(backend)


def test_a_sequence_of_operations_keeps_counters_equal_to_a_recount(
    runtime: Runtime, mailboxes: Mailboxes, backend: Backend
) -> None:
    choose = random.Random(23)
    boxes = [mailboxes.create(USER, name) for name in ("INBOX", "Archive", "Trash")]
    for step in range(120):
        box = choose.choice(boxes)
        uids = [entry.uid for entry in mailboxes.list_messages(box)]
        operation = choose.choice(["append", "append", "flag", "move", "expunge"]) if uids else "append"
        if operation == "append":
            mailboxes.append(box, message(step), flags=choose.choice([(), ["\\Seen"], ["\\Flagged"]]))
        elif operation == "flag":
            flag = choose.choice(["\\Seen", "\\Answered", "$Work"])
            change = {"add": [flag]} if choose.random() < 0.5 else {"remove": [flag]}
            mailboxes.set_flags(box, choose.choice(uids), **change)
        elif operation == "move":
            mailboxes.move(box, choose.choice(uids), choose.choice([b for b in boxes if b != box]))
        else:
            mailboxes.expunge(box, choose.sample(uids, min(len(uids), 2)))
    assert_consistent(backend)
    assert sum(mailboxes.counters(box).count for box in boxes) == len(backend.mailbox_state().messages)


# faults between the writes: exactly record 23's inconsistencies
def _one_message(mailboxes: Mailboxes) -> tuple[MailboxId, MailboxId, str]:
    inbox, archive = mailboxes.create(USER, "INBOX"), mailboxes.create(USER, "Archive")
    return inbox, archive, mailboxes.append(inbox, message(1)).message_id


# Each case: the operation, then the expected inconsistencies from its ids (inbox, archive, message id) and
# the message id appended by the operation (append only). Counters are (stored, recounted).
CASES: dict[tuple[str, str], tuple[Callable, Callable]] = {
    ("append", AFTER_SOURCE_OF_TRUTH): (
        lambda m, inbox, archive: m.append(inbox, message(2)),
        lambda inbox, archive, first, new: Inconsistencies(
            {inbox: ((1, 1), (2, 2))}, {(inbox, 2, new, "")}, set()
        ),
    ),
    ("append", AFTER_PROJECTION): (
        lambda m, inbox, archive: m.append(inbox, message(2)),
        lambda inbox, archive, first, new: Inconsistencies({inbox: ((1, 1), (2, 2))}),
    ),
    ("set_flags", AFTER_SOURCE_OF_TRUTH): (
        lambda m, inbox, archive: m.set_flags(inbox, 1, add=["\\Seen"]),
        lambda inbox, archive, first, new: Inconsistencies(
            {inbox: ((1, 1), (1, 0))}, {(inbox, 1, first, "\\Seen")}, {(inbox, 1, first, "")}
        ),
    ),
    ("set_flags", AFTER_PROJECTION): (
        lambda m, inbox, archive: m.set_flags(inbox, 1, add=["\\Seen"]),
        lambda inbox, archive, first, new: Inconsistencies({inbox: ((1, 1), (1, 0))}),
    ),
    ("move", AFTER_SOURCE_OF_TRUTH): (
        lambda m, inbox, archive: m.move(inbox, 1, archive),
        lambda inbox, archive, first, new: Inconsistencies(
            {inbox: ((1, 1), (0, 0)), archive: ((0, 0), (1, 1))},
            {(archive, 1, first, "")},
            {(inbox, 1, first, "")},
        ),
    ),
    ("move", AFTER_PROJECTION): (
        lambda m, inbox, archive: m.move(inbox, 1, archive),
        lambda inbox, archive, first, new: Inconsistencies(
            {inbox: ((1, 1), (0, 0)), archive: ((0, 0), (1, 1))}
        ),
    ),
    ("expunge", AFTER_SOURCE_OF_TRUTH): (
        lambda m, inbox, archive: m.expunge(inbox, [1]),
        lambda inbox, archive, first, new: Inconsistencies(
            {inbox: ((1, 1), (0, 0))}, set(), {(inbox, 1, first, "")}
        ),
    ),
    ("expunge", AFTER_PROJECTION): (
        lambda m, inbox, archive: m.expunge(inbox, [1]),
        lambda inbox, archive, first, new: Inconsistencies({inbox: ((1, 1), (0, 0))}),
    ),
}


@pytest.mark.parametrize(("operation", "point"), list(CASES), ids=[f"{o}-{p}" for o, p in CASES])
def test_a_fault_between_the_writes_leaves_exactly_the_expected_inconsistency(
    runtime: Runtime, mailboxes: Mailboxes, operation: str, point: str, backend: Backend
) -> None:
    act, expected = CASES[operation, point]
    inbox, archive, first = _one_message(mailboxes)
    known = set(backend.mailbox_state().messages)
    mailboxes.faults.arm(point)
    with pytest.raises(InjectedFault, match=point):
        act(mailboxes, inbox, archive)
    appended = set(backend.mailbox_state().messages) - known
    assert inconsistencies(backend) == expected(inbox, archive, first, next(iter(appended), None))
    # The content comes before the source of truth and goes after it: a message in a mailbox always has
    # its content, and one whose expunge died keeps it until the orphan sweep releases it.
    assert_message_blobs_referenced(backend, frozenset({first}) if operation == "expunge" else frozenset())
    # One-shot: the next operation runs whole and adds no inconsistency of its own.
    assert mailboxes.faults.armed is None
    before = inconsistencies(backend)
    third = mailboxes.create(USER, "Third")
    mailboxes.append(third, message(3))
    assert inconsistencies(backend) == before


def test_a_mailbox_half_deleted_by_a_fault_can_be_deleted_again(
    runtime: Runtime, mailboxes: Mailboxes, backend: Backend
) -> None:
    inbox, _, _ = _one_message(mailboxes)
    mailboxes.append(inbox, message(2))
    mailboxes.faults.arm(AFTER_SOURCE_OF_TRUTH)
    with pytest.raises(InjectedFault):
        mailboxes.delete_mailbox(inbox)
    assert mailboxes.delete_mailbox(inbox) == 0  # the messages went in the first attempt
    assert backend.mailbox_state().projection == set()
    # Their content, which the first attempt died before releasing, is the orphan sweep's.
    left_over = frozenset(backend.mailbox_state().messages)
    assert len(left_over) == 2
    assert_message_blobs_referenced(backend, left_over)
    # Only once their generation is eligible: until then an owner may be in the middle of a write.
    assert [mailboxes.release_orphan(m) for m in left_over] == [0, 0]
    runtime.generations.rotate()
    runtime.generations.rotate()
    assert [mailboxes.release_orphan(m) for m in left_over] == [2, 2]
    assert_consistent(backend)


def test_unknown_fault_points_are_refused(mailboxes: Mailboxes) -> None:
    with pytest.raises(InvalidInput, match="after_source_of_truth"):
        mailboxes.faults.arm("before_everything")
    assert mailboxes.faults.armed is None


# uids under concurrency
def _assert_uids_strictly_increase(
    runtime: Runtime,
    backend: Backend,
    inbox: MailboxId,
    per_writer: list[list[int]],
    grouped: bool = True,
) -> None:
    total = sum(len(uids) for uids in per_writer)
    for uids in per_writer:
        assert uids == sorted(uids) and len(set(uids)) == len(uids)
    assert sorted(uid for uids in per_writer for uid in uids) == list(range(1, total + 1))
    committed = backend.uids_in_write_order(inbox)
    if grouped and backend.groups_writes:
        # In commit order too: a uid commits with its entry, so the source of truth's rows, in insertion
        # (rowid) order, have increasing uids. Ungrouped, entries commit as their appends get there.
        assert committed == list(range(1, total + 1))
    assert sorted(committed) == list(range(1, total + 1))
    assert runtime.mailboxes.counters(inbox) == Counters(total, total)
    assert_consistent(backend)


def test_uids_strictly_increase_under_concurrent_threads(
    runtime: Runtime, mailboxes: Mailboxes, backend: Backend
) -> None:
    inbox = mailboxes.create(USER, "INBOX")
    threads, appends = 4, 25
    start = threading.Barrier(threads)
    per_thread: list[list[int]] = [[] for _ in range(threads)]

    def append(thread: int) -> None:
        start.wait()
        for n in range(appends):
            per_thread[thread].append(mailboxes.append(inbox, message(n)).uid)

    workers = [threading.Thread(target=append, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=30)
    _assert_uids_strictly_increase(runtime, backend, inbox, per_thread)


@pytest.mark.parametrize("grouped", [True, False], ids=["grouped", "ungrouped"])
def test_uids_strictly_increase_under_concurrent_processes(
    runtime: Runtime, mailboxes: Mailboxes, backend: Backend, grouped: bool
) -> None:
    inbox = mailboxes.create(USER, "INBOX")
    processes = [agent(backend, "append", inbox, 30, grouped=grouped) for _ in range(2)]
    first, second = (json.loads(out) for out in results(processes))
    _assert_uids_strictly_increase(runtime, backend, inbox, [first, second], grouped)
    switches = sum((uid in first) != (uid + 1 in first) for uid in range(1, 60))
    assert switches > 2, f"the processes hardly interleaved: {first} / {second}"


# bad input: a clear error, and nothing changed
def _unchanged(backend: Backend, error: type[Exception], match: str, call: Callable[[], object]) -> None:
    before = backend.state()
    with pytest.raises(error, match=match):
        call()
    assert backend.state() == before


def test_unknown_mailboxes_and_uids_change_nothing(
    runtime: Runtime, mailboxes: Mailboxes, backend: Backend
) -> None:
    inbox, archive, _ = _one_message(mailboxes)
    nowhere = MailboxId("0" * 32)
    calls = [
        lambda: mailboxes.append(nowhere, message(2)),
        lambda: mailboxes.set_flags(nowhere, 1, add=["\\Seen"]),
        lambda: mailboxes.move(nowhere, 1, archive),
        lambda: mailboxes.move(inbox, 1, nowhere),
        lambda: mailboxes.expunge(nowhere, [1]),
        lambda: mailboxes.delete_mailbox(nowhere),
        lambda: mailboxes.counters(nowhere),
        lambda: mailboxes.list_messages(nowhere),
        lambda: mailboxes.read(nowhere, 1),
    ]
    for call in calls:
        _unchanged(backend, UnknownMailbox, "unknown mailbox", call)
    for call in [
        lambda: mailboxes.set_flags(inbox, 7, add=["\\Seen"]),
        lambda: mailboxes.move(inbox, 7, archive),
        lambda: mailboxes.expunge(inbox, [1, 7]),  # uid 1 exists: it must stay
        lambda: mailboxes.read(inbox, 7),
    ]:
        _unchanged(backend, UnknownMailbox, "no message with uid 7", call)
    _unchanged(
        backend,
        UnknownMailbox,
        "unknown mailbox 'Drafts' of alice@example.org",
        lambda: mailboxes.get(USER, "Drafts"),
    )


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        (["\\Recent"], "Recent"),
        (["\\Unknown"], "system flags are"),
        (["two words"], "keyword"),
        (["(paren"], "keyword"),
        (['quote"'], "keyword"),
        (["x" * 101], "keyword"),
        ([""], "keyword"),
        ([42], "expected a string"),
        ("\\Seen", "not the single string"),
        (None, "collection of flag names"),
    ],
)
def test_invalid_flags_change_nothing(
    runtime: Runtime, mailboxes: Mailboxes, flags: object, match: str, backend: Backend
) -> None:
    inbox, _, _ = _one_message(mailboxes)
    _unchanged(backend, InvalidInput, match, lambda: mailboxes.append(inbox, message(2), flags=flags))
    _unchanged(backend, InvalidInput, match, lambda: mailboxes.set_flags(inbox, 1, add=flags))
    _unchanged(backend, InvalidInput, match, lambda: mailboxes.set_flags(inbox, 1, remove=flags))


def test_other_bad_input_changes_nothing(runtime: Runtime, mailboxes: Mailboxes, backend) -> None:
    inbox, archive, first = _one_message(mailboxes)
    cases = [
        (lambda: mailboxes.create(USER, "INBOX"), "already exists"),
        (lambda: mailboxes.create("ALICE@example.org", "inbox"), "already exists"),
        (lambda: mailboxes.create("not an address", "INBOX"), "invalid mail address"),
        (lambda: mailboxes.set_flags(inbox, 1, add=["\\Seen"], remove=["\\seen"]), "both added and removed"),
        (lambda: mailboxes.move(inbox, 1, inbox), "to itself"),
        (lambda: mailboxes.append(inbox, b"no header line\r\n\r\nbody"), "malformed message"),
        (lambda: mailboxes.append(inbox, b""), "malformed message"),
        (lambda: mailboxes.append(inbox, "Subject: text\r\n\r\n"), "raw RFC 5322 bytes"),
        (lambda: mailboxes.append(archive, message(1), message_id=first), "already in mailbox"),
        (lambda: mailboxes.append(inbox, message(1), message_id="not-hex"), "invalid message id"),
        (lambda: mailboxes.expunge(inbox, 1), "collection of uids"),
        (lambda: mailboxes.counters("not-a-mailbox-id"), "invalid mailbox id"),
        (lambda: mailboxes.reset_counters(inbox, 1.5, 0, observed=(1, 1)), "invalid counters"),
        (lambda: mailboxes.reset_counters(inbox, "2", 0, observed=(1, 1)), "invalid counters"),
        (lambda: mailboxes.reset_counters(inbox, 2, True, observed=(1, 1)), "invalid counters"),
        (lambda: mailboxes.reset_counters(inbox, 2, 0, observed=(1,)), "invalid counters"),
        (lambda: mailboxes.reset_counters(inbox, 2, 3, observed=None), "invalid counters"),
    ]
    cases += [
        (lambda uid=uid: mailboxes.set_flags(inbox, uid, add=["\\Seen"]), "invalid uid")
        for uid in (0, -1, True, "1", 1.0, 2**63, 10**400)
    ]
    for name in ("", "a..b", ".a", "a.", "a*b", "50%", "#news", "tab\there", " padded", "x." * 101):
        cases.append((lambda name=name: mailboxes.create(USER, name), "invalid mailbox name"))
    for call, match in cases:
        _unchanged(backend, InvalidInput, match, call)
    small = backend.open(max_message_size=100).mailboxes
    _unchanged(
        backend, InvalidInput, "exceeds the maximum size", lambda: small.append(inbox, message(2, b"x" * 200))
    )


def test_mailbox_names_are_normalised(mailboxes: Mailboxes) -> None:
    mailboxes.create(USER, "InBoX.Sub folder")
    assert mailboxes.get(USER, "inbox.Sub folder").name == "INBOX.Sub folder"
    with pytest.raises(UnknownMailbox):
        mailboxes.get(USER, "INBOX.sub folder")  # only INBOX is case-insensitive
