"""The pace of maintenance writes: at most N a second, measured on the monotonic clock."""

from __future__ import annotations

import time

import pytest

from mailq_runtime import InvalidInput
from mailq_runtime.pacing import RateLimit, check_rate


def test_twenty_operations_at_ten_a_second_take_about_two_seconds() -> None:
    limit = RateLimit(10)
    started = time.monotonic()
    turns = []
    for _ in range(20):
        limit.wait()
        turns.append(time.monotonic())
    elapsed = time.monotonic() - started
    # The limit promises a floor (each turn at least 1/rate after the last); the ceiling only catches a
    # limiter that waits a turn twice, with room for a loaded machine's late wake-ups.
    assert 1.9 <= elapsed < 3.8
    assert all(b - a >= 0.099 for a, b in zip(turns, turns[1:], strict=False))
    assert limit.operations == 20 and 1.9 <= limit.seconds() < 3.8


def test_without_a_limit_nothing_waits() -> None:
    limit = RateLimit(None)
    started = time.monotonic()
    for _ in range(1000):
        limit.wait()
    assert time.monotonic() - started < 0.5
    assert limit.operations == 1000


def test_an_idle_spell_earns_no_burst() -> None:
    now = [0.0]
    slept = []

    def sleep(seconds: float) -> None:
        slept.append(round(seconds, 6))
        now[0] += seconds

    limit = RateLimit(2, clock=lambda: now[0], sleep=sleep)
    limit.wait()
    now[0] += 10.0  # idle
    limit.wait()
    limit.wait()
    limit.wait()
    assert slept == [0.5, 0.5]
    assert limit.seconds() == 11.0


@pytest.mark.parametrize("rate", [0, -1, "0", "fast", float("inf"), float("nan"), True, None, "1e400"])
def test_a_rate_that_is_not_a_positive_number_is_refused(rate: object) -> None:
    with pytest.raises(InvalidInput, match="invalid rate"):
        check_rate(rate)
    assert check_rate("2.5") == 2.5 and check_rate(3) == 3.0
