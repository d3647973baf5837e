"""A pace for maintenance writes that share the store with live traffic: at most N a second."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from .errors import InvalidInput, shown


def check_rate(value: object) -> float:
    """A rate in operations a second: a positive finite number (a string is parsed)."""
    try:
        rate = float(value) if isinstance(value, str) else value
    except ValueError:
        rate = None
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate) or rate <= 0:
        raise InvalidInput(f"invalid rate {shown(value)}: expected a positive number of operations a second")
    return float(rate)


class RateLimit:
    """`wait()` before each operation: the first goes at once, each next one at least 1/rate seconds after
    the previous one (no burst after an idle spell). None: no limit. It counts the operations and the
    time from the first one's start to the last one's, which the rate bounds from below."""

    def __init__(
        self,
        per_second: float | None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.interval = 0.0 if per_second is None else 1.0 / check_rate(per_second)
        self.clock = clock
        self.sleep = sleep
        self.operations = 0
        self.first: float | None = None
        self.last: float | None = None

    def wait(self) -> None:
        now = self.clock()
        if self.last is not None and self.last + self.interval > now:
            self.sleep(self.last + self.interval - now)
            now = max(self.last + self.interval, self.clock())
        if self.first is None:
            self.first = now
        self.last = now
        self.operations += 1

    def seconds(self) -> float:
        """From the first operation's start to the last one's (0 for fewer than two)."""
        return 0.0 if self.first is None or self.last is None else self.last - self.first
