"""The mailq runtime as a Dagster resource: assets and sensors get the queues, blobs and mailboxes from it,
and the parsed settings that the Spark code hands its tasks."""

from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg
from pydantic import PrivateAttr

from mailq_runtime import Runtime
from mailq_runtime.settings import DEFAULT_URL, Settings


class MailqRuntime(dg.ConfigurableResource):
    """Opens the runtime of `url` (MAILQ_URL through EnvVar). A mailq URL carries no password, so the UI
    shows nothing secret: a URL that has one is refused, and the error shows it redacted.

    It never creates: maintenance of a store that does not exist is a mistyped URL, which fails naming
    the place it looked at (NoStore) instead of starting an empty store. `url` is the config Dagster's UI
    and environment set; it is parsed once, into `settings`, which is what the assets use."""

    url: str = DEFAULT_URL

    _runtime: Runtime | None = PrivateAttr(default=None)
    _settings: Settings | None = PrivateAttr(default=None)

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = Settings.from_url(self.url)
        return self._settings

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self._runtime = Runtime(self.settings)

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._runtime is not None:
            self._runtime.close()
            self._runtime = None

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            # Sensors build resources without an execution context: open on first use.
            self._runtime = Runtime(self.settings)
        return self._runtime

    @contextmanager
    def session(self) -> Iterator[Runtime]:
        """A runtime for one sensor tick or one call, closed afterwards."""
        runtime = Runtime(self.settings)
        try:
            yield runtime
        finally:
            runtime.close()
