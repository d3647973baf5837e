"""Each backend's outage at each public call of the queue and of the mailboxes: the call raises mailq's
error for that backend, chained to the driver's (never the driver's own), and changes nothing; or, where
the call does not need that backend, it works on. And one command of the CLI per backend: one line.

The outages are real: the runtime under test reaches Cassandra, S3 and RabbitMQ through a loopback
forwarder each (tests/forwarder.py), and a test pulls one cable (every connection reset, every new one
reset at once) while the shared servers run on for everyone else. The state is read before and after
straight from the servers (the backend's probes), not through the runtime that saw the outage.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, replace
from urllib.parse import quote, urlsplit

import pytest

from mailq_cli.main import main
from mailq_runtime import Runtime
from mailq_runtime.errors import (
    BlobStoreUnavailable,
    BrokerUnavailable,
    StoreUnavailable,
)
from mailq_runtime.mailboxes import Mailboxes
from mailq_runtime.queue import MailQueue, MailQueueItem
from mailq_runtime.queue.publisher_lease import LEASE_DESTINATION
from mailq_servers.urls import distributed_url
from tests.forwarder import Forwarder

from .backends import RabbitMQBackend
from .conftest import QUEUE
from .helpers import make_mail

DEPLOYMENTS = ("rabbitmq",)
# The driver's package whose exception each outage's error is chained to.
DRIVERS = {"cassandra": "cassandra", "s3": "botocore", "rabbitmq": "pika"}
ERRORS = {"cassandra": StoreUnavailable, "s3": BlobStoreUnavailable, "rabbitmq": BrokerUnavailable}
# A publish RabbitMQ does not confirm waits this long (30 s by default) before the queue holds the mail
# as a delayed one: the outage's tests do not wait the default.
PUBLISH_TIMEOUT = 2.0


@dataclass
class Wired:
    """A runtime reaching each server through a forwarder of its own."""

    url: str
    runtime: Runtime
    cables: dict[str, Forwarder]

    @property
    def queue(self) -> MailQueue:
        return self.runtime.queue(QUEUE)


def wired_url(backend: RabbitMQBackend, cables: dict[str, Forwarder]) -> str:
    servers = backend.servers
    return distributed_url(
        replace(servers.cassandra_server, port=cables["cassandra"].port),
        replace(servers.s3_server, endpoint_url=f"http://127.0.0.1:{cables['s3'].port}"),
        backend.keyspace,
        backend.bucket,
        broker=f"amqp://127.0.0.1:{cables['rabbitmq'].port}/{quote(backend.vhost, safe='')}",
        s3_prefix=backend.prefix,
    )


@pytest.fixture
def wired(backend: RabbitMQBackend) -> Iterator[Wired]:
    s3 = urlsplit(backend.servers.s3_server.endpoint_url)
    targets = {
        "cassandra": (backend.servers.cassandra_server.host, backend.servers.cassandra_server.port),
        "s3": (s3.hostname, s3.port),
        "rabbitmq": (backend.rabbitmq.host, backend.rabbitmq.port),
    }
    cables = {name: Forwarder(host, port) for name, (host, port) in targets.items()}
    runtime = None
    try:
        url = wired_url(backend, cables)
        runtime = Runtime.open(url, create=True)
        runtime.broker.publish_timeout = PUBLISH_TIMEOUT
        yield Wired(url, runtime, cables)
    finally:
        for cable in cables.values():
            cable.restore()
        if runtime is not None:
            runtime.close()
        for cable in cables.values():
            cable.close()


def snapshot(backend: RabbitMQBackend, holder: Runtime | None = None) -> dict[str, list[tuple]]:
    """Every table of every server, as the servers hold them; a message counts as the broker's whether
    RabbitMQ's queue holds it ready or `holder`, the runtime under test, holds it unsettled. The leases
    of the looks for delayed mails (publisher_lease.py) are a process's, handed over as its runtime
    closes, and no part of what an outage may change."""
    state = backend.state()
    state["destination_slots"] = [row for row in state["destination_slots"] if not is_a_lease(row)]
    held = [] if holder is None else [(QUEUE,) for _ in holder.broker.held(QUEUE)]
    state["broker_messages"] = sorted([(queue,) for queue, *_ in state["broker_messages"]] + held)
    return state


def is_a_lease(slot: tuple) -> bool:
    return slot[0] == LEASE_DESTINATION.format(QUEUE)


def before_the_outage(backend: RabbitMQBackend, holder: Runtime) -> dict[str, list[tuple]]:
    """The state once the queue's one broker message is in view: a consumer idle for a second gives back
    what it holds as copies, which are neither ready nor held while RabbitMQ confirms them."""
    deadline = time.monotonic() + 10
    while True:
        state = snapshot(backend, holder)
        if len(state["broker_messages"]) == 1 or time.monotonic() >= deadline:
            return state
        time.sleep(0.1)


def settled(backend: RabbitMQBackend, expected: dict[str, list[tuple]], seconds: float = 10.0) -> dict:
    """The state once equal to `expected`, or as it is after `seconds`: the messages a closed runtime held
    go back to RabbitMQ's queue a moment after its connection closes."""
    deadline = time.monotonic() + seconds
    while True:
        state = snapshot(backend)
        if state == expected or time.monotonic() >= deadline:
            return state
        time.sleep(0.2)


