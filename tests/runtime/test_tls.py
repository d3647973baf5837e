"""The TLS files' client context and the one line a failed handshake becomes, on the errors each driver
raises (the ssl module's, wrapped by cassandra-driver, botocore or pika; the real handshakes are in
tests/tls)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from cassandra.cluster import NoHostAvailable

from mailq_runtime.errors import InvalidInput
from mailq_runtime.tls import TlsFiles, certificate_refused, tls_failure
from mailq_servers.certificates import HarnessCA


def verification(message: str, code: int) -> ssl.SSLCertVerificationError:
    error = ssl.SSLCertVerificationError(
        1, f"[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: {message}"
    )
    error.verify_message, error.verify_code = message, code
    return error


def test_a_context_verifies_the_server_and_its_name_and_presents_the_client_certificate(tmp_path: Path):
    ca = HarnessCA(tmp_path / "ca")
    client = ca.issue("client", ["mailq-client"])
    context = TlsFiles(ca.cert, client.cert, client.key).context()
    assert context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    assert [cert["subject"] for cert in context.get_ca_certs()] == [
        ((("commonName", "mailq harness CA ca"),),)
    ]


@pytest.mark.parametrize(
    ("files", "words"),
    [
        (
            lambda d, ca, c: TlsFiles(d / "missing.pem"),
            ("cannot use the CA file ca=", "No such file"),
        ),
        (lambda d, ca, c: TlsFiles(c.key), ("cannot use the CA file ca=",)),
        (lambda d, ca, c: TlsFiles(ca.cert, c.cert, ca.cert), ("cannot use the client certificate cert=",)),
    ],
)
def test_a_file_that_cannot_serve_is_invalid_input_naming_it(tmp_path: Path, files, words):
    ca = HarnessCA(tmp_path / "ca")
    client = ca.issue("client", ["mailq-client"])
    with pytest.raises(InvalidInput) as refused:
        files(tmp_path, ca, client).context()
    message = str(refused.value)
    assert all(word in message for word in words) and "\n" not in message, message


@pytest.mark.parametrize(
    ("error", "words", "lasting"),
    [
        (verification("unable to get local issuer certificate", 20), ("not signed by the CA given",), True),
        (verification("certificate has expired", 10), ("past its date",), True),
        (
            verification("IP address mismatch, certificate is not valid for '127.0.0.2'", 64),
            ("does not name the host", "127.0.0.2"),
            True,
        ),
        # cassandra-driver: each host's error in NoHostAvailable, the verification as a plain SSLError.
        (
            NoHostAvailable(
                "Unable to connect",
                {
                    "10.0.0.1:9042": ssl.SSLError(
                        1,
                        "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: "
                        "certificate has expired (_ssl.c:1006)",
                    )
                },
            ),
            ("past its date",),
            True,
        ),
        (
            NoHostAvailable(
                "Unable to connect",
                {"10.0.0.1:9042": ssl.SSLEOFError(8, "EOF occurred in violation of protocol")},
            ),
            ("closed the connection during the handshake", "client certificate"),
            False,
        ),
        # pika: a handshake the server ended, as text only.
        (
            Exception(
                'StreamLostError: ("Stream connection lost: SSLError(1, '
                "'[SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca (_ssl.c:2580)')\",)"
            ),
            ("refused the handshake", "unknown ca", "cert="),
            True,
        ),
        (
            ssl.SSLError(1, "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required"),
            ("requires a client certificate",),
            True,
        ),
        (
            ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number"),
            ("does the server speak TLS",),
            False,
        ),
        # botocore: urllib3's own check of an address, as text.
        (
            Exception(
                "SSL validation failed for https://127.0.0.2:9000/b "
                "hostname '127.0.0.2' doesn't match '127.0.0.1'"
            ),
            ("does not name the host", "'127.0.0.2'"),
            False,
        ),
    ],
)
def test_a_failed_handshake_is_one_line_with_its_reason(error, words, lasting):
    line = tls_failure(error)
    assert line is not None and line.startswith("TLS: ") and "\n" not in line
    assert all(word in line for word in words), line
    assert certificate_refused(error) is lasting


def test_an_error_without_tls_in_it_is_none():
    assert tls_failure(ConnectionRefusedError(111, "Connection refused")) is None
    assert not certificate_refused(NoHostAvailable("Unable to connect", {"h": OSError("timed out")}))
