"""A GC run costs what changed since the last one: the deletion rows of blobs found live are retired
(once settled), so the next run reads only new deletions, and none at all reads no reference."""

from __future__ import annotations

import dagster as dg

from mailq_runtime import Runtime
from mailq_runtime.model import BlobId

from .pipeline import GC_ASSETS, checks_passed, materialized

LIVE = b"Subject: kept\r\n\r\nheld by an owner for good"
GARBAGE = b"Subject: gone\r\n\r\nheld by nobody after its release"


def gc(resources: dict, **collect_config: object) -> dict[str, dict]:
    """One GC iteration; every asset's figures, after the check passed."""
    run_config = {"ops": {"collected_blobs": {"config": collect_config}}} if collect_config else None
    result = dg.materialize(GC_ASSETS, resources=resources, run_config=run_config)
    assert result.success
    assert checks_passed(result) == {"no_live_blob_collected": True}
    return {
        name: materialized(result, name)
        for name in ("deletion_sets", "live_reference_filter", "collected_blobs")
    }


def deletions(runtime: Runtime) -> list[tuple[str, int]]:
    return sorted(runtime.store.read("SELECT blob_id, deleted_at FROM blob_deletions"))


def eligible_live_and_garbage(runtime: Runtime) -> tuple[BlobId, BlobId]:
    """Generation 1: a live blob with two owners and one release of it, a garbage blob released; then
    two rotations make generation 1 eligible."""
    live = runtime.blobs.save("keeper", LIVE)
    runtime.blobs.save("second-keeper", LIVE)
    runtime.blobs.save("passer-by", LIVE)
    garbage = runtime.blobs.save("leaver", GARBAGE)
    runtime.blobs.release("passer-by")
    runtime.blobs.release("leaver")
    runtime.generations.rotate()
    runtime.generations.rotate()
    return live, garbage


def test_a_second_run_reads_only_new_deletions(runtime: Runtime, pipeline_resources) -> None:
    resources = pipeline_resources(runtime.settings.data_dir)
    live, garbage = eligible_live_and_garbage(runtime)

    first = gc(resources, settle="0s")
    assert (first["deletion_sets"]["deletions"], first["deletion_sets"]["concerned_blobs"]) == (2, 2)
    collected = first["collected_blobs"]
    assert (collected["deleted_blobs"], collected["kept_still_referenced"]) == (1, 1)
    assert collected["retired_deletions"] == 1
    assert deletions(runtime) == []  # the garbage's row went with it, the live blob's was retired
    assert not runtime.content.exists(garbage) and runtime.content.exists(live)

    second = gc(resources, settle="0s")
    assert (second["deletion_sets"]["deletions"], second["deletion_sets"]["concerned_blobs"]) == (0, 0)
    assert second["live_reference_filter"]["references_read"] is False
    assert second["collected_blobs"]["references_read"] is False
    assert second["collected_blobs"]["mode"] == "nothing to examine"

    runtime.blobs.release("second-keeper")  # a new deletion of the live blob: examined again
    third = gc(resources, settle="0s")
    assert (third["deletion_sets"]["deletions"], third["deletion_sets"]["concerned_blobs"]) == (1, 1)
    collected = third["collected_blobs"]
    assert (collected["kept_still_referenced"], collected["retired_deletions"]) == (1, 1)
    assert collected["deleted_blobs"] == 0 and runtime.blobs.read(live) == LIVE
    assert deletions(runtime) == []


def test_deletions_inside_the_settle_time_stay(runtime: Runtime, pipeline_resources) -> None:
    resources = pipeline_resources(runtime.settings.data_dir)
    live, _ = eligible_live_and_garbage(runtime)
    (row,) = [r for r in deletions(runtime) if r[0] == str(live)]

    settling = gc(resources)["collected_blobs"]  # the default settle time, 15 minutes
    assert (settling["kept_still_referenced"], settling["retired_deletions"]) == (1, 0)
    assert deletions(runtime) == [row]
    # The same row once settled (the runtime's clock is real: a settle time of 0 s has passed).
    settled = gc(resources, settle="0s")["collected_blobs"]
    assert (settled["kept_still_referenced"], settled["retired_deletions"]) == (1, 1)
    assert deletions(runtime) == []


def test_a_release_between_the_read_and_the_check_leaves_its_blob_collectable(
    runtime: Runtime, pipeline_resources
) -> None:
    """A release writes its deletion row, then removes its reference: a run in between sees the row and
    the reference. The settle time keeps that row, so the blob is collected once the release finishes;
    no run ever deletes the blob while it is referenced."""
    resources = pipeline_resources(runtime.settings.data_dir)
    blob = runtime.blobs.save("last-owner", GARBAGE)
    runtime.generations.rotate()
    runtime.generations.rotate()
    # The release's first step only (dedup.py's order): its deletion row.
    runtime.blob_tables.add_deletions([blob], runtime.generations.current_gc_iteration(), runtime.clock())

    during = gc(resources)["collected_blobs"]
    assert (during["kept_still_referenced"], during["retired_deletions"], during["deleted_blobs"]) == (
        1,
        0,
        0,
    )
    assert runtime.blobs.read(blob) == GARBAGE and len(deletions(runtime)) == 1

    runtime.blob_tables.remove_references("last-owner", [blob])  # the release's second step
    after = gc(resources)["collected_blobs"]
    assert (after["deleted_blobs"], after["kept_still_referenced"]) == (1, 0)
    assert not runtime.content.exists(blob) and deletions(runtime) == []
