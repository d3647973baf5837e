"""Record 39's worked example through the garbage collector, with DESIGN.md's n-2 rule made explicit.

The record's own GC steps collect the deletions of the current generation (rg3 during gci3), which its
prose forbids: a blob of generation g may only go once the current generation is at least g+2, when no
save can reference it any more. So the tables after each iteration differ from the record's, and each
difference is named here:

- after gci3 (current rg3, eligible rg1): b1 and b2 are collected as in the record; b5 is NOT (rg3 is not
  eligible yet), so `blobs` keeps b5 and `blob_deletions` keeps b5's and b6's rows of gci3.
- after gci4 (current rg4, eligible rg1..rg2): rg3 is still not eligible, so nothing is collected: the
  record's gci4 collects b6; here b5, b6 and their three deletion rows remain.
- after gci5 (current rg5, eligible rg1..rg3), one iteration later than the record: b5 and b6 are
  collected and the tables equal the record's final tables exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mailq_runtime import Runtime

from .pipeline import blob_tables, run_gc

EXAMPLE = json.loads((Path(__file__).parents[1] / "data" / "adr39-worked-example.json").read_text())
CONTENT = {f"b{n}": f"content of blob b{n}\r\n".encode() for n in range(1, 7)}


def _record(step_name: str) -> dict:
    step = next(s for s in EXAMPLE["steps"] if s["step"].startswith(step_name))
    return {
        "blobs": sorted((b["blob_id"], b["generation"]) for b in step["blobs"]),
        "references": sorted((r["message_id"], r["blob_id"], r["generation"]) for r in step["references"]),
        "deletions": sorted((d["blob_id"], d["generation"], d["gc_iteration"]) for d in step["deletions"]),
    }


@pytest.fixture
def example(tmp_path: Path):
    runtime = Runtime.open(f"embedded://{tmp_path / 'data'}", create=True)
    labels: dict[str, str] = {}

    def save(owner: str, blob: str) -> None:
        labels[str(runtime.blobs.save(owner, CONTENT[blob]))] = blob

    yield runtime, save, labels
    runtime.close()


def test_the_worked_example_through_gc_with_the_n_minus_2_rule(example, pipeline_resources) -> None:
    runtime, save, labels = example
    url = runtime.settings.data_dir
    tables = lambda: blob_tables(runtime, labels)  # noqa: E731

    # generation 1 / iteration 1, generation 2 / iteration 2
    save("m1", "b1"), save("m2", "b2"), save("m3", "b2")
    runtime.generations.rotate()
    save("m4", "b3"), save("m5", "b4"), save("m6", "b4")
    runtime.generations.rotate()
    # generation 3 / iteration 3: saves, then user1 deletes m1, m2, m7, m8 and user2 deletes m3
    save("m7", "b5"), save("m8", "b6"), save("m9", "b6")
    for owner in ("m1", "m2", "m7", "m8", "m3"):
        runtime.blobs.release(owner)
    after_deletions = _record("generation 3 / iteration 3, after deletions")
    assert tables() == after_deletions

    gci3 = run_gc(pipeline_resources(url))
    record = _record("after garbage collection gci3")
    assert gci3["deleted_blobs"] == 2 and gci3["concerned_blobs"] == 2
    assert tables() == {
        "blobs": sorted(record["blobs"] + [("b5", "rg3")]),  # rg3 not eligible during gci3
        "references": record["references"],
        "deletions": sorted(record["deletions"] + [("b5", "rg3", "gci3")]),
    }
    assert not runtime.content.exists(next(b for b, label in labels.items() if label == "b1"))

    # generation 4: user2 deletes m9
    runtime.generations.rotate()
    runtime.blobs.release("m9")
    before_gci4 = tables()
    gci4 = run_gc(pipeline_resources(url))
    record = _record("after garbage collection gci4")
    assert gci4["deleted_blobs"] == 0 and gci4["concerned_blobs"] == 0  # rg3 still not eligible
    assert tables() == before_gci4
    assert before_gci4["blobs"] == sorted(record["blobs"] + [("b5", "rg3"), ("b6", "rg3")])
    assert before_gci4["deletions"] == [("b5", "rg3", "gci3"), ("b6", "rg3", "gci3"), ("b6", "rg3", "gci4")]

    # one iteration later than the record, rg3 is eligible and the tables reach the record's final ones
    runtime.generations.rotate()
    gci5 = run_gc(pipeline_resources(url))
    assert gci5["deleted_blobs"] == 2 and gci5["kept_still_referenced"] == 0
    assert tables() == record
    for blob, label in labels.items():
        assert runtime.content.exists(blob) == (label in {"b3", "b4"})
