"""A DNS server for remote delivery's tests: Debian's dnsmasq on a loopback port, answering only from
the zone it is given (MX, A and null MX records of test domains), never from upstream or /etc/hosts.

Started per test by the fixtures that need it (tests/relay/conftest.py), not by `python -m mailq_servers
up`: its records are the test's."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import dns.exception
import dns.resolver

from .base import HOST, ServerError, log_tail, wait_for
from .system_packages import system_program


@dataclass(frozen=True)
class Zone:
    """The records to serve: `mx` domain -> (preference, host) pairs; `addresses` host -> IPv4 address;
    `null_mx` the domains that take no mail (RFC 7505). Names under `local` that are not listed do not
    exist (NXDOMAIN)."""

    mx: Mapping[str, Sequence[tuple[int, str]]] = field(default_factory=dict)
    addresses: Mapping[str, str] = field(default_factory=dict)
    null_mx: Sequence[str] = ()
    local: str = "test"

    def config(self, port: int, log: Path) -> str:
        lines = [
            f"port={port}",
            f"listen-address={HOST}",
            "bind-interfaces",
            "no-resolv",
            "no-hosts",
            "no-negcache",
            f"local=/{self.local}/",
            "log-queries",
            f"log-facility={log}",
        ]
        lines += [f"mx-host={d},{host},{pref}" for d, records in self.mx.items() for pref, host in records]
        lines += [f"host-record={host},{address}" for host, address in self.addresses.items()]
        # An MX record of preference 0 and the root as exchange: 0x0000, then the root's empty label.
        lines += [f"dns-rr={domain},15,000000" for domain in self.null_mx]
        return "\n".join(lines) + "\n"


class DnsServer:
    """dnsmasq serving `zone` on 127.0.0.1:`port`, its files in `directory`; a context manager."""

    def __init__(self, directory: Path, port: int, zone: Zone) -> None:
        self.directory = directory
        self.port = port
        self.zone = zone
        self.log = directory / "dnsmasq.log"
        self._process: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def __enter__(self) -> DnsServer:
        program = system_program("dnsmasq")
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "dnsmasq.conf"
        config.write_text(self.zone.config(self.port, self.log))
        argv = [program, "--keep-in-foreground", f"--conf-file={config}", "--pid-file=", "--user=root"]
        self._process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        process = self._process
        wait_for("dnsmasq", self._answers, alive=lambda: process.poll() is None, logs=[self.log], timeout=20)
        return self

    def __exit__(self, *exception: object) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(10)
            self._process = None

    def _answers(self) -> bool:
        resolver = dns.resolver.Resolver(configure=False)
        resolver.nameservers, resolver.port, resolver.lifetime = [HOST], self.port, 1.0
        try:
            resolver.resolve(f"ready-probe.{self.zone.local}", "A")
        except dns.resolver.NXDOMAIN:
            return True  # an answer, from the zone
        except dns.exception.DNSException:
            return False
        raise ServerError(f"dnsmasq answered for a name it does not serve; {log_tail(self.log)}")
