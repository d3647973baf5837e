"""Record 23: the Cassandra mailbox tables answer every call as the embedded ones do: mailboxes and their
names, uids, the source of truth, the projection, the counters and their repairs."""

from __future__ import annotations

from mailq_runtime.blobs.dedup import DeduplicatingBlobStore
from mailq_runtime.blobs.sqlite_store import SqliteBlobStore
from mailq_runtime.mailbox import Counters
from mailq_runtime.mailboxes import Mailboxes
from mailq_runtime.stores.embedded import EmbeddedStore

from .conftest import Tables, same_on_both

T0 = 1_700_002_800 * 1_000_000
INBOX, ARCHIVE, OTHER = "0" * 31 + "1", "0" * 31 + "2", "0" * 31 + "3"
M1, M2, M3 = "1" * 32, "2" * 32, "3" * 32


def test_mailboxes_names_and_uids_as_the_embedded_ones(both):
    def scenario(t: Tables) -> dict:
        m = t.mailboxes
        seen: dict = {}
        seen["created"] = [
            m.create_mailbox(INBOX, "alice@example.com", "INBOX"),
            m.create_mailbox(ARCHIVE, "alice@example.com", "Archive"),
            m.create_mailbox(OTHER, "alice@example.com", "INBOX"),
            m.create_mailbox(INBOX, "alice@example.com", "INBOX"),
            m.create_mailbox(OTHER, "bob@example.com", "INBOX"),
        ]
        seen["found"] = [
            m.find_mailbox("alice@example.com", "INBOX"),
            m.find_mailbox("alice@example.com", "Nope"),
            m.mailbox(ARCHIVE),
            m.mailbox("f" * 32),
            m.mailboxes("alice@example.com"),
            m.mailboxes("carol@example.com"),
            m.mailboxes(None),
        ]
        seen["uids"] = [m.allocate_uid(INBOX), m.allocate_uid(INBOX), m.allocate_uid(ARCHIVE)]
        seen["uids"] += [m.allocate_uid(INBOX), m.allocate_uid("f" * 32)]
        seen["counters"] = [m.counters(INBOX), m.counters("f" * 32)]
        seen["sample"] = [sorted(m.sample_mailboxes(10)), len(m.sample_mailboxes(2)), m.sample_mailboxes(0)]
        seen["drop empty"] = [m.delete_mailbox(ARCHIVE), m.mailbox(ARCHIVE), m.counters(ARCHIVE)]
        seen["after drop"] = [
            m.allocate_uid(ARCHIVE),
            m.find_mailbox("alice@example.com", "Archive"),
            m.mailboxes("alice@example.com"),
            m.create_mailbox("0" * 31 + "4", "alice@example.com", "Archive"),
            m.find_mailbox("alice@example.com", "Archive"),
            m.allocate_uid("0" * 31 + "4"),
        ]
        return seen

    seen = same_on_both(both, scenario)
    alice_inbox = (INBOX, "alice@example.com", "INBOX")
    assert seen["created"] == [True, True, False, False, True]
    assert seen["found"] == [
        alice_inbox,
        None,
        (ARCHIVE, "alice@example.com", "Archive"),
        None,
        [(ARCHIVE, "alice@example.com", "Archive"), alice_inbox],
        [],
        [(ARCHIVE, "alice@example.com", "Archive"), alice_inbox, (OTHER, "bob@example.com", "INBOX")],
    ]
    assert seen["uids"] == [1, 2, 1, 3, None]
    assert seen["counters"] == [(0, 0), None]
    assert seen["sample"] == [sorted([INBOX, ARCHIVE, OTHER]), 2, []]
    assert seen["drop empty"] == [True, None, None]
    assert seen["after drop"][:3] == [None, None, [alice_inbox]]
    assert seen["after drop"][3:] == [True, ("0" * 31 + "4", "alice@example.com", "Archive"), 1]


