"""The store fails in the middle of a session: the embedded store on a small tmpfs that fills up (in a
mount namespace of its own, `unshare -m`, so nothing outlives the test), and the distributed store's
Cassandra or S3 away (tests/forwarder.py cuts the connections). The client gets 451 4.3.0 and
keeps its mail, nothing half-written is delivered, and once there is room again the same mail is taken."""

from __future__ import annotations

import errno
import hashlib
import os
import smtplib
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from mailq_runtime.worker import run_worker
from tests.forwarder import Forwarder
from tests.runtime.test_outages import wired_url

from .conftest import DOMAIN, QUEUE, USER, make_store, serving
from .helpers import SENDER, SmtpProcess, client, free_port

WORKTREE = Path(__file__).resolve().parents[2]
# Mails of about 200 KB, in lines of 80: more than the room left once the disk is full.
BODY = (b"x" * 78 + b"\r\n") * 2500


def _message(subject: str) -> bytes:
    return f"Subject: {subject}\r\nFrom: {SENDER}\r\n\r\n".encode() + BODY


# What runs in the server's mount namespace (SQLite resolves /proc/PID/root to the path outside it).
SIZE = f"""
import sys
from mailq_runtime import Runtime
with Runtime.open(sys.argv[1]) as runtime:
    print(runtime.queue({QUEUE!r}).size())
"""
DELIVER = f"""
import hashlib
import sys
from mailq_runtime import Runtime
from mailq_runtime.worker import run_worker
with Runtime.open(sys.argv[1]) as runtime:
    delivered = run_worker(runtime, {QUEUE!r}, local_domains=[{DOMAIN!r}], idle_timeout=2).delivered
    mailboxes = runtime.mailboxes
    inbox = mailboxes.get({USER!r}, "INBOX")
    messages = [mailboxes.read(inbox.id, entry.uid) for entry in mailboxes.list_messages(inbox.id)]
    subjects = sorted(m.split(b"Subject: ")[1].split(b"\\r\\n")[0].decode() for m in messages)
    bodies = {{hashlib.sha256(m.split(b"\\r\\n\\r\\n", 1)[1]).hexdigest() for m in messages}}
    print(delivered, subjects, *bodies)
"""


def inside_run(server: SmtpProcess, code: str, disk: Path) -> str:
    ran = subprocess.run(
        [
            "nsenter",
            "--mount",
            f"--target={server.process.pid}",
            sys.executable,
            "-c",
            code,
            f"embedded://{disk}/data",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(WORKTREE)},
    )
    assert ran.returncode == 0, ran.stderr
    return ran.stdout.strip()


def _fill(directory: Path) -> Path:
    filler = directory / "filler"
    with open(filler, "wb") as out:
        try:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
        except OSError as error:
            assert error.errno == errno.ENOSPC
    return filler


