"""Runtime settings from one URL: `embedded://<data dir>?option=value&...` (default `embedded://.mailq`).

A mailq URL never carries a password: passwords and keys come from the environment. A URL whose userinfo
holds one is refused, and every message that shows a URL shows it through `redact`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, unquote_plus, urlsplit

from .clock import MICROS_PER_SECOND
from .config import QueueViewConfiguration
from .errors import InvalidInput, shown
from .model import parse_count, parse_duration

DEFAULT_URL = "embedded://.mailq"
URL_VARIABLE = "MAILQ_URL"
_CONFIGURATION_OPTIONS = {"slice_window", "bucket_count", "update_browse_start_pace"}
_OPTIONS = {
    "visibility_timeout",
    "clock_skew_grace",
    "max_message_size",
    "durability",
    *_CONFIGURATION_OPTIONS,
}
_AUTHORITY_END = re.compile(r"[/?#]")


def _authority(url: str) -> tuple[str, str, str]:
    """`url` as (what precedes its authority, the authority, what follows), never failing: `redact` must
    work on the URLs that `urlsplit` refuses too."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        return "", "", url
    end = _AUTHORITY_END.search(rest)
    cut = end.start() if end else len(rest)
    return scheme + separator, rest[:cut], rest[cut:]


def _userinfo(authority: str) -> str | None:
    """The userinfo of an authority (`user:password@host`), or None when it has none."""
    userinfo, at, _ = authority.rpartition("@")
    return userinfo if at else None


def redact(url: str) -> str:
    """`url` as a message may show it: a password in its userinfo, and the value of any option mailq does
    not know (it may be a key), replaced by ***."""
    head, authority, tail = _authority(url)
    userinfo = _userinfo(authority)
    if userinfo is not None and ":" in userinfo:
        authority = userinfo.partition(":")[0] + ":***@" + authority.rpartition("@")[2]
    path, question, rest = tail.partition("?")
    if question:
        query, hash_mark, fragment = rest.partition("#")
        options = [
            option
            if unquote_plus(option.partition("=")[0]) in _OPTIONS
            else option.partition("=")[0] + "=***"
            for option in query.split("&")
        ]
        tail = path + "?" + "&".join(options) + hash_mark + fragment
    return head + authority + tail


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
        if not isinstance(url, str):
            raise InvalidInput(f"a mailq URL is text, not {type(url).__name__}")
        userinfo = _userinfo(_authority(url)[1])
        if userinfo is not None and ":" in userinfo:
            raise InvalidInput(
                f"the mailq URL {shown(redact(url))} carries a password: a mailq URL never does, "
                "passwords and keys come from the environment"
            )
        try:
            parts = urlsplit(url)
        except ValueError as error:
            raise InvalidInput(f"invalid mailq URL {shown(redact(url))}: {error}") from None
        if parts.scheme != "embedded":
            raise InvalidInput(
                f"unsupported mailq URL scheme {shown(parts.scheme)} in {shown(redact(url))}: "
                "expected 'embedded://<data dir>'"
            )
        if userinfo is not None:
            raise InvalidInput(
                f"the embedded URL {shown(redact(url))} takes no user name: expected 'embedded://<data dir>'"
            )
        data_dir = Path(parts.netloc + parts.path) if parts.netloc + parts.path else Path(".mailq")
        options = dict(parse_qsl(parts.query, strict_parsing=False))
        unknown = set(options) - _OPTIONS
        if unknown:
            raise InvalidInput(
                f"unknown mailq URL option(s) {', '.join(shown(name) for name in sorted(unknown))}: "
                f"known are {sorted(_OPTIONS)}"
            )
        values: dict = {}
        for name in ("visibility_timeout", "clock_skew_grace"):
            if name in options:
                values[name] = parse_duration(options[name], name)
        if "max_message_size" in options:
            values["max_message_size"] = parse_count(options["max_message_size"], "max_message_size")
        if "durability" in options:
            if options["durability"] not in ("process", "power", "fsync"):
                raise InvalidInput(
                    f"invalid durability {shown(options['durability'])}: expected process, power or fsync"
                )
            values["durability"] = options["durability"]
        changes: dict[str, int] = {}
        if "slice_window" in options:
            changes["slice_window"] = parse_duration(options["slice_window"], "slice_window")
        for name in ("bucket_count", "update_browse_start_pace"):
            if name in options:
                changes[name] = parse_count(options[name], name)
        if changes:
            QueueViewConfiguration(**changes)  # validates the values; the rules on changes apply at open
            values["view_configuration"] = changes
        return cls(backend=parts.scheme, data_dir=data_dir, **values)
