"""Suite-wide: the real-server fixtures of the harness (tests/servers), one instance of each per session,
and how `make test` spreads the tests over pytest-xdist workers (`--dist loadgroup`): a file's tests stay
together on one worker (its module fixtures are set up once), and so do the tests of one named
`xdist_group` across files."""

import pytest

pytest_plugins = ["tests.servers.fixtures"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
