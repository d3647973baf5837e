"""When a deferred mail is tried again, and when it has waited too long: Postfix's backoff."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from ..clock import MICROS_PER_SECOND
from ..errors import InvalidInput
from ..model import parse_duration


@dataclass(frozen=True)
class RetrySchedule:
    """Postfix's `minimal_backoff_time` (300 s), `maximal_backoff_time` (4,000 s) and
    `maximal_queue_lifetime` (5 days), in microseconds.

    As Postfix's queue manager, the delay is the mail's age clamped between the first and the longest
    delay: a mail tried at age a is tried next at about 2a, so the delays double from the first up to the
    longest without any count of attempts to keep (a mail retried through the queue carries none)."""

    first: int = 300 * MICROS_PER_SECOND
    longest: int = 4000 * MICROS_PER_SECOND
    max_age: int = 5 * 86400 * MICROS_PER_SECOND

    @classmethod
    def of(
        cls,
        first: timedelta | int | float | str = "300s",
        longest: timedelta | int | float | str = "4000s",
        max_age: timedelta | int | float | str = "5d",
    ) -> RetrySchedule:
        schedule = cls(
            parse_duration(first, "retry_first"),
            parse_duration(longest, "retry_longest"),
            parse_duration(max_age, "max_age"),
        )
        if not 0 < schedule.first <= schedule.longest:
            raise InvalidInput("the retry delays need 0 < first <= longest")
        return schedule

    def delay(self, age: int) -> int:
        """The delay before the next attempt of a mail `age` microseconds old."""
        return min(max(age, self.first), self.longest)

    def expired(self, age: int) -> bool:
        return age >= self.max_age
