"""Fixtures of the runtime contract suite: every test runs once per backend."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mailq_runtime import Runtime
from mailq_runtime.queue import MailQueue

from .helpers import EmbeddedBackend, FakeClock

QUEUE = "spool"


@pytest.fixture(params=["embedded"])
def backend(request: pytest.FixtureRequest, tmp_path) -> Iterator[EmbeddedBackend]:
    backends = {"embedded": lambda: EmbeddedBackend(tmp_path / "data")}
    opened = backends[request.param]()
    yield opened
    opened.close()


@pytest.fixture
def runtime(backend: EmbeddedBackend) -> Runtime:
    return backend.open()


@pytest.fixture
def queue(runtime: Runtime) -> MailQueue:
    return runtime.queue(QUEUE)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def clocked_runtime(backend: EmbeddedBackend, clock: FakeClock) -> Runtime:
    """A runtime on the fake clock: 1 s slices, no clock-skew grace, browse_start moved only on request."""
    return backend.open(clock, slice_window="1s", clock_skew_grace="0s", update_browse_start_pace=10**9)


@pytest.fixture
def clocked(clocked_runtime: Runtime) -> MailQueue:
    return clocked_runtime.queue(QUEUE)
