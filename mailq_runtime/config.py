"""The queue view configuration of record 31 (sliceWindow, bucketCount, updateBrowseStartPace), event-sourced.

Every accepted change is appended to `configuration_events`; the current configuration is the last
event. A change the rules forbid raises `ConfigurationRejected` naming the rule, and appends nothing.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from .clock import MICROS_PER_SECOND, Clock
from .errors import ConfigurationRejected, InvalidInput, shown
from .model import MAX_DURATION, MAX_DURATION_YEARS, parse_count
from .stores.protocols import ConfigurationEvents

AGGREGATE = "mail_queue_view_configuration"


@dataclass(frozen=True)
class QueueViewConfiguration:
    slice_window: int = 3600 * MICROS_PER_SECOND  # microseconds
    bucket_count: int = 1
    update_browse_start_pace: int = 1000

    def __post_init__(self) -> None:
        for name in ("slice_window", "bucket_count", "update_browse_start_pace"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidInput(f"invalid {name} {shown(value)}: must be a positive integer")
        parse_count(self.bucket_count, "bucket_count")
        parse_count(self.update_browse_start_pace, "update_browse_start_pace")
        if not 0 < self.slice_window <= MAX_DURATION:
            raise InvalidInput(
                f"invalid slice_window {shown(self.slice_window)}us: "
                f"expected a positive duration of at most {MAX_DURATION_YEARS} years"
            )
        if self.slice_window % MICROS_PER_SECOND:
            raise InvalidInput(
                f"invalid slice_window {self.slice_window}us: must be a whole number of seconds"
            )

    def validate_change(self, new: QueueViewConfiguration) -> None:
        if new.slice_window != self.slice_window and self.slice_window % new.slice_window:
            raise ConfigurationRejected(
                f"sliceWindow may only change to a divisor of the current one "
                f"({self.slice_window // MICROS_PER_SECOND}s -> "
                f"{new.slice_window // MICROS_PER_SECOND}s refused): "
                "otherwise earlier slices would not be found"
            )
        if new.bucket_count < self.bucket_count:
            raise ConfigurationRejected(
                f"bucketCount may only grow ({self.bucket_count} -> {new.bucket_count} refused): "
                "fewer buckets would lose the mails of the dropped ones"
            )


class ConfigurationStore:
    def __init__(self, events: ConfigurationEvents, clock: Clock) -> None:
        self.events = events
        self.clock = clock

    def current(self) -> QueueViewConfiguration:
        history = self.events.events(AGGREGATE)
        return QueueViewConfiguration(**json.loads(history[-1])) if history else QueueViewConfiguration()

    def history(self) -> list[QueueViewConfiguration]:
        return [QueueViewConfiguration(**json.loads(e)) for e in self.events.events(AGGREGATE)]

    def widest_slice_window(self) -> int:
        """The widest sliceWindow ever in force. A process opened before a change keeps writing slices of
        its window, which the rules make a multiple of every later one: a slice it may still fill starts
        no earlier than `now` aligned on this window."""
        return max((c.slice_window for c in self.history()), default=QueueViewConfiguration().slice_window)

    def register(self, new: QueueViewConfiguration) -> bool:
        """Apply `new` if the rules allow it; True if an event was appended, False if nothing changed.

        Race-safe without a transaction: the event is appended only at the position after the history it
        was checked against. When another process appended first, the change is checked again against
        that process's event, so two changes that each pass the rules alone are never both appended (the
        second may be refused: 1h -> 30m and 1h -> 20m race, one wins, 30m -> 20m is not a divisor).
        """
        while True:
            history = self.events.events(AGGREGATE)
            if history:
                current = QueueViewConfiguration(**json.loads(history[-1]))
                if new == current:
                    return False
                current.validate_change(new)
            if self.events.append_event(AGGREGATE, json.dumps(asdict(new)), self.clock(), len(history)):
                return True