@dataclass
class Prepared:
    """What a queue holds before the outage: a dead letter, a mail delayed by an hour, and a mail this
    runtime dequeued (`item`) or left ready."""

    item: MailQueueItem | None
    dead: str


def prepare(wired: Wired, dequeued: bool) -> Prepared:
    queue = wired.queue
    dead = queue.enqueue(make_mail("dead"))
    taken = queue.dequeue(timeout=10)
    assert taken is not None and taken.enqueue_id == dead
    taken.reject("undeliverable")
    queue.enqueue(make_mail("later"), delay="1h")
    ready = queue.enqueue(make_mail("ready"))
    item = None
    if dequeued:
        item = queue.dequeue(timeout=10)
        assert item is not None and item.enqueue_id == ready
    return Prepared(item, dead)


# Each public call of the queue (and the runtime's list of queues), made on the prepared queue.
CALLS: dict[str, Callable[[MailQueue, Prepared], object]] = {
    # Content of its own: content already stored is not written again.
    "enqueue": lambda queue, prepared: queue.enqueue(make_mail("new", body=b"New content.\r\n")),
    "dequeue": lambda queue, prepared: queue.dequeue(timeout=2),
    "done": lambda queue, prepared: prepared.item.done(),
    "retry later": lambda queue, prepared: prepared.item.retry(delay="1h"),
    "retry now": lambda queue, prepared: prepared.item.retry(),
    "reject": lambda queue, prepared: prepared.item.reject("no such user"),
    "size": lambda queue, prepared: queue.size(),
    "overview": lambda queue, prepared: queue.overviews.overview(),
    "browse": lambda queue, prepared: list(queue.browse()),
    "browse a mail": lambda queue, prepared: [item.mail for item in queue.browse()],
    "remove": lambda queue, prepared: queue.remove(name="ready"),
    "clear": lambda queue, prepared: queue.clear(),
    "flush": lambda queue, prepared: queue.flush(),
    "republish": lambda queue, prepared: queue.republish("0s"),
    "dead letters": lambda queue, prepared: queue.dead_letters.list(),
    "a dead letter's mail": lambda queue, prepared: queue.dead_letters.get(prepared.dead).mail,
    "requeue dead letters": lambda queue, prepared: queue.dead_letters.requeue(every=True),
    "purge dead letters": lambda queue, prepared: queue.dead_letters.purge(older_than="0s"),
}
ITEM_CALLS = ("done", "retry later", "retry now", "reject")

# The calls that need each backend: they raise its error and change nothing. The others must work on
# through its outage.
NEEDS = {
    "cassandra": set(CALLS) - {"retry now"},
    "s3": {"enqueue", "dequeue", "browse a mail", "a dead letter's mail", "requeue dead letters"},
    "rabbitmq": {"flush", "republish"},
}


def chained_to_driver(error: BaseException, outage: str) -> bool:
    cause = error.__cause__
    return cause is not None and type(cause).__module__.split(".")[0] == DRIVERS[outage]


def lost_by_the_broker(runtime: Runtime, seconds: float = 5.0) -> None:
    """Wait until the runtime's broker saw its connection go: a delivery it held is then no longer its."""
    deadline = time.monotonic() + seconds
    while runtime.broker.held(QUEUE) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not runtime.broker.held(QUEUE)


