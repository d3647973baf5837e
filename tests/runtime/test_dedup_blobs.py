"""Record 39's deduplicating blob store: its worked example replayed table by table, dedup within a
generation only, deletions appended on release, concurrent saves, and bad input refused."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest

from mailq_runtime import BlobNotFound, InvalidInput, Runtime

from .backends import Backend
from .mailbox_checks import agent, results

WORKED_EXAMPLE = json.loads((Path(__file__).parents[1] / "data" / "adr39-worked-example.json").read_text())
CONTENT = {f"b{n}": f"content of blob b{n}\r\n".encode() for n in range(1, 7)}
_OWNERS = r"(m\d+(?:, m\d+)*)"


def _tables(backend: Backend, runtime: Runtime, label_of: dict[str, str]) -> dict[str, list]:
    """The four tables in the example's words: rgN, gciN, and b1..b6 for the real blob ids."""
    state = backend.blob_state()
    return {
        "generations": [f"rg{g.number}" for g in runtime.generations.reference_generations()],
        "gc_iterations": [
            f"gci{number}"
            for kind, number, _ in sorted(backend.state()["generations"])
            if kind == "gc_iteration"
        ],
        "blobs": sorted((label_of[b], f"rg{g}") for b, g in state.blobs.items()),
        "references": sorted((owner, label_of[b], f"rg{g}") for owner, b, g in state.references),
        # Dates are the record's wall-clock illustration: not compared.
        "deletions": sorted((label_of[b], f"rg{g}", f"gci{i}") for b, g, i in state.deletions),
    }


def _expected(step: dict, not_collected: dict[str, list]) -> dict[str, list]:
    return {
        "generations": step["generations"],
        "gc_iterations": step["gc_iterations"],
        "blobs": sorted([(b["blob_id"], b["generation"]) for b in step["blobs"]] + not_collected["blobs"]),
        "references": sorted((r["message_id"], r["blob_id"], r["generation"]) for r in step["references"]),
        "deletions": sorted(
            [(d["blob_id"], d["generation"], d["gc_iteration"]) for d in step["deletions"]]
            + not_collected["deletions"]
        ),
    }


def _difference(before: list, after: list) -> list:
    remaining = list(after)
    removed = []
    for row in before:
        if row in remaining:
            remaining.remove(row)
        else:
            removed.append(row)
    return removed


def test_the_worked_example_of_record_39_step_by_step(backend) -> None:
    """Replays the events of each step of the example and compares the tables after it.

    The steps "after garbage collection" are not replayed: collecting is the GC's work, not the store's.
    Their effect on the record's tables (b1, b2, b5 and their deletions gone) is carried as
    `not_collected` into the later steps, which therefore expect those rows still present. That the GC
    may not even collect b5 at gci3 (DESIGN.md's n-2 reading) is the GC's tests' business.
    """
    runtime = backend.open()
    label_of: dict[str, str] = {}
    nothing = {"blobs": [], "deletions": []}
    not_collected: dict[str, list] = {"blobs": [], "deletions": []}
    shown_before: dict[str, list] = _expected(WORKED_EXAMPLE["steps"][0], nothing)
    replayed = []
    for step in WORKED_EXAMPLE["steps"]:
        shown = _expected(step, nothing)  # the record's own tables
        if all(event.startswith("GC iteration") for event in step["events"]):
            for table in not_collected:
                not_collected[table] += _difference(shown_before[table], shown[table])
            shown_before = shown
            continue
        for event in step["events"]:
            if match := re.fullmatch(r"emit rg(\d+)", event):
                # A fresh runtime starts at rg1 / gci1; each later generation is one rotation.
                if int(match.group(1)) > runtime.generations.current():
                    assert runtime.generations.rotate()[0] == int(match.group(1))
                assert runtime.generations.current() == int(match.group(1))
            elif match := re.fullmatch(r"emit gci(\d+)", event):
                assert runtime.generations.current_gc_iteration() == int(match.group(1))
            elif match := re.match(rf"{_OWNERS} -> (b\d+)", event):
                label = match.group(2)
                for owner in match.group(1).split(", "):
                    label_of[str(runtime.blobs.save(owner, CONTENT[label]))] = label
            elif match := re.match(rf"user\d+ deletes {_OWNERS} \(gci\d+\)", event):
                for owner in match.group(1).split(", "):
                    assert runtime.blobs.release(owner) == 1
            else:
                pytest.fail(f"event {event!r} of step {step['step']!r} is not understood")
        assert _tables(backend, runtime, label_of) == _expected(step, not_collected), step["step"]
        shown_before = shown
        replayed.append(step["step"])
    assert replayed[-1] == "generation 4, after deletions"
    assert sorted(not_collected["blobs"]) == [("b1", "rg1"), ("b2", "rg1"), ("b5", "rg3"), ("b6", "rg3")]
    # One content per blob row: m2/m3 and m8/m9 share theirs.
    assert len(backend.blob_state().contents) == 6


