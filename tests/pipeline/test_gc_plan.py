"""Mark, review, sweep: a dry run writes a plan that names exactly the garbage and why, and deletes
nothing; applying it deletes exactly its blobs that are still collectable, keeps one a reference came
back to, and deletes nothing the second time. On both deployments."""

from __future__ import annotations

import dagster as dg
import pytest
from pyspark.sql import SparkSession

from assets import gc_records, jobs
from mailq_runtime import Runtime
from mailq_runtime.model import BlobId
from tests.runtime.backends import Backend

from .pipeline import checks_passed, materialized

# Several runs a test on a machine other work shares.
pytestmark = pytest.mark.timeout(900)

GARBAGE = [b"Subject: gone %d\r\n\r\nreleased by its only owner" % n for n in range(3)]
LIVE = b"Subject: kept\r\n\r\nstill held by one owner"


def make_plan(resources: dict, **filter_config: object) -> dict:
    run_config = (
        {"ops": {"build_live_reference_filter": {"config": filter_config}}} if filter_config else None
    )
    result = jobs.gc_plan_job.execute_in_process(resources=resources, run_config=run_config)
    assert result.success
    return materialized(result, "gc_plan")


def apply_run(resources: dict, plan_id: str | None) -> dg.ExecuteInProcessResult:
    """gc_apply_job; with no plan_id, as launched from the UI with its default config."""
    run_config = {"ops": {"applied_gc_plan": {"config": {"plan_id": plan_id}}}} if plan_id else None
    return jobs.gc_apply_job.execute_in_process(
        resources=resources, run_config=run_config, raise_on_error=False
    )


def apply(resources: dict, plan_id: str | None = None) -> dict:
    result = apply_run(resources, plan_id)
    assert result.success
    assert checks_passed(result) == {"no_live_blob_collected": True}
    return materialized(result, "applied_gc_plan")


def failure_of(result: dg.ExecuteInProcessResult) -> str:
    assert not result.success
    (failure,) = result.get_step_failure_events()
    return str(failure.step_failure_data.error)


def plan_rows(spark: SparkSession, figures: dict) -> dict[str, dict]:
    return {row["blob_id"]: row.asDict() for row in spark.read.parquet(figures["path"]).collect()}


def kept(figures: dict) -> dict[str, int]:
    return {row.data["reason"]: row.data["blobs"] for row in figures["kept"].records}


def eligible_garbage_and_live(runtime: Runtime) -> tuple[list[BlobId], BlobId]:
    garbage = [runtime.blobs.save(f"leaver-{n}", data) for n, data in enumerate(GARBAGE)]
    live = runtime.blobs.save("keeper", LIVE)
    runtime.blobs.save("passer-by", LIVE)
    for owner in ("leaver-0", "leaver-1", "leaver-2", "passer-by"):
        runtime.blobs.release(owner)
    runtime.generations.rotate()
    runtime.generations.rotate()
    return garbage, live