@pytest.mark.parametrize(
    ("outage", "call"),
    [
        (outage, call)
        for outage in ERRORS
        for call in sorted(CALLS)
        # The next test's: a lost connection to RabbitMQ loses the lease of what it delivered.
        if not (outage == "rabbitmq" and call in ITEM_CALLS)
    ],
)
def test_an_outage_raises_the_backends_error_and_changes_nothing(backend, wired, outage, call):
    prepared = prepare(wired, dequeued=call in ITEM_CALLS)
    queue = wired.queue
    if call not in NEEDS[outage]:
        with wired.cables[outage].cable_pulled():
            CALLS[call](queue, prepared)
        return
    before = before_the_outage(backend, wired.runtime)
    wired.cables[outage].cut()
    with pytest.raises(ERRORS[outage]) as raised:
        CALLS[call](queue, prepared)
    assert chained_to_driver(raised.value, outage), repr(raised.value.__cause__)
    assert "\n" not in str(raised.value)
    wired.cables[outage].restore()
    # What the runtime held (a delivery it took) goes back with it, as after a crash.
    wired.runtime.close()
    assert settled(backend, before) == before


@pytest.mark.parametrize("call", ITEM_CALLS)
def test_settling_a_mail_whose_broker_connection_was_lost(backend, wired, call):
    """The connection that delivered the mail is gone, and RabbitMQ gives the mail again to whoever
    consumes: no lease expired, and no call says one did. done() records the mail as delivered (so the
    copy RabbitMQ sends again is acked as not live) and fails nothing; retry() without a delay is what
    RabbitMQ does anyway; retry() with one and reject() raise BrokerUnavailable, saying so, and change
    nothing."""
    prepared = prepare(wired, dequeued=True)
    before = before_the_outage(backend, wired.runtime)
    wired.cables["rabbitmq"].cut()
    lost_by_the_broker(wired.runtime)
    if call in ("done", "retry now"):
        CALLS[call](wired.queue, prepared)
    else:
        with pytest.raises(BrokerUnavailable, match="connection was lost while mail .* was in hand"):
            CALLS[call](wired.queue, prepared)
    wired.cables["rabbitmq"].restore()
    wired.runtime.close()
    again = backend.open().queue(QUEUE)
    if call == "done":
        assert [item.name for item in again.browse()] == ["later"]
        assert again.dequeue(timeout=2) is None  # given again by RabbitMQ, acked as delivered
    else:
        assert settled(backend, before) == before


@dataclass
class Boxes:
    """Two mailboxes of one user, the first holding one message (uid `uid`, id `message_id`)."""

    inbox: str
    archive: str
    uid: int
    message_id: str


def prepare_mailboxes(runtime: Runtime) -> Boxes:
    mailboxes = runtime.mailboxes
    inbox = mailboxes.create("user@example.com", "INBOX")
    archive = mailboxes.create("user@example.com", "Archive")
    appended = mailboxes.append(inbox, b"Subject: kept\r\n\r\nKept.\r\n")
    return Boxes(inbox, archive, appended.uid, appended.message_id)