def test_dedup_within_a_generation_not_across(runtime: Runtime, backend: Backend) -> None:
    first = runtime.blobs.save("owner-a", b"same bytes")
    assert runtime.blobs.save("owner-b", b"same bytes") == first
    runtime.generations.rotate()
    later = runtime.blobs.save("owner-c", b"same bytes")
    assert later != first
    assert (later.generation, later.hash) == (first.generation + 1, first.hash)
    state = backend.blob_state()
    assert (sorted(state.blobs.values()), len(state.contents)) == ([1, 2], 2)
    assert runtime.blobs.read(first) == runtime.blobs.read(str(later)) == b"same bytes"
    assert runtime.blobs.references_of("owner-b") == [first]


def test_a_save_of_new_contents_that_were_stored_already_keeps_one_blob(
    runtime: Runtime, backend: Backend
) -> None:
    """save_new, which skips the read of the blob rows, writes a blob stored already again: still one
    content and one row of its size, and each owner's reference."""
    first = runtime.blobs.save_all("mail-1", [b"Subject: one\r\n\r\n", b"same body"])
    again = runtime.blobs.save_new("mail-2", [b"Subject: two\r\n\r\n", b"same body"])
    assert again[1] == first[1] and again[0] != first[0]
    state = backend.blob_state()
    assert sorted(state.blobs) == sorted(map(str, {*first, *again})) and len(state.contents) == 3
    assert state.blobs[str(first[1])] == 1  # its generation, as every row's
    assert runtime.blobs.sizes([first[1]]) == {first[1]: len(b"same body")}
    assert runtime.blobs.references_of("mail-2") == sorted(again)
    assert runtime.blobs.read(again[1]) == b"same body"


def test_release_appends_one_deletion_per_released_reference(runtime: Runtime, backend: Backend) -> None:
    header = runtime.blobs.save("message-1", b"Subject: x\r\n\r\n")
    body = runtime.blobs.save("message-1", b"body")
    runtime.generations.rotate()
    assert runtime.blobs.release("message-1", [body]) == 1
    assert runtime.blobs.references_of("message-1") == [header]
    assert backend.blob_state().deletions == [(str(body), 1, 2)]
    assert runtime.blobs.release("message-1") == 1
    # Releasing what is already released is a no-op, so a clean-up can be retried safely.
    assert runtime.blobs.release("message-1") == 0
    assert sorted(b for b, _, _ in backend.blob_state().deletions) == sorted([str(body), str(header)])
    # Release never deletes content: that is the GC's work, once no reference is left.
    assert runtime.blobs.read(header) == b"Subject: x\r\n\r\n"


