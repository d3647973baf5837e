"""The SMTP client's sessions against smtp-sink: commands pipelined when the server offers PIPELINING
(RFC 2920) and one at a time when it does not, the content dot-stuffed, a session carrying the next
mail, and a kept session that the server closed while it was idle replaced by a new one."""

from __future__ import annotations

import pytest

from mailq_runtime.relay.client import send
from mailq_runtime.relay.connections import Connections
from mailq_runtime.relay.limits import Destination, Limit
from mailq_runtime.relay.routes import Target
from mailq_servers.counting_sink import counting_sink
from mailq_servers.smtp_sink import SmtpSink

from .conftest import HOSTNAME, SENDER

# No limits: the sessions alone are under test.
DESTINATION = Destination("one.test", Limit(), None)
MESSAGE = b"Subject: dots\r\n\r\nfirst\r\n.leading dot\r\n..two\r\nlast"


@pytest.mark.parametrize("pipelining", [True, False])
def test_mails_share_a_session_with_or_without_pipelining(mx_port, pipelining):
    target, connections = Target("mx.one.test", "127.0.0.1", mx_port), Connections()
    with SmtpSink(mx_port, pipelining=pipelining) as sink:
        for recipients in (["bob@one.test", "carol@one.test"], ["dave@one.test"]):
            replies = send([target], DESTINATION, SENDER, recipients, MESSAGE, HOSTNAME, connections)
            assert {r: reply.code for r, reply in replies.items()} == dict.fromkeys(recipients, 250)
        kept = connections.take(DESTINATION.name, target)
        connections.close()
        dumped = sink.dumped()
        contents = [path.read_bytes() for path in (sink.directory / "dump").iterdir()]
    assert kept is not None  # the second mail went through the first one's session, kept after it
    assert sorted(d.recipients for d in dumped) == [
        ("<bob@one.test>", "<carol@one.test>"),
        ("<dave@one.test>",),
    ]
    assert {d.sender for d in dumped} == {f"<{SENDER}>"}
    # The sink writes what it took with its dots unstuffed, in lines of its own: the content arrived whole.
    for content in contents:
        assert content.endswith(b"Subject: dots\n\nfirst\n.leading dot\n..two\nlast\n\n")


def test_a_kept_session_the_server_closed_passes_the_mail_to_a_new_one(mx_port):
    target, connections = Target("mx.one.test", "127.0.0.1", mx_port), Connections()
    with SmtpSink(mx_port):
        send([target], DESTINATION, SENDER, ["bob@one.test"], MESSAGE, HOSTNAME, connections)
    # The server went away with the session kept; another listens on the port.
    with SmtpSink(mx_port) as sink:
        replies = send([target], DESTINATION, SENDER, ["carol@one.test"], MESSAGE, HOSTNAME, connections)
        connections.close()
        dumped = sink.dumped()
    assert replies["carol@one.test"].code == 250
    assert [d.recipients for d in dumped] == [("<carol@one.test>",)]


UTF8_MESSAGE = "Subject: café\r\n\r\nDéjà vu.\r\n".encode()


def test_utf8_addresses_go_with_smtputf8_and_8bit_content_with_body_8bitmime(mx_port):
    target, connections = Target("mx.one.test", "127.0.0.1", mx_port), Connections()
    with counting_sink(mx_port, smtputf8=True) as sink:
        replies = send([target], DESTINATION, SENDER, ["josé@one.test"], UTF8_MESSAGE, HOSTNAME, connections)
        connections.close()
    assert replies["josé@one.test"].code == 250
    assert sink.recipients == ["josé@one.test"]
    assert {"SMTPUTF8", "BODY=8BITMIME"} <= set(sink.mail_options[0])


def test_utf8_addresses_bounce_at_a_server_without_smtputf8_and_it_receives_nothing(mx_port):
    target, connections = Target("mx.one.test", "127.0.0.1", mx_port), Connections()
    with SmtpSink(mx_port) as sink:  # smtp-sink announces 8BITMIME, not SMTPUTF8
        replies = send([target], DESTINATION, SENDER, ["josé@one.test"], UTF8_MESSAGE, HOSTNAME, connections)
        # The session stays usable: the next mail, in ASCII, goes through it.
        ascii_replies = send([target], DESTINATION, SENDER, ["bob@one.test"], MESSAGE, HOSTNAME, connections)
        connections.close()
        dumped = sink.dumped()
    refused = replies["josé@one.test"]
    assert (refused.code, refused.status, refused.permanent) == (553, "5.6.7", True)
    assert "SMTPUTF8 is required" in refused.text
    assert ascii_replies["bob@one.test"].code == 250
    assert [d.recipients for d in dumped] == [("<bob@one.test>",)]
