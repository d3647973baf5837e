"""Where mail for a domain goes: the transport table, else MX records by preference, else the domain's
own address (RFC 5321 5.1); a null MX (RFC 7505) means the domain takes no mail."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

import dns.exception
import dns.name
import dns.resolver

from ..errors import InvalidInput, shown
from ..model import MailAddress

SMTP_PORT = 25
# Seconds a whole look-up may take, retries at the resolver included.
_LIFETIME = 10.0


@dataclass(frozen=True)
class Target:
    """One address to try: `host` the name the route gave (for the log), `address` an IP address."""

    host: str
    address: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}[{self.address}]:{self.port}"


class RouteFailure(Exception):
    """No target for a domain: `status` (RFC 3463) says whether it is final (5.x.x) or passing (4.x.x)."""

    def __init__(self, status: str, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text

    @property
    def permanent(self) -> bool:
        return self.status.startswith("5")


def parse_host_port(value: str, default_port: int = SMTP_PORT) -> tuple[str, int]:
    """`host`, `host:port`, `[host]:port` or `[v6 address]:port` as Postfix's transport entries and
    resolver options write them."""
    host, port = value.strip(), str(default_port)
    if host.startswith("["):
        host, _, rest = host[1:].partition("]")
        if rest:
            port = rest.removeprefix(":")
    elif host.count(":") == 1:
        host, port = host.split(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidInput(f"invalid host:port {shown(value)}")
    return host, int(port)


def parse_transport(entries: Mapping[str, str]) -> dict[str, tuple[str, int]]:
    """A transport table, `domain -> host:port`, with its domains checked and lowercased."""
    checked = {MailAddress(f"postmaster@{domain}").domain: target for domain, target in entries.items()}
    return {domain: parse_host_port(target) for domain, target in checked.items()}


class Router:
    """Routes domains through the transport table or the DNS, at the resolver `nameserver`
    (`host:port`; None: the system's); mail exchangers are reached at `mx_port` (Postfix's
    `smtp_tcp_port`: 25, another for tests on loopback)."""

    def __init__(
        self,
        transport: Mapping[str, str] | None = None,
        nameserver: str | None = None,
        mx_port: int = SMTP_PORT,
    ) -> None:
        self.transport = parse_transport(transport or {})
        self.mx_port = parse_host_port(f"mx:{mx_port}")[1]
        if nameserver is None:
            self.resolver = dns.resolver.Resolver()
        else:
            host, port = parse_host_port(nameserver, 53)
            self.resolver = dns.resolver.Resolver(configure=False)
            self.resolver.nameservers = [host]
            self.resolver.port = port
        self.resolver.lifetime = _LIFETIME

    def destination(self, domain: str) -> str:
        """The destination the limits count `domain`'s mail at: the target of its transport entry (as
        Postfix's nexthop), which domains sent to one smart host share, else the domain."""
        if domain in self.transport:
            host, port = self.transport[domain]
            return f"[{host}]:{port}"
        return domain

    def route(self, domain: str) -> list[Target]:
        """The targets for `domain` in the order to try them; raises RouteFailure."""
        if domain in self.transport:
            host, port = self.transport[domain]
            return [Target(host, address, port) for address in self._addresses(host)]
        hosts = self._mx_hosts(domain)
        targets = [Target(host, address, self.mx_port) for host in hosts for address in self._addresses(host)]
        if not targets:
            raise RouteFailure("4.4.3", f"no address for the mail exchangers of {domain}")
        return targets

    def _mx_hosts(self, domain: str) -> list[str]:
        try:
            answer = self.resolver.resolve(domain, "MX")
        except dns.resolver.NoAnswer:
            return [domain]  # RFC 5321 5.1: the domain itself is the implicit MX
        except dns.resolver.NXDOMAIN:
            raise RouteFailure("5.1.2", f"Host or domain name not found: {domain}") from None
        except dns.exception.DNSException as error:
            raise RouteFailure("4.4.3", f"Host or domain name lookup failed for {domain}: {error}") from None
        records = sorted(answer, key=lambda record: record.preference)
        if len(records) == 1 and records[0].exchange == dns.name.root:
            raise RouteFailure("5.1.10", f"Domain {domain} does not accept mail (nullMX)")
        # Preference order; equal preferences in the order the server gave, which it may rotate.
        return [r.exchange.to_text(omit_final_dot=True) for r in records if r.exchange != dns.name.root]

    def _addresses(self, host: str) -> list[str]:
        try:
            return [str(ipaddress.ip_address(host))]
        except ValueError:
            pass
        found: list[str] = []
        for kind in ("A", "AAAA"):
            try:
                found.extend(record.address for record in self.resolver.resolve(host, kind))
            except (dns.resolver.NoAnswer, dns.resolver.NXDOMAIN):
                continue
            except dns.exception.DNSException as error:
                raise RouteFailure("4.4.3", f"Host name lookup failed for {host}: {error}") from None
        return found
