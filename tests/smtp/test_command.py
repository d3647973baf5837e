"""The `mailq smtp` and `mailq users` commands: users in and listed, one-line errors for bad options and a
missing store, and SIGTERM: no new connection, the session in DATA finishes with its 250, then the exit."""

from __future__ import annotations

import json
import os
import smtplib
import socket

import pytest

from mailq_runtime import Runtime

from .conftest import DOMAIN, QUEUE, USER, make_store
from .helpers import (
    MESSAGE,
    SENDER,
    Raw,
    SmtpProcess,
    assert_one_line,
    client,
    free_port,
    mailq,
    mailq_command,
)


def test_users_add_creates_an_inbox_and_users_list_shows_it(tmp_path):
    url = f"embedded://{tmp_path / 'data'}"
    assert_one_line(mailq("--url", url, "users", "add", USER), "no mailq data")
    assert mailq("--url", url, "schema", "create")[0] == 0
    assert mailq("--url", url, "users", "add", "Carol@Example.ORG") == (
        0,
        "added carol@example.org (its INBOX)\n",
        "",
    )
    assert_one_line(mailq("--url", url, "users", "add", "carol@example.org"), "already exists")
    assert_one_line(mailq("--url", url, "users", "add", "not an address"), "invalid mail address")
    status, out, _ = mailq("--url", url, "--json", "users", "list")
    assert (status, json.loads(out)) == (0, ["carol@example.org"])


def test_bad_options_and_a_missing_store_are_one_line(tmp_path, certificate):
    cert, key = certificate
    url = f"embedded://{tmp_path / 'data'}"
    smtp = ("--url", url, "smtp", "--domain", DOMAIN)
    assert_one_line(mailq(*smtp, "--listen", "nowhere"), "invalid listen address")
    assert_one_line(mailq(*smtp, "--domain", "bad domain"), "invalid mail address")
    assert_one_line(mailq(*smtp, "--networks", "10.0.0.0/40"), "invalid network")
    assert_one_line(mailq(*smtp, "--tls-cert", str(cert)), "--tls-cert and --tls-key go together")
    assert_one_line(mailq(*smtp, "--tls-cert", str(key), "--tls-key", str(key)), "cannot load the TLS")
    auth = tmp_path / "auth"
    auth.write_text("relay:secret-password\n")
    assert_one_line(mailq(*smtp, "--auth-file", str(auth)), "AUTH is only offered over TLS")
    auth.write_text("no-colon-secret-password\n")
    result = mailq(*smtp, "--auth-file", str(auth), "--tls-cert", str(cert), "--tls-key", str(key))
    assert_one_line(result, "line 1: expected user:password")
    assert "secret-password" not in result[2]
    assert_one_line(mailq(*smtp, "--max-sessions", "0"), "invalid max_sessions")
    assert_one_line(mailq(*smtp, "--listen", f"127.0.0.1:{free_port()}"), "no mailq data")
    assert not (tmp_path / "data").exists()
    make_store(url)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert_one_line(mailq(*smtp, "--listen", f"127.0.0.1:{port}"), f"cannot listen on 127.0.0.1:{port}")


def test_sigterm_stops_accepting_lets_the_session_in_data_finish_and_exits(embedded_url):
    url = embedded_url
    port = free_port()
    command = mailq_command(url, "--json", "smtp", "--listen", f"127.0.0.1:{port}", "--domain", DOMAIN)
    server = SmtpProcess(command, port, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    idle = Raw(port).greeted()
    sending = Raw(port).greeted()
    sending.command(b"MAIL FROM:<bob@elsewhere.example>\r\n")
    sending.command(b"RCPT TO:<alice@example.org>\r\n")
    assert sending.command(b"DATA\r\n").startswith("354")
    sending.send(b"Subject: in flight\r\n\r\nthe first half\r\n")
    server.process.send_signal(15)
    # The idle session is told and closed; the listener is gone.
    assert idle.reply().startswith("421 4.3.2 ")
    with pytest.raises(ConnectionRefusedError):
        smtplib.SMTP("127.0.0.1", port, timeout=5)
    sending.send(b"the second half\r\n.\r\n")
    assert sending.reply().startswith("250 2.0.0 Ok: queued as ")
    assert sending.reply().startswith("421 4.3.2 ")
    status, out = server.stop()
    assert status == 0, "".join(server.log)
    assert json.loads(out) == {"queue": QUEUE, "sessions": 2, "accepted": 1}
    log = "".join(server.log)
    assert "connect from unknown[127.0.0.1]" in log and "Traceback" not in log
    with Runtime.open(url) as runtime:
        [item] = list(runtime.queue(QUEUE).browse())
        assert item.recipients == [USER]


def test_the_log_follows_each_session_as_postfix_does(embedded_url):
    url = embedded_url
    port = free_port()
    server = SmtpProcess(
        mailq_command(url, "smtp", "--listen", f"127.0.0.1:{port}", "--domain", DOMAIN), port
    )
    with client(port) as smtp:
        smtp.sendmail(SENDER, [USER], MESSAGE)
        smtp.mail(SENDER)
        smtp.rcpt(f"nobody@{DOMAIN}")
    status, out = server.stop()
    assert (status, out) == (0, "smtp stopped: 1 sessions, 1 mails accepted into spool\n")
    log = "".join(server.log)
    with Runtime.open(url) as runtime:
        [item] = list(runtime.queue(QUEUE).browse())
    assert "mailq/smtpd[" in log
    assert f"{item.enqueue_id}: client=unknown[127.0.0.1], name={item.name}, from=<{SENDER}>, size=" in log
    assert "nrcpt=1 (queue spool)" in log
    assert "NOQUEUE: reject: unknown[127.0.0.1]: 550 5.1.1 <nobody@example.org>" in log
    assert "disconnect from unknown[127.0.0.1] mails=1" in log


def test_two_processes_with_reuse_port_share_the_port_and_both_accept(embedded_url):
    url = embedded_url
    port = free_port()
    command = mailq_command(url, "smtp", "--listen", f"127.0.0.1:{port}", "--domain", DOMAIN, "--reuse-port")
    servers = [SmtpProcess(command, port) for _ in range(2)]
    # The kernel spreads the connections: 30 leave one process without any once in 2**29 runs.
    for _ in range(30):
        with client(port) as smtp:
            smtp.sendmail(SENDER, [USER], MESSAGE)
    accepted = []
    for server in servers:
        status, out = server.stop()
        assert status == 0, "".join(server.log)
        accepted.append(int(out.split(", ")[1].split()[0]))
    assert sum(accepted) == 30 and min(accepted) > 0, accepted
    with Runtime.open(url) as runtime:
        assert runtime.queue(QUEUE).size() == 30