def test_a_full_disk_gets_451_nothing_half_written_and_the_retry_after_the_recovery_is_taken(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    port = free_port()
    script = (
        'disk="$1"\n'
        'mount -t tmpfs -o size=3m tmpfs "$disk"\n'
        'mailq() { "$PYTHON" -m mailq_cli --url "embedded://$disk/data" "$@"; }\n'
        "mailq schema create > /dev/null\n"
        f"mailq users add {USER} > /dev/null\n"
        f'exec "$PYTHON" -m mailq_cli --url "embedded://$disk/data" smtp --listen 127.0.0.1:{port} '
        f"--domain {DOMAIN}\n"
    )
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(WORKTREE), "PYTHONUNBUFFERED": "1"}
    server = SmtpProcess(["unshare", "--mount", "sh", "-ec", script, "sh", str(disk)], port, env=env)
    try:
        # The tmpfs as the server's mount namespace sees it.
        inside = Path(f"/proc/{server.process.pid}/root") / disk.relative_to("/")
        with client(port) as smtp:
            assert smtp.sendmail(SENDER, [USER], _message("first")) == {}
            filler = _fill(inside)
            try:
                smtp.sendmail(SENDER, [USER], _message("second"))
                raise AssertionError("a mail was accepted on a full disk")
            except smtplib.SMTPDataError as refused:
                assert (refused.smtp_code, refused.smtp_error) == (
                    451,
                    b"4.3.0 Error: queue file write error",
                )
            filler.unlink()
            # Nothing of the refused mail is in the queue (looked at once there is room to open the store).
            assert inside_run(server, SIZE, disk) == "1"
            # The client tries again, in the same session: the store works again.
            assert smtp.sendmail(SENDER, [USER], _message("second")) == {}
        # The worker delivers the two mails, each whole, and nothing of the refused attempt.
        assert (
            inside_run(server, DELIVER, disk) == f"2 ['first', 'second'] {hashlib.sha256(BODY).hexdigest()}"
        )
    finally:
        status, _ = server.stop()
    log = "".join(server.log)
    assert status == 0, log
    assert "enqueue failed, 451 4.3.0" in log and "Traceback" not in log


def _refusal(smtp: smtplib.SMTP) -> tuple[int, bytes] | None:
    """The mail "second" sent: None once accepted, else the code and text of the reply refusing it."""
    try:
        assert smtp.sendmail(SENDER, [USER], _message("second")) == {}
    except smtplib.SMTPRecipientsRefused as refused:
        smtp.rset()
        return refused.recipients[USER]
    except smtplib.SMTPDataError as refused:
        return refused.smtp_code, refused.smtp_error
    return None


@pytest.mark.parametrize("backend", ["rabbitmq"], indirect=True)
@pytest.mark.parametrize("server", ["cassandra", "s3"])
def test_a_distributed_store_away_gets_451_and_the_retry_after_its_return_is_taken(backend, server):
    """Cassandra or S3 away (its connections cut by a forwarder while the shared server runs on)."""
    s3 = urlsplit(backend.servers.s3_server.endpoint_url)
    targets = {
        "cassandra": (backend.servers.cassandra_server.host, backend.servers.cassandra_server.port),
        "s3": (s3.hostname, s3.port),
        "rabbitmq": (backend.rabbitmq.host, backend.rabbitmq.port),
    }
    cables = {name: Forwarder(host, port) for name, (host, port) in targets.items()}
    try:
        url = wired_url(backend, cables)
        make_store(url)
        with serving(url) as running, client(running.port) as smtp:
            assert smtp.sendmail(SENDER, [USER], _message("first")) == {}
            cables[server].cut()
            # Cassandra away fails the recipient's mailbox look-up already, S3 the enqueue at the end of DATA.
            assert _refusal(smtp) == (451, b"4.3.0 Error: queue file write error")
            cables[server].restore()
            # The client tries again until the driver has reconnected: each refusal a 451, then a 250.
            deadline = time.monotonic() + 60
            while (refusal := _refusal(smtp)) is not None:
                assert refusal[0] == 451 and time.monotonic() < deadline, refusal
                time.sleep(0.5)
    finally:
        for cable in cables.values():
            cable.restore()
            cable.close()
    # Straight from the servers: two mails, each delivered whole, nothing of the refused attempts.
    direct = backend.open()
    assert [item.recipients for item in direct.queue(QUEUE).browse()] == [[USER], [USER]]
    assert run_worker(direct, QUEUE, local_domains=[DOMAIN], idle_timeout=2).delivered == 2
    inbox = direct.mailboxes.get(USER, "INBOX")
    messages = [
        direct.mailboxes.read(inbox.id, entry.uid) for entry in direct.mailboxes.list_messages(inbox.id)
    ]
    assert sorted(m.split(b"Subject: ")[1].split(b"\r\n")[0] for m in messages) == [b"first", b"second"]
    assert all(m.endswith(BODY) for m in messages)
