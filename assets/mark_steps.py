"""The GC's read-only steps as ops of the GC jobs (jobs.py), which are op-based so that the UI's
"Materialize all" never selects their destructive steps (reported.py). Each runs its asset's own
computation, reports a materialisation of that asset, and stores its output where the asset's goes; the
ops bear other names than the assets because a code location's op names are unique.
"""

from collections.abc import Iterator

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import DataFrame

from resources import MailqRuntime

from . import blobs, reported


@dg.op(out=reported.stored("reference_generations"))
def read_reference_generations(mailq: MailqRuntime) -> Iterator:
    """reference_generations, as its asset computes it."""
    yield from _reported(blobs.reference_generations, blobs.generations_output(mailq))


@dg.op(out=reported.stored("deletion_sets"))
def read_deletion_sets(
    reference_generations: dict, mailq: MailqRuntime, pyspark: LazyPySparkResource
) -> Iterator:
    """deletion_sets, as its asset computes it."""
    yield from _reported(
        blobs.deletion_sets, blobs.deletion_sets_output(reference_generations, mailq, pyspark)
    )


@dg.op(out=reported.stored("live_reference_filter"))
def build_live_reference_filter(
    config: blobs.BloomFilterConfig,
    deletion_sets: DataFrame,
    mailq: MailqRuntime,
    pyspark: LazyPySparkResource,
) -> Iterator:
    """live_reference_filter, as its asset computes it (the same config)."""
    yield from _reported(
        blobs.live_reference_filter, blobs.filter_output(config, deletion_sets, mailq, pyspark)
    )


def _reported(asset: dg.AssetsDefinition, output: dg.Output) -> Iterator:
    yield reported.materialization(asset, output)
    yield dg.Output(output.value)
