"""Suite-wide: the real-server fixtures of the harness (tests/servers), one instance of each per session."""

pytest_plugins = ["tests.servers.fixtures"]
