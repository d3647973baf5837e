"""The parts a mailq URL is made of, checked: its authority and userinfo, host and port lists, and values that
must match a pattern or be one of a set. Nothing here knows a deployment or an option (settings.py does)."""

from __future__ import annotations

import re
from collections.abc import Callable

from .errors import InvalidInput, shown

_AUTHORITY_END = re.compile(r"[/?#]")
_HOST = re.compile(
    r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)
_IPV6 = re.compile(r"\[[0-9A-Fa-f:.]+\]")
_PORT = re.compile(r"[0-9]{1,5}")
USER = re.compile(r"[A-Za-z0-9._~!$&'()*+,;=%-]{1,128}")
# Unquoted CQL identifiers are folded to lower case: only lower-case names mean what they say.
KEYSPACE = re.compile(r"[a-z][a-z0-9_]{0,47}")
BUCKET = re.compile(r"(?!.*\.\.)[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
REGION = re.compile(r"[a-z0-9-]{1,64}")
# S3's characters safe in any key; no leading '/' and no '//', so keys need no folder semantics.
PREFIX = re.compile(r"(?!/)(?!.*//)[A-Za-z0-9!_.*'()/-]{1,200}")
VHOST = re.compile(r"[!-~]{1,255}")


def split_authority(url: str) -> tuple[str, str, str]:
    """`url` as (what precedes its authority, the authority, what follows), never failing: `redact` must
    work on the URLs that the parser refuses too."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        return "", "", url
    end = _AUTHORITY_END.search(rest)
    cut = end.start() if end else len(rest)
    return scheme + separator, rest[:cut], rest[cut:]


def userinfo_of(authority: str) -> str | None:
    """The userinfo of an authority (`user:password@host`), or None when it has none."""
    userinfo, at, _ = authority.rpartition("@")
    return userinfo if at else None


def choice(value: str, name: str, choices: tuple[str, ...], fold: Callable[[str], str] = str) -> str:
    if fold(value) not in choices:
        raise InvalidInput(f"invalid {name} {shown(value)}: expected one of {', '.join(choices)}")
    return fold(value)


def matching(pattern: re.Pattern[str], value: str, name: str, expected: str) -> str:
    if not pattern.fullmatch(value):
        raise InvalidInput(f"invalid {name} {shown(value)}: expected {expected}")
    return value


def parse_port(text: str, name: str) -> int:
    """A TCP port, 1..65535, from its decimal text: the one parser of ports."""
    if not _PORT.fullmatch(text) or not 1 <= int(text) <= 65535:
        raise InvalidInput(f"invalid {name} {shown(text)}: expected a port number from 1 to 65535")
    return int(text)


def host_port(text: str, name: str, default_port: int) -> tuple[str, int]:
    """`host`, `host:port`, `[v6]` or `[v6]:port`."""
    if text.startswith("["):
        host, _, port = text.partition("]")
        host += "]"
        if port and not port.startswith(":"):
            raise InvalidInput(f"invalid {name} {shown(text)}: expected [address]:port")
        port = port[1:]
        matching(_IPV6, host, name, "an IPv6 address in brackets")
        host = host[1:-1]
    else:
        host, _, port = text.partition(":")
        matching(_HOST, host, name, "a host name or address, with an optional :port")
    return host, parse_port(port, f"{name} port") if port else default_port
