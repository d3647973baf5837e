"""Time as integer microseconds since the epoch: the unit of every stored timestamp."""

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

Clock = Callable[[], int]

MICROS_PER_SECOND = 1_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MICRO = timedelta(microseconds=1)
# The latest instant a datetime can show: a delay that would end after it is refused (model.delivery_time).
LATEST = (datetime(9999, 12, 31, tzinfo=UTC) - _EPOCH) // _ONE_MICRO


def system_clock() -> int:
    return time.time_ns() // 1000


def to_datetime(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)


def from_datetime(moment: datetime) -> int:
    if moment.tzinfo is None:
        raise ValueError(f"naive datetime {moment!r}: give a timezone")
    # Integer arithmetic: timestamp() goes through a float and loses microseconds.
    return (moment - _EPOCH) // _ONE_MICRO
