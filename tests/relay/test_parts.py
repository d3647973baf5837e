"""The parts of remote delivery that need no server: the schedule, the parsing of routes and replies,
the content as DATA sends it, and `mailq worker --relay`'s refusal of bad options in one line, before
any store is opened."""

from __future__ import annotations

import pytest

from mailq_runtime.errors import InvalidInput
from mailq_runtime.relay import RetrySchedule
from mailq_runtime.relay.client import Reply, _dot_stuffed
from mailq_runtime.relay.routes import parse_host_port, parse_transport
from tests.smtp.helpers import assert_one_line, mailq

SECOND = 1_000_000


def test_the_default_schedule_is_postfix_s_and_doubles_with_the_mail_s_age():
    schedule = RetrySchedule.of()
    ages = [0, 300, 600, 1200, 2400, 4800, 9600]
    assert [schedule.delay(age * SECOND) // SECOND for age in ages] == [300, 300, 600, 1200, 2400, 4000, 4000]
    assert not schedule.expired(5 * 86400 * SECOND - 1) and schedule.expired(5 * 86400 * SECOND)


@pytest.mark.parametrize(
    ("message", "sent"),
    [
        (b"", b".\r\n"),
        (b".", b"..\r\n.\r\n"),
        (b".first\r\nsecond\r\n", b"..first\r\nsecond\r\n.\r\n"),
        (b"a\r\n.\r\n..b\r\nc.d\r\n", b"a\r\n..\r\n...b\r\nc.d\r\n.\r\n"),
        (b"no final line end", b"no final line end\r\n.\r\n"),
    ],
)
def test_data_doubles_every_leading_dot_and_ends_with_a_dot_line(message, sent):
    # RFC 5321 4.5.2: a line that starts with a dot gets one more, the content ends with CRLF.CRLF.
    assert _dot_stuffed(message) == sent


@pytest.mark.parametrize(("first", "longest"), [("0s", "1s"), ("2s", "1s"), ("-1s", "1s")])
def test_a_schedule_needs_a_first_delay_no_longer_than_the_longest(first, longest):
    with pytest.raises(InvalidInput):
        RetrySchedule.of(first, longest)


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("mx.example.net", ("mx.example.net", 25)),
        ("mx.example.net:2525", ("mx.example.net", 2525)),
        ("[10.0.0.5]:2525", ("10.0.0.5", 2525)),
        ("[::1]:2525", ("::1", 2525)),
        ("[::1]", ("::1", 25)),
    ],
)
def test_host_and_port_as_postfix_writes_them(text, parsed):
    assert parse_host_port(text) == parsed


@pytest.mark.parametrize("text", ["", ":25", "host:0", "host:65536", "host:x", "[::1]:"])
def test_a_bad_host_or_port_is_refused(text):
    with pytest.raises(InvalidInput):
        parse_host_port(text)


def test_transport_domains_are_checked_and_lowercased():
    assert parse_transport({"Example.NET": "smart:2525"}) == {"example.net": ("smart", 2525)}
    with pytest.raises(InvalidInput):
        parse_transport({"not a domain": "smart:2525"})


@pytest.mark.parametrize(
    ("code", "text", "status"),
    [
        (250, "2.0.0 Ok: queued as X", "2.0.0"),
        (550, "5.1.1 <x@y>: unknown", "5.1.1"),
        (550, "no such user", "5.0.0"),  # no enhanced code: the class alone
        (450, "5.1.1 a code of the wrong class", "4.0.0"),
        (421, "4.7.0 too busy", "4.7.0"),
    ],
)
def test_a_reply_s_status_is_its_enhanced_code_or_its_class(code, text, status):
    reply = Reply.of(code, text.encode(), "mx[127.0.0.1]:25")
    assert (reply.status, reply.text) == (status, f"{code} {text}")


@pytest.mark.parametrize(
    ("option", "words"),
    [
        (["--transport", "example.net"], ["DOMAIN=HOST:PORT"]),
        (["--transport", "example.net=host:99999"], ["host:port"]),
        (["--resolver", "127.0.0.1:x"], ["host:port"]),
        (["--retry-first", "2h", "--retry-longest", "1h"], ["first <= longest"]),
        (["--max-age", "soon"], ["max_age"]),
    ],
)
def test_bad_relay_options_are_one_line_and_open_nothing(tmp_path, option, words):
    url = f"embedded://{tmp_path / 'none'}"
    result = mailq("--url", url, "worker", "--domain", "example.org", "--relay", *option)
    assert_one_line(result, *words)
    assert not (tmp_path / "none").exists()
