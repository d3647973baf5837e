"""Who may use `mailq smtp` for what: the networks allowed to relay, the AUTH credentials, the TLS context.

Relaying to a domain that is not local is allowed to a client in the configured networks (by default the
host itself, as Postfix's `mynetworks_style = host`) or authenticated with AUTH, which is only offered over
TLS: the server is never an open relay. Passwords are read from a file or the environment and never
appear in a message or a log line.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import ssl
from collections.abc import Iterable, Mapping
from pathlib import Path

from aiosmtpd.smtp import AuthResult, LoginPassword

from ..errors import InvalidInput, shown

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Where credentials come from without a file: lines of user:password, as in the file.
CREDENTIALS_VARIABLE = "MAILQ_SMTP_AUTH"


def parse_networks(texts: Iterable[str]) -> tuple[Network, ...]:
    networks = []
    for text in texts:
        try:
            networks.append(ipaddress.ip_network(text.strip(), strict=False))
        except ValueError:
            raise InvalidInput(
                f"invalid network {shown(text)}: expected an address or CIDR such as 10.0.0.0/8"
            ) from None
    return tuple(networks)


def in_networks(address: str, networks: Iterable[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in network for network in networks)


def parse_credentials(text: str, origin: str) -> dict[str, bytes]:
    """user:password lines ('#' comments and blank lines skipped); the password may hold ':'."""
    credentials: dict[str, bytes] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, colon, password = line.partition(":")
        if not colon or not user or not password:
            # The line is not echoed: it may be a password.
            raise InvalidInput(f"{origin}, line {number}: expected user:password")
        credentials[user] = password.encode()
    return credentials


def load_credentials(auth_file: Path | None, environ: Mapping[str, str] = os.environ) -> dict[str, bytes]:
    """The credentials of `auth_file`, else of $MAILQ_SMTP_AUTH, else none (AUTH is not offered)."""
    if auth_file is not None:
        try:
            text = auth_file.read_text()
        except (OSError, UnicodeDecodeError) as error:
            reason = getattr(error, "strerror", None) or type(error).__name__
            raise InvalidInput(f"cannot read the auth file {shown(str(auth_file))}: {reason}") from None
        return parse_credentials(text, f"the auth file {shown(str(auth_file))}")
    text = environ.get(CREDENTIALS_VARIABLE)
    return {} if not text else parse_credentials(text, f"${CREDENTIALS_VARIABLE}")


class Authenticator:
    """aiosmtpd's `authenticator` for PLAIN and LOGIN: the login and password checked in constant time."""

    def __init__(self, credentials: Mapping[str, bytes]) -> None:
        self.credentials = dict(credentials)

    def __call__(
        self, server: object, session: object, envelope: object, mechanism: str, data: object
    ) -> AuthResult:
        if not isinstance(data, LoginPassword):
            return AuthResult(success=False, handled=False)
        login = data.login.decode(errors="replace")
        expected = self.credentials.get(login)
        # Compared even for an unknown user, so that the reply time does not tell which users exist.
        matched = hmac.compare_digest(data.password, expected if expected is not None else b"\0" * 16)
        success = expected is not None and matched
        return AuthResult(success=success, handled=False, auth_data=login if success else None)


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """The server's context for STARTTLS, from a PEM certificate (chain) and its key."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as error:
        reason = getattr(error, "strerror", None) or getattr(error, "reason", None) or str(error)
        raise InvalidInput(
            f"cannot load the TLS certificate {shown(str(cert))} and key {shown(str(key))}: {reason}"
        ) from None
    return context