def test_concurrent_saves_from_threads_store_the_content_once(runtime: Runtime, backend: Backend) -> None:
    threads, saves = 6, 20
    start = threading.Barrier(threads)
    ids: list[str] = []

    def save(thread: int) -> None:
        start.wait()
        ids.extend(str(runtime.blobs.save(f"t{thread}-{i}", b"shared content")) for i in range(saves))

    workers = [threading.Thread(target=save, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=30)
    assert len(ids) == threads * saves and len(set(ids)) == 1
    state = backend.blob_state()
    assert (list(state.blobs), sorted(state.contents)) == ([ids[0]], [ids[0]])
    assert len({owner for owner, b, _ in state.references if b == ids[0]}) == threads * saves


@pytest.mark.parametrize("grouped", [True, False], ids=["grouped", "ungrouped"])
def test_concurrent_saves_from_two_processes_store_the_content_once(backend, grouped: bool) -> None:
    """Ungrouped, both processes may find the blob new and write its content (the same bytes under the
    same key): still one blob, one content, and every reference."""
    backend.open()  # creates the data directory and its schema before the processes race
    processes = [agent(backend, "save", f"p{n}", 50, grouped=grouped) for n in range(2)]
    ids = {blob_id for out in results(processes) for blob_id in json.loads(out)}
    assert len(ids) == 1
    (blob_id,) = ids
    state = backend.blob_state()
    assert (list(state.blobs), sorted(state.contents)) == ([blob_id], [blob_id])
    owners = [owner for owner, _, _ in state.references]
    assert sorted(owners) == sorted(f"p{n}-{i}" for n in range(2) for i in range(50))
    switches = sum(a[:2] != b[:2] for a, b in zip(owners, owners[1:], strict=False))
    assert switches > 2, f"the processes hardly interleaved: {owners}"


def test_release_of_a_blob_the_owner_does_not_hold_is_refused_and_changes_nothing(
    runtime: Runtime, backend: Backend
) -> None:
    mine = runtime.blobs.save("owner-a", b"a's content")
    theirs = runtime.blobs.save("owner-b", b"b's content")
    before = backend.state()
    with pytest.raises(InvalidInput, match="owner-a"):
        runtime.blobs.release("owner-a", [mine, theirs])
    with pytest.raises(InvalidInput, match=str(mine)):
        runtime.blobs.release("owner-b", [mine])
    assert backend.state() == before


@pytest.mark.parametrize(
    "blob_id",
    [
        "",
        "b1",
        "g1_abc",
        "G1_" + "a" * 64,
        "g1_" + "A" * 64,
        "g-1_" + "a" * 64,
        "g01_" + "a" * 64,  # one spelling per blob: no leading zeros
        "g00_" + "a" * 64,
        "g" + "9" * 19 + "_" + "a" * 64,
        "g1_" + "a" * 63 + "g",
        "g1_../../" + "a" * 58,
        "g1_" + "a" * 64 + "\n",
        42,
        None,
    ],
)
def test_malformed_blob_ids_are_refused(runtime: Runtime, blob_id: object, backend: Backend) -> None:
    runtime.blobs.save("owner-a", b"content")
    before = backend.state()
    with pytest.raises(InvalidInput, match="invalid blob id"):
        runtime.blobs.read(blob_id)
    with pytest.raises(InvalidInput, match="invalid blob id"):
        runtime.blobs.release("owner-a", [blob_id])
    assert backend.state() == before


def test_bad_owners_and_contents_are_refused_and_unknown_blobs_not_found(
    runtime: Runtime, backend: Backend
) -> None:
    for owner in ("", "has space", "x" * 201, None):
        with pytest.raises(InvalidInput, match="invalid blob owner"):
            runtime.blobs.save(owner, b"content")
    with pytest.raises(InvalidInput, match="must be bytes"):
        runtime.blobs.save("owner-a", "text")
    assert backend.blob_state().blobs == {}
    with pytest.raises(BlobNotFound):
        runtime.blobs.read("g1_" + "0" * 64)


def test_referenced_blobs_are_looked_up_and_deletions_retired_row_by_row(backend: Backend) -> None:
    """The GC's exact check of a few blobs, and the retirement of exactly the deletion rows it names."""
    now = [1_000_000]
    runtime = backend.open(clock=lambda: now[0])
    try:
        live = runtime.blobs.save("keeper", b"kept")
        runtime.blobs.save("leaver", b"kept")
        gone = runtime.blobs.save("leaver", b"gone")
        runtime.blobs.release("leaver")  # a deletion of each at 1 s
        now[0] = 2_000_000
        runtime.blobs.save("passer-by", b"kept")
        runtime.blobs.release("passer-by")  # another deletion of the live blob, at 2 s
        assert runtime.blobs.referenced([live, gone, str(live)]) == {live}
        assert runtime.blobs.referenced([]) == set()

        assert runtime.blobs.retire_deletions([(live, 1_000_000), (str(live), 1_000_000)]) == 1
        assert sorted(b for b, _, _ in backend.blob_state().deletions) == sorted([str(live), str(gone)])
        assert runtime.blobs.retire_deletions([(live, 1_000_000)]) == 1  # gone already: harmless
        assert runtime.blobs.retire_deletions([(live, 2_000_000)]) == 1
        assert [b for b, _, _ in backend.blob_state().deletions] == [str(gone)]
        # Retiring never touches the content nor the blob rows.
        assert runtime.blobs.read(live) == b"kept" and runtime.blobs.read(gone) == b"gone"
    finally:
        runtime.close()


def test_explain_reads_a_blobs_generation_row_content_references_and_deletions(backend: Backend) -> None:
    now = [1_000_000]
    runtime = backend.open(clock=lambda: now[0])
    try:
        shared = runtime.blobs.save("m1", b"shared")
        runtime.blobs.save("m2", b"shared")
        runtime.blobs.release("m1")  # a deletion at 1 s, in GC iteration 1
        runtime.generations.rotate()
        young = runtime.blobs.save("m3", b"young")

        facts = runtime.blobs.explain(str(shared))
        assert (facts.blob_id, facts.state, facts.current_generation) == (shared, "protected", 2)
        assert (facts.size, facts.content) == (len(b"shared"), True)
        assert (facts.references, facts.deletions) == ([("m2", 1)], [(1_000_000, 1, "m1")])
        assert runtime.blobs.explain(young).state == "current"
        runtime.generations.rotate()
        assert runtime.blobs.explain(shared).state == "eligible"

        # A well-formed id nothing holds: its facts are empty, not an error.
        nothing = runtime.blobs.explain("g9_" + "0" * 64)
        assert (nothing.state, nothing.size, nothing.content) == ("not started", None, False)
        assert (nothing.references, nothing.deletions) == ([], [])
        with pytest.raises(InvalidInput, match="invalid blob id"):
            runtime.blobs.explain("g1_nothex")
    finally:
        runtime.close()


def test_a_release_after_a_rotation_names_the_new_gc_iteration(runtime: Runtime, backend: Backend) -> None:
    """done()'s release reuses the GC iteration it read within a second, but not across a rotation by its
    own process."""
    first = runtime.blobs.save("mail-1", b"first")
    second = runtime.blobs.save("mail-2", b"second")
    runtime.blobs.release_saved("mail-1", [first])
    runtime.generations.rotate()
    runtime.blobs.release_saved("mail-2", [second])
    assert sorted((b, i) for b, _, i in backend.blob_state().deletions) == sorted(
        [(str(first), 1), (str(second), 2)]
    )
