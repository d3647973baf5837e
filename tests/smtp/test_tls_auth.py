"""STARTTLS with a given certificate, and AUTH PLAIN and LOGIN only over it, letting a client relay from
where the networks would not; the password never reaches a reply or the log."""

from __future__ import annotations

import base64
import logging
import smtplib
import ssl

import pytest

from mailq_runtime.smtp.access import tls_context

from .helpers import MESSAGE, SENDER, Raw, client

LOGIN, PASSWORD = "relay-user", "s3cret-pass:word"


def _trusting() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


@pytest.fixture
def tls_running(serve, certificate):
    with serve(tls=tls_context(*certificate), credentials={LOGIN: PASSWORD.encode()}) as running:
        yield running


def test_auth_is_offered_only_over_tls_and_lets_a_client_relay(tls_running, caplog):
    caplog.set_level(logging.DEBUG)
    with client(tls_running.port, source="127.0.0.2") as smtp:
        assert "starttls" in smtp.esmtp_features and "auth" not in smtp.esmtp_features
        plain = base64.b64encode(f"\0{LOGIN}\0{PASSWORD}".encode()).decode()
        code, reply = smtp.docmd("AUTH", f"PLAIN {plain}")
        assert code == 538 and reply.startswith(b"5.7.11")
        assert smtp.starttls(context=_trusting())[0] == 220
        smtp.ehlo()
        assert set(smtp.esmtp_features["auth"].split()) == {"PLAIN", "LOGIN"}
        # Not yet authenticated: no relay from 127.0.0.2.
        smtp.mail(SENDER)
        assert smtp.rcpt("carol@remote.example")[0] == 554
        smtp.rset()
        with pytest.raises(smtplib.SMTPAuthenticationError) as refused:
            smtp.login(LOGIN, "wrong")
        assert refused.value.smtp_code == 535
        assert smtp.login(LOGIN, PASSWORD)[0] == 235
        assert smtp.sendmail(SENDER, ["carol@remote.example"], MESSAGE) == {}
    [item] = list(tls_running.queue.browse())
    dequeued = tls_running.queue.dequeue(timeout=10)
    assert dequeued is not None and b"with ESMTPSA id" in dequeued.mail.message
    assert item.recipients == ["carol@remote.example"]
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert PASSWORD not in logged and plain not in logged and "wrong" not in logged
    assert "connect from unknown[127.0.0.2]" in logged


def test_auth_login_over_tls(tls_running):
    with client(tls_running.port, source="127.0.0.2") as smtp:
        smtp.starttls(context=_trusting())
        smtp.ehlo()
        smtp.user, smtp.password = LOGIN, PASSWORD
        assert smtp.auth("LOGIN", smtp.auth_login)[0] == 235


def test_without_credentials_auth_is_not_offered_even_over_tls(serve, certificate):
    with serve(tls=tls_context(*certificate)) as running, client(running.port) as smtp:
        smtp.starttls(context=_trusting())
        smtp.ehlo()
        assert "auth" not in smtp.esmtp_features
        assert smtp.sendmail(SENDER, ["alice@example.org"], MESSAGE) == {}


def test_a_failed_tls_handshake_leaves_the_server_serving(tls_running):
    raw = Raw(tls_running.port).greeted()
    assert raw.command(b"STARTTLS\r\n").startswith("220")
    raw.send(b"this is not a TLS client hello\r\n" * 4)
    raw.close()
    with client(tls_running.port) as smtp:
        assert smtp.sendmail(SENDER, ["alice@example.org"], MESSAGE) == {}
