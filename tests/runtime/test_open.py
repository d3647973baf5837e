"""Opening a runtime writes nothing; only a creating open (enqueue, worker, config set, schema create)
makes the store, the first reference generation and the configuration event."""

from __future__ import annotations

import pytest

from mailq_runtime import NoStore, Runtime
from mailq_runtime.clock import MICROS_PER_SECOND
from mailq_runtime.config import QueueViewConfiguration

from .conftest import QUEUE
from .helpers import make_mail


def test_where_there_is_no_store_an_open_names_the_place_and_creates_nothing(backend):
    nowhere = backend.elsewhere()
    with pytest.raises(NoStore, match=nowhere.missing_store):
        Runtime.open(nowhere.url())
    assert not nowhere.exists()
    nowhere.close()


def test_a_creating_open_records_the_configuration(backend):
    with Runtime.open(backend.url(bucket_count=3), create=True) as runtime:
        assert runtime.view_configuration == QueueViewConfiguration(bucket_count=3)
        assert runtime.generations.current() == 1
        # The first reference generation is emitted by the first save (or rotation), not by the open.
        assert runtime.generations.reference_generations() == []
        assert len(runtime.configuration.history()) == 1
    before = backend.state()
    Runtime.open(backend.url(bucket_count=3), create=True).close()
    assert backend.state() == before


def test_an_open_writes_nothing_and_reads_the_stored_configuration(backend):
    backend.open(slice_window="1h").queue(QUEUE).enqueue(make_mail("kept"))
    before = backend.state()
    # The URL's configuration is registered by creating opens only: this one reads the stored one.
    with Runtime.open(backend.url(slice_window="30m", bucket_count=4)) as runtime:
        assert runtime.view_configuration.slice_window == 3600 * MICROS_PER_SECOND
        assert runtime.view_configuration.bucket_count == 1
        assert [item.name for item in runtime.queue(QUEUE, create=False).browse()] == ["kept"]
        assert runtime.queue(QUEUE).size() == 1
        assert runtime.generations.current() == 1
    assert backend.state() == before
