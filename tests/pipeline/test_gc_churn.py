"""A GC run costs what changed since the last one: the deletion rows of blobs found live are retired
(once settled), so the next run reads only new deletions, and none at all reads no reference."""

from __future__ import annotations

import dagster as dg
import pytest
from pyspark.sql import SparkSession

from assets import automation, blobs, jobs
from mailq_runtime import Runtime
from mailq_runtime.model import BlobId
from tests.runtime.backends import EmbeddedBackend

from .pipeline import checks_passed, gc_run_config, materialized
from .test_automation import evaluate, requested, skipped_because

# Several GC runs a test, each with its check, on a machine other work shares.
pytestmark = pytest.mark.timeout(900)

LIVE = b"Subject: kept\r\n\r\nheld by an owner for good"
GARBAGE = b"Subject: gone\r\n\r\nheld by nobody after its release"


def gc(
    resources: dict,
    instance: dg.DagsterInstance | None = None,
    filter_config: dict | None = None,
    **collect_config: object,
) -> dict[str, dict]:
    """One GC iteration (recorded in `instance` if given); every asset's figures, after the check passed."""
    run_config = gc_run_config(filter_config, collect_config)
    result = jobs.blob_gc_job.execute_in_process(
        resources=resources, run_config=run_config, instance=instance
    )
    assert result.success
    assert checks_passed(result) == {"no_live_blob_collected": True}
    return {
        name: materialized(result, name)
        for name in ("deletion_sets", "live_reference_filter", "collected_blobs")
    }


def deletions(runtime: Runtime) -> list[tuple[str, int, int]]:
    """(blob id, generation, GC iteration) of every deletion."""
    return EmbeddedBackend(runtime.settings.data_dir).blob_state().deletions


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
    runtime.blob_tables.add_deletions(
        "last-owner", [blob], runtime.generations.current_gc_iteration(), runtime.clock()
    )

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


def test_the_deletions_sensor_launches_only_on_new_work(
    runtime: Runtime, pipeline_resources, monkeypatch
) -> None:
    """The rows a run leaves (here the live blob's, inside the settle time; a false positive's alike)
    start no run, even at a sensor's first tick; a new deletion does."""
    monkeypatch.setenv("MAILQ_GC_MIN_DELETIONS", "1")
    sensor = automation.deletions_waiting_sensor
    instance = dg.DagsterInstance.ephemeral()
    eligible_live_and_garbage(runtime)
    assert requested(evaluate(sensor, runtime, instance=instance))  # two deletions nobody examined

    kept = gc(pipeline_resources(runtime.settings.data_dir), instance)["collected_blobs"]
    assert (kept["kept_still_referenced"], kept["retired_deletions"]) == (1, 0)
    assert len(deletions(runtime)) == 1  # the live blob's row, not settled yet
    first_tick = evaluate(sensor, runtime, instance=instance)
    assert skipped_because(first_tick) == "no deletion waiting in an eligible generation"
    assert not requested(evaluate(sensor, runtime, first_tick.cursor, instance))

    runtime.blobs.release("second-keeper")
    new_work = evaluate(sensor, runtime, first_tick.cursor, instance)
    assert requested(new_work)
    assert not requested(evaluate(sensor, runtime, new_work.cursor, instance))


def test_the_lookups_and_the_bloom_filter_collect_the_same_blobs(
    runtime: Runtime, pipeline_resources, spark: SparkSession
) -> None:
    resources = pipeline_resources(runtime.settings.data_dir)
    contents = [b"Subject: %d\r\n\r\n" % n + bytes([97 + n]) * 50 for n in range(8)]
    blobs = [runtime.blobs.save(f"first-{n}", data) for n, data in enumerate(contents)]
    for n, data in enumerate(contents[:4]):  # the first four keep a second owner: live
        runtime.blobs.save(f"second-{n}", data)
    for n in range(8):
        runtime.blobs.release(f"first-{n}")
    runtime.generations.rotate()
    runtime.generations.rotate()
    garbage = sorted(map(str, blobs[4:]))

    def dry_run(filter_config: dict) -> tuple[dict, list[str]]:
        """A GC plan: the blobs a real run would delete."""
        run_config = gc_run_config(filter_config, {})
        result = jobs.gc_plan_job.execute_in_process(resources=resources, run_config=run_config)
        assert result.success
        figures = materialized(result, "gc_plan")
        planned = spark.read.parquet(figures["path"]).select("blob_id").collect()
        return figures, sorted(r["blob_id"] for r in planned)

    # A false-positive rate low enough that the filter keeps no garbage back.
    bloom, by_filter = dry_run({"lookup_limit": 0, "false_positive_probability": 1e-9})
    lookups, looked_up = dry_run({})
    assert (bloom["mode"], lookups["mode"]) == ("bloom filter", "reference lookups")
    assert by_filter == looked_up == garbage
    assert bloom["kept_still_referenced"] == lookups["kept_still_referenced"] == 4

    applied = gc(resources)["collected_blobs"]  # the lookups, for real
    assert (applied["deleted_blobs"], applied["kept_still_referenced"]) == (4, 4)
    assert [runtime.content.exists(blob) for blob in blobs] == [True] * 4 + [False] * 4


def check_alone(resources: dict, instance: dg.DagsterInstance) -> dict:
    """`no_live_blob_collected` alone, as the UI runs it, on the last run's collected_blobs in `instance`;
    its evaluation's metadata."""
    result = dg.materialize(
        [blobs.COLLECTED_BLOBS, blobs.no_live_blob_collected],
        resources=resources,
        instance=instance,
        selection=dg.AssetSelection.checks(blobs.no_live_blob_collected),
        raise_on_error=False,  # a blocking check that fails raises otherwise
    )
    (evaluation,) = result.get_asset_check_evaluations()
    return {"passed": evaluation.passed} | {k: v.value for k, v in evaluation.metadata.items()}


def test_the_check_looks_up_only_what_the_run_collected_and_fails_on_a_referenced_one(
    runtime: Runtime, pipeline_resources
) -> None:
    resources = pipeline_resources(runtime.settings.data_dir)
    _, garbage = eligible_live_and_garbage(runtime)
    instance = dg.DagsterInstance.ephemeral()
    gc(resources, instance, settle="0s")
    assert check_alone(resources, instance) == {
        "passed": True,
        "collected_blobs_checked": 1,
        "collected_yet_referenced": 0,
        "sample": [],
    }

    # What a collector that took a live blob would leave: a reference to a collected blob.
    EmbeddedBackend(runtime.settings.data_dir).add_reference("late", str(garbage), 1)
    assert check_alone(resources, instance) == {
        "passed": False,
        "collected_blobs_checked": 1,
        "collected_yet_referenced": 1,
        "sample": [str(garbage)],
    }