USER = "user@example.com"
MAILBOX_CALLS: dict[str, Callable[[Mailboxes, Boxes], object]] = {
    "create": lambda mailboxes, boxes: mailboxes.create(USER, "Sent"),
    "get": lambda mailboxes, boxes: mailboxes.get(USER, "INBOX"),
    "get or create": lambda mailboxes, boxes: mailboxes.get_or_create(USER, "Drafts"),
    "list": lambda mailboxes, boxes: mailboxes.list(USER),
    "scope": lambda mailboxes, boxes: mailboxes.scope(USER),
    # Content of its own: content already stored is not written again.
    "append": lambda mailboxes, boxes: mailboxes.append(boxes.inbox, b"Subject: new\r\n\r\nNew.\r\n"),
    "set flags": lambda mailboxes, boxes: mailboxes.set_flags(boxes.inbox, boxes.uid, add=["\\Seen"]),
    "move": lambda mailboxes, boxes: mailboxes.move(boxes.inbox, boxes.uid, boxes.archive),
    "expunge": lambda mailboxes, boxes: mailboxes.expunge(boxes.inbox, [boxes.uid]),
    "delete mailbox": lambda mailboxes, boxes: mailboxes.delete_mailbox(boxes.archive),
    "counters": lambda mailboxes, boxes: mailboxes.counters(boxes.inbox),
    "list messages": lambda mailboxes, boxes: mailboxes.list_messages(boxes.inbox),
    "read": lambda mailboxes, boxes: mailboxes.read(boxes.inbox, boxes.uid),
    "locate": lambda mailboxes, boxes: mailboxes.locate(boxes.message_id),
    "heal projection": lambda mailboxes, boxes: mailboxes.heal_projection(boxes.inbox, boxes.message_id),
    "reset counters": lambda mailboxes, boxes: mailboxes.reset_counters(boxes.inbox, 1, 1, observed=None),
    "recount": lambda mailboxes, boxes: mailboxes.recount(boxes.inbox),
    "sample drift": lambda mailboxes, boxes: mailboxes.sample_drift(10),
    "release orphan": lambda mailboxes, boxes: mailboxes.release_orphan(boxes.message_id),
}
# The mailboxes' calls that read or write content; the others use Cassandra alone.
MAILBOX_NEEDS = {"cassandra": set(MAILBOX_CALLS), "s3": {"append", "read"}}


@pytest.mark.parametrize(
    ("outage", "call"), [(outage, call) for outage in MAILBOX_NEEDS for call in sorted(MAILBOX_CALLS)]
)
def test_an_outage_fails_the_mailboxes_calls_that_need_it_and_changes_nothing(backend, wired, outage, call):
    boxes = prepare_mailboxes(wired.runtime)
    if call not in MAILBOX_NEEDS[outage]:
        with wired.cables[outage].cable_pulled():
            MAILBOX_CALLS[call](wired.runtime.mailboxes, boxes)
        return
    before = snapshot(backend)
    wired.cables[outage].cut()
    with pytest.raises(ERRORS[outage]) as raised:
        MAILBOX_CALLS[call](wired.runtime.mailboxes, boxes)
    assert chained_to_driver(raised.value, outage), repr(raised.value.__cause__)
    assert "\n" not in str(raised.value)
    wired.cables[outage].restore()
    if (outage, call) == ("s3", "append"):
        # The first step of append's crash-safe order, taking a uid, was done: a gap in the uids.
        before["mailboxes"] = [
            (mailbox_id, name, next_uid + (mailbox_id == boxes.inbox), user)
            for mailbox_id, name, next_uid, user in before["mailboxes"]
        ]
    assert snapshot(backend) == before


def mailq(*argv: str) -> tuple[int, str, str]:
    """`mailq ARGV` in this process: its exit status, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


# One command a backend's outage fails, and what its one line says. A CLI command opens its own runtime,
# which connects to Cassandra and checks the bucket first: those outages fail it there. republish waits
# for RabbitMQ for the broker's publish timeout (30 s: the command sets no other).
CLI_COMMANDS = {
    "cassandra": (["size", QUEUE], "cannot connect to Cassandra at 127.0.0.1 port"),
    "s3": (["enqueue", QUEUE, "{file}", "--sender", "a@example.com", "--rcpt", "b@example.com"], "S3 bucket"),
    "rabbitmq": (["republish", QUEUE, "--older-than", "0s"], "could not declare the queues of spool"),
}


@pytest.mark.parametrize("outage", sorted(CLI_COMMANDS))
def test_an_outage_is_one_line_of_the_command_line(backend, wired, outage, tmp_path):
    wired.queue.enqueue(make_mail("waiting"))
    message = tmp_path / "mail.eml"
    message.write_bytes(b"Subject: new\r\n\r\nNew content.\r\n")
    before = before_the_outage(backend, wired.runtime)
    argv, words = CLI_COMMANDS[outage]
    with wired.cables[outage].cable_pulled():
        status, out, err = mailq("--url", wired.url, *(arg.format(file=message) for arg in argv))
    assert (status, out) == (2, ""), (status, out, err)
    assert err.startswith("mailq: error: ") and err.count("\n") == 1, err
    assert words in err, err
    assert snapshot(backend, wired.runtime) == before
