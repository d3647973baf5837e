"""What every `mailq` command prints through: the `Report` a handler returns, the progress bar, and the
shapes of times, durations and tables on a terminal."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

from mailq_runtime.clock import MICROS_PER_SECOND, to_datetime

# Below this many items a bar would only flicker.
_PROGRESS_MINIMUM = 500
_PROGRESS_WIDTH = 30


@dataclass
class Report:
    """What a subcommand did: `data` is the JSON document, `lines` the human rendering of it, `status` the
    exit status once it is printed (non-zero when the work ran but failed, e.g. a failed asset check)."""

    data: Any
    lines: list[str] = field(default_factory=list)
    status: int = 0


Advance = Callable[[int], None]


@contextmanager
def progress_bar(label: str, total: int, stream: TextIO | None = None) -> Iterator[Advance]:
    """A one-line bar on stderr, redrawn at most ten times a second; silent unless stderr is a terminal."""
    stream = stream if stream is not None else sys.stderr
    if total < _PROGRESS_MINIMUM or not stream.isatty():
        yield lambda count=1: None
        return
    done = 0
    drawn_at = 0.0
    drawn = ""

    def draw() -> None:
        nonlocal drawn
        filled = _PROGRESS_WIDTH * min(done, total) // total
        drawn = f"{label} [{'#' * filled}{'-' * (_PROGRESS_WIDTH - filled)}] {done}/{total}"
        stream.write("\r" + drawn)
        stream.flush()

    def advance(count: int = 1) -> None:
        nonlocal done, drawn_at
        done += count
        now = time.monotonic()
        if now - drawn_at >= 0.1:
            drawn_at = now
            draw()

    try:
        yield advance
    finally:
        draw()
        # Erase the bar so that the command's own output starts on a clean line.
        stream.write("\r" + " " * len(drawn) + "\r")
        stream.flush()


def time_text(micros_or_moment: int | datetime) -> str:
    moment = micros_or_moment if isinstance(micros_or_moment, datetime) else to_datetime(micros_or_moment)
    return moment.astimezone(UTC).isoformat(timespec="seconds")


def duration_text(micros: int) -> str:
    seconds = micros // MICROS_PER_SECOND
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    ]


def span(length: timedelta) -> str:
    """A duration in its two largest units: 3d4h, 2h05m, 7m30s, 12s."""
    seconds = max(int(length.total_seconds()), 0)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{seconds:02d}s"
    return f"{seconds}s"