def test_source_of_truth_projection_and_counters_as_the_embedded_ones(both):
    def scenario(t: Tables) -> dict:
        m = t.mailboxes
        seen: dict = {}
        m.create_mailbox(INBOX, "alice@example.com", "INBOX")
        m.create_mailbox(ARCHIVE, "alice@example.com", "Archive")
        m.save_message(M1, "g1_" + "a" * 64, "g1_" + "b" * 64, 120, T0)
        seen["message"] = [m.message(M1), m.message(M2)]
        seen["added"] = [
            m.add_to_source_of_truth(M1, INBOX, 1, ""),
            m.add_to_source_of_truth(M1, INBOX, 7, "\\Seen"),
            m.add_to_source_of_truth(M2, INBOX, 2, "\\Seen \\Flagged"),
            m.add_to_source_of_truth(M3, INBOX, 3, "$Seen"),
        ]
        for message_id in (M1, M2, M3):
            m.project(message_id, INBOX)
        m.add_to_counters(INBOX, 3, 2)
        seen["source"] = [m.placements(M1), m.placements("9" * 32), m.entry(INBOX, 2), m.entry(INBOX, 9)]
        seen["source"] += [m.uids(INBOX), m.uids(ARCHIVE), m.recount(INBOX), m.recount(ARCHIVE)]
        seen["projection"] = m.projection(INBOX)
        seen["counters"] = [m.counters(INBOX), m.counters(ARCHIVE)]
        # A flag change whose projection write was lost, then healed; one from flags read before it fails.
        seen["flagged"] = [
            m.set_source_flags(M1, INBOX, "\\Seen", ""),
            m.set_source_flags(M1, INBOX, "\\Flagged", ""),
            m.set_source_flags(M1, "f" * 32, "\\Seen", ""),
        ]
        seen["outdated"] = [m.entry(INBOX, 1), m.projection(INBOX)[0], m.recount(INBOX)]
        m.heal_projection(INBOX, M1)
        seen["healed"] = m.projection(INBOX)[0]
        # A move: out of INBOX, into Archive under a new uid.
        seen["moved"] = [m.remove_from_source_of_truth(INBOX, 2), m.remove_from_source_of_truth(INBOX, 2)]
        m.add_to_source_of_truth(M2, ARCHIVE, m.allocate_uid(ARCHIVE), "\\Seen \\Flagged")
        m.unproject(INBOX, 2)
        m.project(M2, ARCHIVE)
        m.add_to_counters(INBOX, -1, 0)
        m.add_to_counters(ARCHIVE, 1, 0)
        seen["after move"] = [m.placements(M2), m.projection(INBOX), m.projection(ARCHIVE)]
        seen["after move"] += [m.counters(INBOX), m.counters(ARCHIVE), m.uids(INBOX)]
        # An expunge that dies after the source of truth: the projection keeps a stale row.
        seen["expunged"] = m.remove_from_source_of_truth(INBOX, 3)
        seen["stale"] = [m.projection(INBOX), m.recount(INBOX), m.counters(INBOX)]
        m.heal_projection(INBOX, M3)
        seen["repaired"] = [
            m.projection(INBOX),
            m.reset_counters(INBOX, 1, 0, (5, 5)),
            m.reset_counters(INBOX, 1, 0, (2, 2)),
            m.counters(INBOX),
            m.reset_counters(ARCHIVE, 1, 0, None),
            m.reset_counters("f" * 32, 1, 0, None),
        ]
        # A flag change racing an expunge: the compare-and-set comes after the removal and writes nothing.
        m.remove_from_source_of_truth(INBOX, 1)
        seen["flag after removal"] = m.set_source_flags(M1, INBOX, "\\Deleted", "\\Seen")
        m.project(M1, INBOX)
        seen["raced"] = [m.placements(M1), m.uids(INBOX), m.recount(INBOX), m.entry(INBOX, 1)]
        seen["raced"] += [m.projection(INBOX), m.add_to_source_of_truth(M1, INBOX, 8, "")]
        seen["re-added"] = [m.placements(M1), m.entry(INBOX, 8)]
        m.delete_message(M1)
        seen["deleted message"] = m.message(M1)
        seen["drop"] = [m.delete_mailbox(ARCHIVE), m.remove_from_source_of_truth(ARCHIVE, 1)]
        seen["drop"] += [m.delete_mailbox(ARCHIVE), m.counters(ARCHIVE), m.projection(ARCHIVE)]
        m.add_to_counters(ARCHIVE, 1, 1)  # late, for a mailbox now gone
        seen["late counter"] = m.counters(ARCHIVE)
        return seen

    seen = same_on_both(both, scenario)
    assert seen["message"] == [("g1_" + "a" * 64, "g1_" + "b" * 64, 120, T0), None]
    assert seen["added"] == [True, False, True, True]
    assert seen["source"] == [[(INBOX, 1)], [], (M2, "\\Seen \\Flagged"), None, [1, 2, 3], [], (3, 2), (0, 0)]
    assert seen["projection"] == [(1, M1, ""), (2, M2, "\\Seen \\Flagged"), (3, M3, "$Seen")]
    assert seen["counters"] == [(3, 2), (0, 0)]
    assert seen["flagged"] == [True, False, False]
    assert seen["outdated"] == [(M1, "\\Seen"), (1, M1, ""), (3, 1)]
    assert seen["healed"] == (1, M1, "\\Seen")
    assert seen["moved"] == [(M2, "\\Seen \\Flagged"), None]
    assert seen["after move"] == [
        [(ARCHIVE, 1)],
        [(1, M1, "\\Seen"), (3, M3, "$Seen")],
        [(1, M2, "\\Seen \\Flagged")],
        (2, 2),
        (1, 0),
        [1, 3],
    ]
    assert seen["expunged"] == (M3, "$Seen")
    assert seen["stale"] == [[(1, M1, "\\Seen"), (3, M3, "$Seen")], (1, 0), (2, 2)]
    assert seen["repaired"] == [[(1, M1, "\\Seen")], False, True, (1, 0), False, False]
    assert seen["flag after removal"] is False
    assert seen["raced"] == [[], [], (0, 0), None, [(1, M1, "\\Seen")], True]
    assert seen["re-added"] == [[(INBOX, 8)], (M1, "")]
    assert seen["deleted message"] is None
    assert seen["drop"] == [False, (M2, "\\Seen \\Flagged"), True, None, []]
    assert seen["late counter"] is None


