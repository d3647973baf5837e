"""Runtime settings from one URL: `embedded://<data dir>?option=value&...` (default `embedded://.mailq`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from .clock import MICROS_PER_SECOND
from .config import QueueViewConfiguration
from .errors import InvalidInput
from .model import parse_duration

DEFAULT_URL = "embedded://.mailq"
URL_VARIABLE = "MAILQ_URL"
_CONFIGURATION_OPTIONS = {"slice_window", "bucket_count", "update_browse_start_pace"}


@dataclass(frozen=True)
class Settings:
    backend: str
    data_dir: Path
    visibility_timeout: int = 300 * MICROS_PER_SECOND
    clock_skew_grace: int = 60 * MICROS_PER_SECOND
    max_message_size: int = 32 * 1024 * 1024
    durability: str = "process"  # see stores/embedded.py: process | power | fsync
    # View configuration values to register at open, as James does at start-up; the others keep
    # their stored values.
    view_configuration: dict[str, int] | None = None

    @classmethod
    def from_url(cls, url: str | None = None) -> Settings:
        url = url or os.environ.get(URL_VARIABLE) or DEFAULT_URL
        parts = urlsplit(url)
        if parts.scheme != "embedded":
            raise InvalidInput(
                f"unsupported mailq URL scheme {parts.scheme!r} in {url!r}: expected 'embedded://<data dir>'"
            )
        data_dir = Path(parts.netloc + parts.path) if parts.netloc + parts.path else Path(".mailq")
        options = dict(parse_qsl(parts.query, strict_parsing=False))
        known = {"visibility_timeout", "clock_skew_grace", "max_message_size", "durability"}
        known |= _CONFIGURATION_OPTIONS
        unknown = set(options) - known
        if unknown:
            raise InvalidInput(f"unknown mailq URL option(s) {sorted(unknown)}: known are {sorted(known)}")
        values: dict = {}
        for name in ("visibility_timeout", "clock_skew_grace"):
            if name in options:
                values[name] = parse_duration(options[name])
                if values[name] < 0:
                    raise InvalidInput(f"{name} must not be negative")
        if "max_message_size" in options:
            values["max_message_size"] = _positive_int("max_message_size", options["max_message_size"])
        if "durability" in options:
            if options["durability"] not in ("process", "power", "fsync"):
                raise InvalidInput(
                    f"invalid durability {options['durability']!r}: expected process, power or fsync"
                )
            values["durability"] = options["durability"]
        changes: dict[str, int] = {}
        if "slice_window" in options:
            changes["slice_window"] = parse_duration(options["slice_window"])
        for name in ("bucket_count", "update_browse_start_pace"):
            if name in options:
                changes[name] = _positive_int(name, options[name])
        if changes:
            QueueViewConfiguration(**changes)  # validates the values; the rules on changes apply at open
            values["view_configuration"] = changes
        return cls(backend=parts.scheme, data_dir=data_dir, **values)


def _positive_int(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise InvalidInput(f"invalid {name} {text!r}: expected a positive integer") from None
    if value <= 0:
        raise InvalidInput(f"invalid {name} {text!r}: expected a positive integer")
    return value
