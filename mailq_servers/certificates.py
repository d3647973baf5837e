"""The harness's test CA and the certificates it issues, as PEM files (the `cryptography` package).

A certificate names the addresses and host names its server answers on (IP addresses as IP SANs, names as
DNS SANs), so that clients verify them as they would a real cluster's: a loopback server's names
127.0.0.1, a host of a test bed its own address and name. Each certificate serves both ways (server and
client authentication), as a Cassandra or RabbitMQ node's does towards its peers. Keys are P-256, stored
unencrypted in PKCS#8, owner-readable only: Cassandra's PEM factory, Erlang's ssl and Go's tls all read it.

`HarnessCA(directory)` makes the CA at its first use (10 years) and keeps it; `issue` writes one
certificate and key, valid from an hour ago for a year unless told otherwise (an expired one for the tests
of a certificate past its date)."""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .base import locked

CA_FILE = "ca.pem"
CA_KEY_FILE = "ca-key.pem"
_CA_DAYS = 3650
_DAYS = 365


@dataclass(frozen=True)
class Certificate:
    """A certificate (`cert`, its chain up to the CA excluded) and its private key."""

    cert: Path
    key: Path

    @property
    def keystore(self) -> Path:
        """The key and the certificate in one PEM file: what Cassandra's PEMBasedSslContextFactory reads."""
        return self.cert.with_name(self.cert.name.removesuffix(".pem") + "-keystore.pem")


@dataclass(frozen=True)
class ClientTls:
    """What a client of a TLS server of the harness needs: the CA that signed the server's certificate, and
    a client certificate and key that the CA signed too (paths, as text for the state files)."""

    ca: str
    cert: str
    key: str

    def context(self) -> ssl.SSLContext:
        """A client context verifying the server and its name, presenting the client certificate."""
        context = ssl.create_default_context(cafile=self.ca)
        context.load_cert_chain(self.cert, self.key)
        return context

    def url_options(self) -> dict[str, str]:
        """The mailq URL's options for these files (`tls=on` encrypts the Cassandra link too)."""
        return {"tls": "on", "ca": self.ca, "cert": self.cert, "key": self.key}

    def env(self) -> dict[str, str]:
        return {"MAILQ_TLS_CA": self.ca, "MAILQ_TLS_CERT": self.cert, "MAILQ_TLS_KEY": self.key}


class HarnessCA:
    """A certificate authority of the harness in `directory` (ca.pem, ca-key.pem), made on first use."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.cert = directory / CA_FILE
        self._key_file = directory / CA_KEY_FILE
        with locked(directory / ".lock", f"the CA in {directory}"):
            if not self.cert.exists():
                self._make(directory.name)

    def _make(self, name: str) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        key = ec.generate_private_key(ec.SECP256R1())
        subject = _name(f"mailq harness CA {name}")
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=_CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        _write(self._key_file, _key_pem(key))
        # The certificate last: its presence says the CA is complete.
        _write(self.cert, _cert_pem(cert), mode=0o644)

    def kept(self, name: str, hosts: Sequence[str]) -> Certificate:
        """The certificate `name` in the CA's directory, issued at the first call and kept after."""
        issued = Certificate(self.directory / f"{name}.pem", self.directory / f"{name}-key.pem")
        with locked(self.directory / ".lock", f"the CA in {self.directory}"):
            if not issued.cert.exists():
                self.issue(name, hosts)
        return issued

    def issue(
        self,
        name: str,
        hosts: Sequence[str],
        *,
        directory: Path | None = None,
        valid_from: datetime.datetime | None = None,
        valid_until: datetime.datetime | None = None,
    ) -> Certificate:
        """A certificate for `hosts` (addresses and names; the first is its common name), written as
        `<name>.pem`, `<name>-key.pem` and `<name>-keystore.pem` in `directory` (the CA's by default)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID

        ca_key = serialization.load_pem_private_key(self._key_file.read_bytes(), password=None)
        ca_cert = x509.load_pem_x509_certificate(self.cert.read_bytes())
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        valid_from = valid_from or now - datetime.timedelta(hours=1)
        valid_until = valid_until or now + datetime.timedelta(days=_DAYS)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(hosts[0]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(valid_from)
            .not_valid_after(valid_until)
            .add_extension(x509.SubjectAlternativeName([_san(host) for host in hosts]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()), critical=False
            )
            .sign(ca_key, hashes.SHA256())
        )
        where = directory or self.directory
        where.mkdir(parents=True, exist_ok=True)
        issued = Certificate(where / f"{name}.pem", where / f"{name}-key.pem")
        _write(issued.key, _key_pem(key))
        _write(issued.keystore, _key_pem(key) + _cert_pem(cert))
        _write(issued.cert, _cert_pem(cert), mode=0o644)
        return issued


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _name(common_name: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(host: str):
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _key_pem(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)


def _write(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Written whole under a temporary name, then renamed: a server reading the file never sees half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.chmod(temporary, mode)
    temporary.replace(path)