def test_the_mailbox_core_over_either_store_answers_alike(both, tmp_path):
    """`Mailboxes` and the deduplicating blob store over each store's tables, every write committing
    alone: append, flags, move, expunge and the orphan release see the same on both."""
    contents: list[EmbeddedStore] = []  # each scenario's content, in a SQLite file of its own

    def scenario(t: Tables) -> dict:
        clock = iter(range(T0, T0 + 10_000_000, 1_000)).__next__
        contents.append(EmbeddedStore(tmp_path / t.name))
        content = SqliteBlobStore(contents[-1])
        blobs = DeduplicatingBlobStore(t.blobs, content, clock)
        mailboxes = Mailboxes(t.mailboxes, blobs, clock, 1_000_000)
        inbox = mailboxes.create("alice@example.com", "INBOX")
        archive = mailboxes.create("alice@example.com", "Archive")
        first = mailboxes.append(inbox, b"Subject: one\r\n\r\nbody", message_id=M1)
        second = mailboxes.append(inbox, b"Subject: two\r\n\r\nbody", flags=["\\Seen"], message_id=M2)
        again = mailboxes.append(inbox, b"Subject: one\r\n\r\nbody", message_id=M1)
        seen: dict = {"appended": [first.uid, second.uid, again.uid]}
        seen["flags"] = [
            sorted(mailboxes.set_flags(inbox, first.uid, add=["\\Seen", "\\Flagged"])),
            sorted(mailboxes.set_flags(inbox, first.uid, remove=["\\Seen"])),
        ]
        seen["moved"] = mailboxes.move(inbox, second.uid, archive)
        seen["counters"] = [mailboxes.counters(inbox), mailboxes.counters(archive)]
        seen["expunged"] = [mailboxes.expunge(inbox, [first.uid]), blobs.references_of(M1)]
        # Content saved for a message id no mailbox holds, as an append that died after saving it.
        blobs.save_all(M3, [b"Subject: three\r\n", b"body"])
        blobs.generations.rotate()
        blobs.generations.rotate()
        seen["orphan"] = [mailboxes.release_orphan(M2), mailboxes.release_orphan(M3), blobs.references_of(M3)]
        seen["backlog"] = blobs.deletion_backlog().count
        return seen

    try:
        seen = same_on_both(both, scenario)
    finally:
        for embedded in contents:
            embedded.close()
    assert seen["appended"] == [1, 2, 1]
    assert seen["flags"] == [["\\Flagged", "\\Seen"], ["\\Flagged"]]
    assert seen["moved"] == 1
    assert seen["counters"] == [Counters(1, 1), Counters(1, 0)]
    assert seen["expunged"] == [1, []]
    assert seen["orphan"] == [0, 2, []]
    assert seen["backlog"] == 4
