"""Mail across the hosts of the bed: `mailq smtp` on the smtp host takes mail from this machine, a `mailq
worker` on worker1 delivers it, the local recipients' into their INBOXes and the others' by SMTP to a sink
on the sink host; every byte between them crosses the bed's bridge to the clusters of the server hosts."""

from __future__ import annotations

import smtplib
import subprocess
import time
from collections.abc import Callable
from email import message_from_bytes

from mailq_runtime import Runtime
from mailq_runtime.mailbox import INBOX
from mailq_runtime.settings import Settings
from mailq_servers.host_bed import HostBed, running_facts
from mailq_servers.smtp_sink import SmtpSink
from tests.smtp.helpers import SmtpProcess

from .conftest import mailq_on, run_on

LOCAL = "example.org"
USER = f"alice@{LOCAL}"
REMOTE = "bob@elsewhere.example"
SMTP_PORT = 2525
SINK_PORT = 2526
MAILS = 10


def wait_until(condition: Callable[[], object], timeout: float, state: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out: {state()}"
        time.sleep(0.5)


def clients_of_the_servers(bed: HostBed, url: str) -> tuple[set[str], set[str]]:
    """The addresses connected to a Cassandra node of the bed (a client's driver connects to each), and
    to its RabbitMQ nodes in `url`'s vhost."""
    cluster = running_facts().cassandra_cluster.cluster()
    try:
        rows = cluster.connect().execute("SELECT address FROM system_views.clients", timeout=60)
        cassandra = {str(row.address) for row in rows}
    finally:
        cluster.shutdown()
    vhost = Settings.from_url(url).amqp.vhost
    listed = bed.rabbitmq.ctl("list_connections", "vhost", "peer_host", "--no-table-headers")
    rows = [line.split("\t") for line in listed.splitlines() if "\t" in line]
    rabbitmq = {peer for connected_vhost, peer in rows if connected_vhost == vhost}
    return cassandra, rabbitmq


def test_smtp_on_one_host_and_a_worker_on_another_deliver_to_inboxes_and_a_sink_on_a_third(
    host_bed: HostBed, bed_url: str, bed_env: dict[str, str], bed_client: None, tmp_path
):
    smtp_host, worker_host, sink_host = (host_bed.host(name) for name in ("smtp", "worker1", "sink"))
    run_on(host_bed, "smtp", bed_url, bed_env, "schema", "create")
    run_on(host_bed, "smtp", bed_url, bed_env, "users", "add", USER)
    listen = f"{smtp_host.address}:{SMTP_PORT}"
    server = SmtpProcess(
        mailq_on(
            host_bed,
            "smtp",
            bed_url,
            "smtp",
            "--listen",
            listen,
            "--domain",
            LOCAL,
            "--networks",
            "10.213.0.0/24",
        ),
        SMTP_PORT,
        env=bed_env,
    )
    try:
        with smtplib.SMTP(
            smtp_host.address, SMTP_PORT, local_hostname="client.example", timeout=60
        ) as client:
            for n in range(MAILS):
                message = f"Subject: across hosts {n}\r\nFrom: carol@example.org\r\n\r\nmail {n}\r\n"
                client.sendmail("carol@example.org", [USER, REMOTE], message.encode())
    finally:
        status, _ = server.stop()
    log = "".join(server.log)
    assert status == 0, log
    # The client is this machine, on the bridge: the smtp host saw it come from the bed's network.
    assert "connect from unknown[10.213.0.1]" in log, log
    with SmtpSink(SINK_PORT, place=sink_host.place()) as sink:
        log_file = tmp_path / "worker.log"
        with log_file.open("w") as out:
            worker = subprocess.Popen(
                mailq_on(
                    host_bed,
                    "worker1",
                    bed_url,
                    "worker",
                    "--domain",
                    LOCAL,
                    "--relay",
                    "--transport",
                    f"elsewhere.example={sink_host.address}:{SINK_PORT}",
                    "--hostname",
                    "worker1.mailq-bed",
                ),
                env=bed_env,
                stdout=out,
                stderr=out,
            )
        try:
            assert worker.pid in worker_host.pids()
            with Runtime.open(bed_url) as runtime:
                inbox = runtime.mailboxes.get(USER, INBOX)
                wait_until(
                    lambda: len(sink.dumped()) == MAILS
                    and len(runtime.mailboxes.list_messages(inbox)) == MAILS,
                    timeout=120,
                    state=lambda: f"{len(sink.dumped())} relayed, in the INBOX "
                    f"{len(runtime.mailboxes.list_messages(inbox))}",
                )
                subjects = sorted(
                    message_from_bytes(runtime.mailboxes.read(inbox, entry.uid))["Subject"]
                    for entry in runtime.mailboxes.list_messages(inbox)
                )
                assert subjects == sorted(f"across hosts {n}" for n in range(MAILS))
                assert {dumped.recipients for dumped in sink.dumped()} == {(f"<{REMOTE}>",)}
                cassandra_clients, rabbitmq_clients = clients_of_the_servers(host_bed, bed_url)
                assert worker_host.address in cassandra_clients and worker_host.address in rabbitmq_clients
        finally:
            worker.terminate()
            worker.wait(60)
    out = log_file.read_text()
    assert worker.returncode == 0, out
    assert "Traceback" not in out
