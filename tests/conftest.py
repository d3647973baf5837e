"""Suite-wide: the real-server fixtures of the harness (tests/servers), one instance of each per session, and
the tests' files in memory."""

import shutil
import tempfile
from pathlib import Path

import pytest

pytest_plugins = ["tests.servers.fixtures"]

# Every embedded commit syncs (the default durability), which a virtual disk makes the suite's largest cost;
# in memory a sync is nearly free and the suite runs about twice as fast. A run given --basetemp keeps it.
MEMORY = Path("/dev/shm")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if config.option.basetemp is None and MEMORY.is_dir():
        base = Path(tempfile.mkdtemp(prefix="mailq-tests-", dir=MEMORY))
        config.option.basetemp = base
        config.add_cleanup(lambda: shutil.rmtree(base, ignore_errors=True))


# `make test` runs the suite in two processes (pytest-xdist), then the tests marked `alone` by themselves:
# those of the three-node clusters and of the host bed (started by the tests that need them, a cluster
# takes the machine's two cores, and its fault tests time a node's loss and return) and those that time
# other processes' work.
CLUSTER_FIXTURES = frozenset(
    {"cassandra_cluster", "rabbitmq_cluster", "cassandra_cluster_tls", "rabbitmq_cluster_tls", "host_bed"}
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.alone)
