"""Several consumer processes on one queue, `mailq worker` among them: each mail is processed exactly once
when nothing fails; with consumers SIGKILLed in the middle of a mail, every mail is processed and the only
mails processed twice are those in flight at a kill."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from mailq_runtime import UnknownMailbox
from mailq_runtime.mailbox import INBOX
from mailq_runtime.queue import MailQueue
from mailq_runtime.queue.dequeuer import RECOUNT_INTERVAL
from mailq_runtime.stores.cassandra.slice_counts import EPOCH, SETTLE
from mailq_runtime.worker import delivery_message_id

from .conftest import QUEUE
from .helpers import make_mail

AGENT = Path(__file__).with_name("consumer_agent.py")
RECIPIENT = "rcpt@example.org"
LEASE = "3s"  # a killed consumer's mail comes back after this on a broker that waits for its lease
IDLE_EXIT = "6"


def consumer(backend, log: Path, pause: float) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            str(AGENT),
            backend.url(visibility_timeout=LEASE),
            QUEUE,
            str(log),
            str(pause),
            IDLE_EXIT,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def worker(backend) -> subprocess.Popen:
    url = backend.url(visibility_timeout=LEASE)
    return subprocess.Popen(
        [sys.executable, "-m", "mailq_cli", "--url", url, "--json", "worker", "--queue", QUEUE]
        + ["--domain", "example.org", "--idle-exit", f"{IDLE_EXIT}s"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def assert_empty_once_settled(queue: MailQueue) -> None:
    """The queue is empty, and `size()` says so once the counts settle: a consumer that exited, or was
    killed between a mail's row and its count, leaves a count that a dequeuer's recount repairs within the
    bound of docs/distributed.md, "Exact counts" (CI saw size 1 right after the processes ended)."""
    deadline = time.monotonic() + EPOCH + SETTLE + RECOUNT_INTERVAL + 15
    while queue.size() != 0 and time.monotonic() < deadline:
        assert queue.dequeue(timeout=1) is None
    assert queue.size() == 0 and queue.dequeue(timeout=0) is None


def records(log: Path) -> list[tuple[str, str]]:
    """(what, name) of each line a consumer wrote."""
    if not log.exists():
        return []
    return [tuple(line.split(" ", 1)) for line in log.read_text().splitlines()]


def delivered_by_worker(runtime, ids: dict[str, str]) -> set[str]:
    """The mails whose copy the worker appended to the recipient's INBOX."""
    try:
        inbox = runtime.mailboxes.get(RECIPIENT, INBOX)
    except UnknownMailbox:
        return set()
    held = {entry.message_id for entry in runtime.mailboxes.list_messages(inbox)}
    return {name for name, enqueue_id in ids.items() if delivery_message_id(enqueue_id, RECIPIENT) in held}


def finish(processes: list[subprocess.Popen], timeout: float = 120) -> list[str]:
    """Wait for the processes to exit by themselves (idle); their stdout."""
    outputs = []
    deadline = time.monotonic() + timeout
    try:
        for process in processes:
            out, err = process.communicate(timeout=max(deadline - time.monotonic(), 1))
            assert process.returncode in (0, -signal.SIGKILL), err
            outputs.append(out)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return outputs


def test_several_consumer_processes_and_a_worker_process_each_mail_exactly_once(backend, tmp_path):
    runtime = backend.open(visibility_timeout=LEASE)
    runtime.mailboxes.create(RECIPIENT, INBOX)  # the worker's local user
    queue = runtime.queue(QUEUE)
    # Due once every process has had the time to start (the worker's command imports the most): the
    # first to start would otherwise take every mail, on a loaded machine, before the last is up.
    ids = {
        f"m{n:03d}": queue.enqueue(make_mail(f"m{n:03d}", recipients=(RECIPIENT,)), delay=3)
        for n in range(150)
    }
    logs = [tmp_path / f"consumer-{n}.log" for n in range(2)]
    processes = [consumer(backend, log, pause=0.02) for log in logs] + [worker(backend)]
    *_, report = finish(processes)

    stats = json.loads(report)
    by_consumers = [name for log in logs for what, name in records(log) if what == "done"]
    by_worker = delivered_by_worker(runtime, ids)
    assert stats["delivered"] == len(by_worker), "the worker delivered no mail twice"
    twice = sorted(name for name, times in Counter([*by_consumers, *by_worker]).items() if times > 1)
    seen = {
        name: [f"{log.name}: {what}" for log in logs for what, n in records(log) if n == name]
        for name in twice
    }
    assert len(by_consumers) + len(by_worker) == len(ids), f"a mail was lost or processed twice: {seen}"
    assert set(by_consumers) | by_worker == set(ids)
    assert by_worker and all(records(log) for log in logs), "every process took its share"
    assert_empty_once_settled(queue)


def test_consumers_killed_in_the_middle_of_a_mail_lose_none_and_only_mails_in_flight_come_twice(
    backend, tmp_path
):
    runtime = backend.open(visibility_timeout=LEASE)
    runtime.mailboxes.create(RECIPIENT, INBOX)  # the worker's local user
    queue = runtime.queue(QUEUE)
    ids = {f"m{n:03d}": queue.enqueue(make_mail(f"m{n:03d}", recipients=(RECIPIENT,))) for n in range(300)}
    chance = random.Random(11)
    logs = [tmp_path / f"consumer-{n}.log" for n in range(3)]
    running = {log: consumer(backend, log, pause=0.05) for log in logs}
    the_worker = worker(backend)
    killed: list[Path] = []
    try:
        deadline = time.monotonic() + 120
        while len(killed) < 3:
            # Killed in the middle of a mail: the last thing it wrote is the start of one.
            busy = [log for log in running if records(log) and records(log)[-1][0] == "start"]
            if not busy:
                # On a loaded machine the worker may finish the queue before three kills: one suffices.
                if killed and queue.size() == 0:
                    break
                assert time.monotonic() < deadline, "no consumer was ever in the middle of a mail"
                time.sleep(0.002)
                continue
            victim = chance.choice(busy)
            running.pop(victim).send_signal(signal.SIGKILL)
            killed.append(victim)
            fresh = tmp_path / f"consumer-{len(logs)}.log"
            logs.append(fresh)
            running[fresh] = consumer(backend, fresh, pause=0.05)
            time.sleep(chance.uniform(0.2, 0.6))
    finally:
        finish([*running.values(), the_worker])
    for process in running.values():
        assert process.returncode == 0
    if queue.size():
        # A consumer leaving on idle hands back what the broker had just sent it (RabbitMQ requeues a
        # closed channel's unacked messages); when the others have gone too, it waits for one more.
        drainer = tmp_path / "consumer-last.log"
        logs.append(drainer)
        finish([consumer(backend, drainer, pause=0)])

    in_flight = set()
    for log in killed:
        seen = records(log)
        started = {name for what, name in seen if what == "start"}
        in_flight |= started - {name for what, name in seen if what in ("done", "lost")}
    assert in_flight, "a kill came in the middle of a mail"
    processed = Counter(name for log in logs for what, name in records(log) if what == "start")
    settled = {name for log in logs for what, name in records(log) if what in ("done", "lost")}
    by_worker = delivered_by_worker(runtime, ids)
    processed.update(by_worker)
    # A mail in flight at a kill may have been settled before the consumer could write so; if it was not,
    # it was delivered again (and settled then), as the queue is empty.
    assert settled | by_worker | in_flight == set(ids), "every mail was processed"
    twice = {name for name, times in processed.items() if times > 1}
    assert twice <= in_flight, "only mails in flight at a kill were processed again"
    assert_empty_once_settled(queue)