def test_a_plan_names_the_garbage_and_why_and_its_application_rechecks_each_blob(
    backend: Backend, deployment_resources: dict, spark: SparkSession
) -> None:
    runtime, resources = backend.open(), deployment_resources
    try:
        garbage, live = eligible_garbage_and_live(runtime)
        state = backend.blob_state()
        before = (state.blobs, state.deletions, state.contents)

        looked_up = make_plan(resources)
        assert (looked_up["mode"], looked_up["blobs_to_delete"], looked_up["kept_still_referenced"]) == (
            "reference lookups",
            3,
            1,
        )
        assert looked_up["bytes_to_reclaim"] == sum(map(len, GARBAGE))
        assert looked_up["apply_with"] == f"mailq gc --apply {looked_up['plan_id']}"
        rows = plan_rows(spark, looked_up)
        assert set(rows) == set(map(str, garbage))
        for blob_id in garbage:
            row = rows[str(blob_id)]
            assert (row["plan_id"], row["generation"], row["bytes"]) == (
                looked_up["plan_id"],
                1,
                len(GARBAGE[garbage.index(blob_id)]),
            )
            assert (row["found_by"], row["salt"]) == ("exact reference lookup", None)
            assert row["deletion_times"] == [at for at, _, _ in runtime.blobs.explain(blob_id).deletions]
            assert row["owners"] == [f"leaver-{garbage.index(blob_id)}"]  # whose release made it garbage

        # The Bloom filter's plan names the same blobs, each with the filter's salt and rate.
        bloomed = make_plan(resources, lookup_limit=0, false_positive_probability=1e-9)
        assert bloomed["mode"] == "bloom filter" and bloomed["plan_id"] != looked_up["plan_id"]
        rows = plan_rows(spark, bloomed)
        assert set(rows) == set(map(str, garbage))
        assert {(r["found_by"], r["salt"], r["false_positive_probability"]) for r in rows.values()} == {
            ("absent from the Bloom filter", bloomed["salt"], 1e-9)
        }
        # A dry run deletes nothing and retires nothing.
        state = backend.blob_state()
        assert (state.blobs, state.deletions, state.contents) == before

        # A reference to the first garbage blob comes back (the case record 39's n-2 rule leaves open).
        runtime.blob_tables.add_references("late-owner", [garbage[0]])
        # Applied with the default config: the newest plan not applied yet, the Bloom filter's.
        applied = apply(resources)
        assert applied["plan_id"] == bloomed["plan_id"]
        assert (applied["planned_blobs"], applied["deleted_blobs"], applied["kept_blobs"]) == (3, 2, 1)
        leavers = sorted((1, 2), key=lambda n: str(garbage[n]))  # listed by blob id
        assert [row.data for row in applied["deleted"].records] == [
            {
                "owners": f"leaver-{n}",
                "generation": "rg1",
                "bytes": len(GARBAGE[n]),
                "blob": f"{str(garbage[n])[:15]}…",
                "blob_id": str(garbage[n]),
            }
            for n in leavers
        ]
        assert applied["bytes_reclaimed"] == len(GARBAGE[1]) + len(GARBAGE[2])
        assert kept(applied) == {gc_records.KEPT_REFERENCED_AGAIN: 1}
        assert runtime.blobs.read(garbage[0]) == GARBAGE[0] and runtime.blobs.read(live) == LIVE
        assert [runtime.content.exists(b) for b in garbage] == [True, False, False]
        assert set(backend.blob_state().blobs) == {str(garbage[0]), str(live)}

        # The other plan, and the first again: nothing left to delete.
        for plan_id in (looked_up["plan_id"], bloomed["plan_id"]):
            again = apply(resources, plan_id)
            assert (again["deleted_blobs"], again["note"]) == (0, "nothing deleted")
            assert (again["deleted"].records, again["deleted_note"]) == ([], "nothing deleted")
            assert kept(again) == {gc_records.KEPT_GONE: 2, gc_records.KEPT_REFERENCED_AGAIN: 1}
        assert runtime.blobs.read(garbage[0]) == GARBAGE[0]
        # Launched as it is from the UI: nothing to apply is said, and no failure.
        nothing = apply(resources)
        assert nothing["note"] == (
            f"every plan with blobs is applied, the newest, {bloomed['plan_id']}, too: nothing to apply"
        )

        runtime.blobs.release("late-owner")
        last = make_plan(resources)
        assert set(plan_rows(spark, last)) == {str(garbage[0])}
        assert apply(resources)["deleted_blobs"] == 1
        twice = apply(resources, last["plan_id"])
        assert (twice["deleted_blobs"], kept(twice)) == (0, {gc_records.KEPT_GONE: 1})
        assert twice["note"].startswith("nothing deleted: the plan's 1 blob(s) are all gone already")
        assert set(backend.blob_state().blobs) == {str(live)} and runtime.blobs.read(live) == LIVE
    finally:
        runtime.close()


def test_an_unknown_plan_fails_the_run_and_changes_nothing(
    backend: Backend, deployment_resources: dict
) -> None:
    runtime = backend.open()
    try:
        eligible_garbage_and_live(runtime)
        state = backend.blob_state()
        before = (state.blobs, state.contents)
        for plan_id, words in (
            ("20260101T000000Z-0badc0de", "unknown GC plan"),
            ("../etc", "invalid GC plan id"),
        ):
            assert words in failure_of(apply_run(deployment_resources, plan_id))
        state = backend.blob_state()
        assert (state.blobs, state.contents) == before
    finally:
        runtime.close()


def test_applying_when_the_newest_plan_is_empty_succeeds_and_says_so(
    backend: Backend, deployment_resources: dict
) -> None:
    runtime = backend.open()
    try:
        # No plan yet: the run fails, naming the job that makes one.
        assert "no GC plan to apply: none under" in failure_of(apply_run(deployment_resources, None))
        garbage, _ = eligible_garbage_and_live(runtime)
        older = make_plan(deployment_resources)
        for n in range(3):  # the garbage collected meanwhile: the next plan finds nothing
            runtime.blob_tables.add_references(f"keeper-{n}", [garbage[n]])
        empty = make_plan(deployment_resources)
        assert (empty["blobs_to_delete"], older["blobs_to_delete"]) == (0, 3)
        state = backend.blob_state()
        before = (state.blobs, state.contents)

        applied = apply(deployment_resources)

        assert applied["note"] == f"the newest plan, {empty['plan_id']}, holds no blob: nothing to apply"
        assert applied["plan_id"] == empty["plan_id"]
        assert [applied[k] for k in ("planned_blobs", "deleted_blobs", "bytes_reclaimed", "kept_blobs")] == [
            0,
            0,
            0,
            0,
        ]
        assert applied["deleted"].records == [] and applied["deleted_note"] == "nothing to apply"
        state = backend.blob_state()
        assert (state.blobs, state.contents) == before
    finally:
        runtime.close()
