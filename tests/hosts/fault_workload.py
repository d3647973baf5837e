"""The workload of the network fault scenarios, and its report: `mailq smtp` and two `mailq worker`s at
work while producers send mail through SMTP and through the API, bounded in time and count, with a fault
applied half-way and healed after its length; then every mail accounted for.

Where the processes run is the caller's: `on(host, argv)` turns an argv into the argv that runs it on a
host (`bed.host(host).command` on the host bed, the identity on this machine), so the same workload and
the same checks serve the embedded deployment and the bed's network faults. The producers and the reading
of the INBOXes run in this process, through the runtime of the URL.

Each mail carries a header naming this run, its sequence number and the time its producer began sending it
(`X-Mailq-Workload`), and goes to one local user, so that the INBOXes tell which mails arrived, how many
copies of each, and when (the copy's internal date, the appending worker's clock: one clock on the bed,
whose hosts share the machine's kernel).
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import signal
import smtplib
import statistics
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from email.parser import BytesHeaderParser

from mailq_runtime import Mail, Runtime
from mailq_runtime.clock import MICROS_PER_SECOND
from mailq_runtime.errors import BACKEND_FAILURES, MailqError
from mailq_runtime.mailbox import INBOX
from mailq_runtime.queue import dequeuer
from mailq_runtime.stores.cassandra import slice_counts
from tests.smtp.helpers import SmtpProcess, mailq_command

HEADER = "X-Mailq-Workload"
QUEUE = "spool"  # the queue `mailq smtp` and `mailq worker` serve by default
# The delay a mail may take beyond the fault's length, and the enqueue time allowed where a
# quorum is reachable.
DELAY_SLACK, ENQUEUE_P99 = 10.0, 1.0
# After the counts' bound, the time a recount's own browse may take (docs/distributed.md, "Exact counts").
COUNT_MARGIN = 10.0
# How long a producer tries one mail again after a temporary failure (451, a backend away): as a client
# would, which keeps the mail rather than lose it.
RETRY_FOR, RETRY_PAUSE = 30.0, 0.5
_SENT = re.compile(r": ([0-9a-f]{16,}): to=.*status=sent")
# A worker's note of a lease it lost: while delivering (its lease keeper), or at the settlement refused.
_LEASE_LOST = re.compile(r"^(?=.*\blease\b)(?=.*\blost\b).*\bmail ([0-9a-f]{16,})\b")
_TRACEBACK = "Traceback (most recent call last)"
_ERROR_LINE = "mailq: error: "

On = Callable[[str, list[str]], list[str]]
Fault = Callable[[], float | None]


def locally(host: str, argv: list[str]) -> list[str]:
    """`on` for processes of this machine: every host is here."""
    return argv


def documented_count_bound() -> float:
    """The seconds within which `size()`, the overview and the counts by domain are exact again on the
    distributed deployment (an epoch, its settling, a recount's interval: 70 s by default). Read from the
    code's constants, which no URL option, CLI flag or environment variable changes, so a test of this
    process cannot shorten it for the `mailq worker`s, which run the recounts: it waits the bound."""
    return slice_counts.EPOCH + slice_counts.SETTLE + dequeuer.RECOUNT_INTERVAL


def p99(values: Sequence[float]) -> float | None:
    """The 99th percentile by nearest rank (the largest of fewer than 100 values): no interpolation
    that would hide the slowest call of a small sample."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[math.ceil(0.99 * len(ordered)) - 1]


@dataclass
class Sent:
    """One mail a producer sent, as the producer saw it."""

    seq: int
    via: str  # "smtp" or "api"
    recipient: str
    sent_at: float = 0.0  # wall clock, when the producer began sending it (the first try)
    accepted_at: float | None = None  # wall clock of the 250 or the enqueue's return
    latency: float | None = None  # seconds of the accepting try: the SMTP transaction, or enqueue()
    enqueue_id: str | None = None
    tries: int = 0


@dataclass
class ErrorSeen:
    """An error a producer met or a process printed: its type (mailq's class, an SMTP reply's codes, or
    the foreign class that should never reach a caller), its one line, when, and whether it is mailq's."""

    kind: str
    line: str
    at: float
    own: bool


class MailqProcess:
    """A long-running `mailq` command (a worker) in a process of its own, on a host; its stdout and stderr
    read by threads, so that the pipes never fill while it runs."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.popen = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(stream, lines), daemon=True)
            for stream, lines in ((self.popen.stdout, self.out), (self.popen.stderr, self.err))
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line)

    @property
    def pid(self) -> int:
        """The command's process, to signal: on a host of the bed too, where `ip netns exec`, `unshare`
        and the host's shell (mailq_servers/hosts.py) each exec the next."""
        return self.popen.pid

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM (a worker finishes the mail in hand and prints its stats), then its exit status; killed
        past `timeout`, which fails the run with -9."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGCONT)  # a paused process could not act on SIGTERM
            self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        for reader in self._readers:
            reader.join(10)
        return self.popen.returncode


@dataclass
class Report:
    """What became of a run's mails, and the figures the fault scenarios' targets are about.

    `delays`: seconds from a mail's sending to its first copy in an INBOX; the no-fault delay is their
    median over the mails that met no fault (delivered before it began, or sent after it healed), and
    `largest_delay_over_no_fault` is the largest delay minus that. The warm-up mail (seq 0, enqueued before
    the workers start, to create the queue) counts as accepted and must be delivered, but is not timed.
    A mail is in flight at the fault when it was sent before the fault healed and not delivered before
    it began: only those may come twice."""

    run: str
    planned: int  # the warm-up and the paced mails
    mails: int  # tried, the warm-up included
    accepted: int  # 250s, and enqueues that returned
    accepted_via: dict[str, int]
    delivered: int  # distinct accepted mails found in the INBOXes
    missing: list[int]  # accepted, not delivered within the wait
    delivered_unaccepted: list[int]  # found though no try was accepted (an ambiguous failure's mail)
    duplicates: dict[int, int]  # seq -> copies beyond the first
    in_flight_at_fault: list[int]
    no_fault_delay: float | None
    largest_delay: float | None
    largest_delay_over_no_fault: float | None
    slowest: int | None  # the seq of the largest delay
    smtp_p99: float | None
    enqueue_p99: float | None
    errors: dict[str, int]  # kind -> how many
    error_lines: dict[str, str]  # kind -> its first line
    foreign_errors: list[str]  # not mailq's own: a class that should never reach a caller
    multi_line_errors: list[str]
    errors_without_fault: list[str]  # mailq's own, but outside the fault and its slack
    tracebacks: list[str]  # process: the lines after a traceback's first
    exits: dict[str, int]  # process -> exit status
    workers: dict[str, dict]  # worker host -> its stats (`mailq --json worker`)
    sent_by: dict[str, list[str]]  # worker host -> the enqueue ids it logged as sent
    lease_lost_by: dict[str, list[str]]  # worker host -> the enqueue ids whose lease it logged as lost
    counts: dict[str, object]  # browse, size, overview, by domain, each INBOX's counters and recount
    count_mismatches: list[str]  # at the last reading
    counts_exact_after: float | None  # seconds after the heal when the counts first equalled a browse
    count_bound: float
    fault_start: float | None
    fault_end: float | None
    sent: list[Sent] = field(default_factory=list, repr=False)

    @property
    def fault_length(self) -> float:
        if self.fault_start is None or self.fault_end is None:
            return 0.0
        return self.fault_end - self.fault_start

    def check(self, fault_seconds: float, *, quorum_reachable: bool = True) -> None:
        """The scenarios' targets, every failure named in one assertion: no mail missing; duplicates only of
        mails in flight at the fault; no mail delayed past the fault's length plus 10 s over the no-fault
        delay; the counts equal to a browse within their bound after the heal; errors only mailq's own,
        one line each, and only around the fault; no traceback; every process exited 0; and, where a
        quorum is reachable during the fault, SMTP replies and enqueues under 1 s at the 99th percentile.
        `fault_seconds` is the length the scenario declares: a fault shorter than that tested less."""
        failures = []
        if self.mails != self.planned:
            failures.append(f"the producers tried {self.mails} of {self.planned} mails")
        if self.fault_start is None:
            failures.append("the fault never started")
        elif self.fault_length < fault_seconds:
            failures.append(f"the fault lasted {self.fault_length:.1f} s, not the {fault_seconds} s declared")
        if self.missing:
            failures.append(f"{len(self.missing)} accepted mails never delivered: seqs {self.missing[:20]}")
        twice = sorted(set(self.duplicates) - set(self.in_flight_at_fault))
        if twice:
            failures.append(f"mails delivered twice that were not in flight at the fault: seqs {twice[:20]}")
        if self.largest_delay_over_no_fault is None:
            failures.append("no mail was timed (no delivery, or none met no fault)")
        elif self.largest_delay_over_no_fault > self.fault_length + DELAY_SLACK:
            failures.append(
                f"mail {self.slowest} was delivered {self.largest_delay_over_no_fault:.1f} s later than the "
                f"no-fault delay ({self.no_fault_delay:.2f} s), past the fault's {self.fault_length:.1f} s "
                f"+ {DELAY_SLACK:.0f} s"
            )
        if self.count_mismatches:
            failures.append(
                f"counts unequal to a browse past their bound: {'; '.join(self.count_mismatches)}"
            )
        elif self.counts_exact_after is None or self.counts_exact_after > self.count_bound + COUNT_MARGIN:
            failures.append(
                f"counts equalled a browse {self.counts_exact_after} s after the heal, past their bound "
                f"{self.count_bound} s + {COUNT_MARGIN} s"
            )
        if self.foreign_errors:
            failures.append(f"errors that are not mailq's own: {self.foreign_errors[:5]}")
        if self.multi_line_errors:
            failures.append(f"errors of more than one line: {self.multi_line_errors[:5]}")
        if self.errors_without_fault:
            failures.append(f"errors with no fault under way: {self.errors_without_fault[:5]}")
        if self.tracebacks:
            failures.append(f"tracebacks in the processes' output: {self.tracebacks[:3]}")
        failed_exits = {name: status for name, status in self.exits.items() if status != 0}
        if failed_exits:
            failures.append(f"processes that did not exit 0: {failed_exits}")
        if quorum_reachable:
            for what, value in (("SMTP reply", self.smtp_p99), ("enqueue", self.enqueue_p99)):
                if value is not None and value >= ENQUEUE_P99:
                    failures.append(f"{what} p99 {value:.2f} s, not under {ENQUEUE_P99:.0f} s")
        assert not failures, "; ".join(failures) + f"\nreport: {self.to_json()}"

    def to_json(self) -> str:
        """One line: the figures, not the mails (the lists cut to their first ten)."""
        summary = {
            name: value[:10] if isinstance(value, list) else value
            for name, value in asdict(self).items()
            if name not in ("sent", "sent_by", "lease_lost_by")
        }
        summary["duplicates"] = {str(seq): copies for seq, copies in self.duplicates.items()}
        summary["in_flight_at_fault"] = len(self.in_flight_at_fault)
        summary["sent_by"] = {host: len(ids) for host, ids in self.sent_by.items()}
        summary["lease_lost_by"] = {host: len(ids) for host, ids in self.lease_lost_by.items()}
        summary["fault_length"] = round(self.fault_length, 3)
        for name in ("no_fault_delay", "largest_delay", "largest_delay_over_no_fault", "smtp_p99"):
            if summary[name] is not None:
                summary[name] = round(summary[name], 3)
        if summary["enqueue_p99"] is not None:
            summary["enqueue_p99"] = round(summary["enqueue_p99"], 3)
        return json.dumps(summary, sort_keys=True, default=str)


class Workload:
    """`mailq smtp` on host "smtp", `mailq worker`s on "worker1" and "worker2", and producers in this
    process: `smtp_mails` through SMTP and `api_mails` through `queue.enqueue`, each producer's paced
    evenly over `seconds`, every mail to one of `users` (local users of `domain`, created here).

    `url` is the deployment's (its store must exist: a worker serves a queue that exists, which the
    warm-up mail creates); `env` the processes' environment; `smtp_address` where `mailq smtp` listens
    and the producers connect; `networks` its --networks. `count_bound` is the seconds after the heal
    within which the counts must equal a browse (0 on the embedded store, where a row and its count are
    one transaction; `documented_count_bound()` on the distributed deployment)."""

    def __init__(
        self,
        url: str,
        env: dict[str, str],
        on: On = locally,
        *,
        smtp_address: tuple[str, int],
        networks: Sequence[str] = ("127.0.0.0/8",),
        domain: str = "example.org",
        users: Sequence[str] = ("alice", "bob", "carol"),
        smtp_mails: int = 30,
        api_mails: int = 30,
        seconds: float = 20.0,
        worker_hosts: Sequence[str] = ("worker1", "worker2"),
        worker_options: Sequence[str] = (),
        count_bound: float | None = None,
        deliver_within: float = 60.0,
    ) -> None:
        self.url, self.env, self.on = url, env, on
        self.smtp_address, self.networks, self.domain = smtp_address, tuple(networks), domain
        self.users = [f"{user}@{domain}" for user in users]
        self.smtp_mails, self.api_mails, self.seconds = smtp_mails, api_mails, seconds
        self.worker_hosts, self.worker_options = tuple(worker_hosts), tuple(worker_options)
        self.count_bound = documented_count_bound() if count_bound is None else count_bound
        self.deliver_within = deliver_within
        self.run_id = secrets.token_hex(4)
        self.workers: dict[str, MailqProcess] = {}
        self.smtp: SmtpProcess | None = None
        self._sent: dict[int, Sent] = {}
        self._errors: list[ErrorSeen] = []
        self._lock = threading.Lock()
        self._accepted = 0
        self._stdouts: dict[str, str] = {}
        self._seen: dict[tuple[str, int], int | None] = {}  # (user, uid) -> seq (None: not this run's)

    # the mails

    def _message(self, sent: Sent) -> bytes:
        return (
            f"Message-ID: <{self.run_id}.{sent.seq}@workload.mailq>\r\n"
            f"{HEADER}: {self.run_id} {sent.seq} {sent.sent_at:.6f}\r\n"
            f"Subject: fault workload {sent.seq}\r\n"
            f"From: producer@{self.domain}\r\nTo: {sent.recipient}\r\n\r\n"
            f"Mail {sent.seq} of run {self.run_id}.\r\n"
        ).encode()

    def _new(self, seq: int, via: str) -> Sent:
        sent = Sent(seq, via, self.users[seq % len(self.users)])
        self._sent[seq] = sent
        return sent

    def _error(self, kind: str, line: str, own: bool) -> None:
        with self._lock:
            self._errors.append(ErrorSeen(kind, line, time.time(), own))

    def _accept(self, sent: Sent, enqueue_id: str, latency: float) -> None:
        sent.enqueue_id, sent.latency, sent.accepted_at = enqueue_id, latency, time.time()
        with self._lock:
            self._accepted += 1

    @property
    def accepted(self) -> int:
        with self._lock:
            return self._accepted

    # the producers

    def _enqueue(self, runtime: Runtime, sent: Sent) -> None:
        """One mail through the API, tried again after a backend's failure for RETRY_FOR seconds."""
        queue = runtime.queue(QUEUE)
        sent.sent_at = time.time()
        deadline = time.monotonic() + RETRY_FOR
        while True:
            sent.tries += 1
            started = time.monotonic()
            mail = Mail(
                recipients=(sent.recipient,),
                sender=f"producer@{self.domain}",
                message=self._message(sent),
                name=f"workload-{self.run_id}-{sent.seq}",
            )
            try:
                enqueue_id = queue.enqueue(mail)
            except MailqError as error:
                self._error(type(error).__name__, str(error), own=True)
                if not isinstance(error, BACKEND_FAILURES) or time.monotonic() > deadline:
                    return
                time.sleep(RETRY_PAUSE)
                continue
            except Exception as error:  # a foreign class that reached the caller: the run fails
                self._error(f"{type(error).__module__}.{type(error).__name__}", str(error), own=False)
                return
            self._accept(sent, enqueue_id, time.monotonic() - started)
            return

    def _send(self, client: smtplib.SMTP | None, sent: Sent) -> smtplib.SMTP | None:
        """One mail through SMTP on the producer's session (opened again after a disconnection), tried
        again after a 4xx reply for RETRY_FOR seconds; returns the session to go on with."""
        sent.sent_at = time.time()
        deadline = time.monotonic() + RETRY_FOR
        while True:
            sent.tries += 1
            started = time.monotonic()
            try:
                if client is None:
                    client = smtplib.SMTP(*self.smtp_address, local_hostname="workload.example", timeout=60)
                    client.ehlo()
                code, reply = client.mail(f"producer@{self.domain}")
                if code == 250:
                    code, reply = client.rcpt(sent.recipient)
                if code == 250:
                    code, reply = client.data(self._message(sent))  # raises on a refused DATA command
                if code == 250:
                    enqueue_id = reply.decode().rsplit(" ", 1)[-1]
                    self._accept(sent, enqueue_id, time.monotonic() - started)
                    return client
                self._reply(code, reply)
                client.rset()
            except smtplib.SMTPResponseException as error:
                code = error.smtp_code
                self._reply(code, error.smtp_error)  # a greeting's 421 too: then there is no session
                client = None if client is None else self._reset(client)
            except (smtplib.SMTPException, OSError) as error:
                # A session mailq dropped or never answered: the client's error, not a reply of mailq's.
                self._error(f"{type(error).__module__}.{type(error).__name__}", str(error), own=False)
                if client is not None:
                    client.close()
                client, code = None, 421
            if code < 400 or code >= 500 or time.monotonic() > deadline:
                return client
            time.sleep(RETRY_PAUSE)

    def _reset(self, client: smtplib.SMTP) -> smtplib.SMTP | None:
        """The session after a refused command: reset for the next try, or closed if that fails."""
        try:
            client.rset()
            return client
        except (smtplib.SMTPException, OSError) as error:
            self._error(f"{type(error).__module__}.{type(error).__name__}", str(error), own=False)
            client.close()
            return None

    def _reply(self, code: int, reply: bytes) -> None:
        """A refusal of mailq's, by its reply code and enhanced status code (451 4.3.0: a backend away)."""
        text = reply.decode(errors="replace")
        self._error(f"SMTP {code} {text.split(' ', 1)[0]}", f"{code} {text}", own=True)

    def _produce(self, via: str, seqs: list[int], runtime: Runtime, start: float) -> None:
        interval = self.seconds / max(len(seqs), 1)
        client = None
        try:
            for index, seq in enumerate(seqs):
                due = start + index * interval
                time.sleep(max(0.0, due - time.monotonic()))  # the pacing itself, not a wait for a state
                sent = self._new(seq, via)
                if via == "smtp":
                    client = self._send(client, sent)
                else:
                    self._enqueue(runtime, sent)
        finally:
            if client is not None:
                try:
                    client.quit()
                except (smtplib.SMTPException, OSError) as error:
                    self._error(f"{type(error).__module__}.{type(error).__name__}", str(error), own=False)

    # the processes

    def _start_processes(self) -> None:
        host, port = self.smtp_address
        networks = [word for network in self.networks for word in ("--networks", network)]
        self.smtp = SmtpProcess(
            self.on(
                "smtp",
                mailq_command(
                    self.url, "smtp", "--listen", f"{host}:{port}", "--domain", self.domain, *networks
                ),
            ),
            port,
            env=self.env,
        )
        for worker_host in self.worker_hosts:
            argv = mailq_command(
                self.url, "--json", "worker", "--queue", QUEUE, "--domain", self.domain, *self.worker_options
            )
            self.workers[worker_host] = MailqProcess(worker_host, self.on(worker_host, argv), self.env)

    def _stop_processes(self) -> tuple[dict[str, int], dict[str, list[str]]]:
        """Every process stopped: their exit statuses and output lines (a worker's stdout first: its
        stats)."""
        exits, outputs = {}, {}
        for name, worker in self.workers.items():
            exits[name] = worker.stop()
            outputs[name] = worker.out + worker.err
            self._stdouts[name] = "".join(worker.out)
        if self.smtp is not None:
            status, out = self.smtp.stop()
            exits["smtp"] = status
            outputs["smtp"] = [*self.smtp.log, *out.splitlines(keepends=True)]
        return exits, outputs

    # the INBOXes

    def _copies(self, runtime: Runtime) -> dict[int, list[float]]:
        """seq -> the internal dates (seconds) of its copies in the users' INBOXes, this run's only."""
        parser = BytesHeaderParser()
        copies: dict[int, list[float]] = {}
        for user in self.users:
            for summary in runtime.mailboxes.summaries(runtime.mailboxes.get(user, INBOX)):
                words = str(parser.parsebytes(summary.header).get(HEADER, "")).split()
                if len(words) == 3 and words[0] == self.run_id:
                    copies.setdefault(int(words[1]), []).append(summary.internal_date / MICROS_PER_SECOND)
        return copies

    def _delivered(self, runtime: Runtime) -> set[int]:
        """The seqs of this run in the users' INBOXes: each message's header read once, so that polling
        reads only the projection and the new messages."""
        boxes = runtime.mailboxes
        parser = BytesHeaderParser()
        for user in self.users:
            inbox = boxes.get(user, INBOX)
            for entry in boxes.list_messages(inbox):
                if (user, entry.uid) not in self._seen:
                    header = boxes.read(inbox, entry.uid, header_only=True)
                    words = str(parser.parsebytes(header).get(HEADER, "")).split()
                    mine = len(words) == 3 and words[0] == self.run_id
                    self._seen[user, entry.uid] = int(words[1]) if mine else None
        return {seq for seq in self._seen.values() if seq is not None}

    @staticmethod
    def _poll(condition: Callable[[], bool], timeout: float) -> bool:
        """Whether `condition` held within `timeout` seconds, asked every 0.2 s."""
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True

    def _wait_for(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        assert self._poll(condition, timeout), f"timed out after {timeout} s waiting for {what}"

    def _counts(self, runtime: Runtime) -> tuple[dict[str, object], list[str]]:
        """Every count of the queue and of the INBOXes against a browse and a recount, and what differs."""
        queue = runtime.queue(QUEUE)
        browsed = sum(1 for _ in queue.browse())
        overview = queue.overviews.overview()
        shapes = queue.overviews.by_domain()
        by_domain = {shape.domain: sum(map(shape.total, shape.buckets)) for shape in shapes}
        counts: dict[str, object] = {
            "browse": browsed,
            "size": queue.size(),
            "overview": overview.size,
            "by_domain": by_domain,
        }
        mismatches = []
        for name in ("size", "overview"):
            if counts[name] != browsed:
                mismatches.append(f"{name} {counts[name]} != browse {browsed}")
        if sum(by_domain.values()) != browsed:
            mismatches.append(f"by domain {by_domain} != browse {browsed}")
        boxes = runtime.mailboxes
        for user in self.users:
            inbox = boxes.get(user, INBOX)
            counters, recount = boxes.counters(inbox), boxes.recount(inbox)
            listed = len(boxes.list_messages(inbox))
            counts[user] = {
                "counters": [counters.count, counters.unseen],
                "recount": [recount.count, recount.unseen],
                "listed": listed,
            }
            if counters != recount or counters.count != listed:
                mismatches.append(f"{user}'s INBOX counters {counters} != recount {recount}, listed {listed}")
        return counts, mismatches

    def _counts_settled(self, runtime: Runtime, healed: float) -> tuple[dict, list[str], float | None]:
        """The counts read once the bound has passed since the heal, then again every second for the
        recount's own browse (COUNT_MARGIN) until they equal a browse: the last reading, what differed
        in it, and the seconds after the heal when they were first exact (None: never)."""
        time.sleep(max(0.0, healed + self.count_bound - time.time()))  # the bound is a wait by definition
        deadline = time.monotonic() + COUNT_MARGIN
        while True:
            counts, mismatches = self._counts(runtime)
            if not mismatches:
                return counts, mismatches, time.time() - healed
            if time.monotonic() > deadline:
                return counts, mismatches, None
            time.sleep(1.0)

    # the run

    def run(
        self, fault: Fault, heal: Callable[[], None], *, fault_seconds: float, fault_after: int | None = None
    ) -> Report:
        """Run the workload with `fault` applied once `fault_after` of the paced mails are accepted
        (default: half of them) and `heal` called `fault_seconds` after it took effect; every process
        stopped at the end, the fault healed whatever failed. `fault` returns the wall-clock time it took
        effect (None: when it returned), for a fault that must wait for its moment (a worker holding
        mails)."""
        total = self.smtp_mails + self.api_mails
        fault_after = total // 2 if fault_after is None else fault_after
        exits: dict[str, int] = {}
        outputs: dict[str, list[str]] = {}
        fault_start = fault_end = None
        with Runtime.open(self.url) as runtime:
            for user in self.users:
                runtime.mailboxes.get_or_create(user, INBOX)
            # The warm-up mail creates the queue the workers serve, and tells when one of them serves.
            self._enqueue(runtime, self._new(0, "api"))
            assert self._sent[0].enqueue_id is not None, f"the warm-up mail was refused: {self._errors}"
            try:
                self._start_processes()
                self._wait_for(lambda: 0 in self._delivered(runtime), 120, "the warm-up mail's delivery")
                start = time.monotonic()
                smtp_seqs = list(range(1, self.smtp_mails + 1))
                api_seqs = list(range(self.smtp_mails + 1, total + 1))
                producers = [
                    threading.Thread(
                        target=self._produce, args=(via, seqs, runtime, start), name=f"producer {via}"
                    )
                    for via, seqs in (("smtp", smtp_seqs), ("api", api_seqs))
                    if seqs
                ]
                for producer in producers:
                    producer.start()
                try:
                    self._wait_for(
                        lambda: self.accepted >= fault_after + 1 or not any(p.is_alive() for p in producers),
                        self.seconds + RETRY_FOR,
                        f"{fault_after} mails accepted",
                    )
                    assert (
                        self.accepted >= fault_after + 1
                    ), f"only {self.accepted} mails accepted before the fault"
                    began = time.time()
                    try:
                        fault_start = fault() or began
                        time.sleep(max(0.0, fault_start + fault_seconds - time.time()))  # the fault's length
                    finally:
                        heal()
                        fault_end = time.time()
                finally:
                    for producer in producers:
                        producer.join(self.seconds + RETRY_FOR * 2)
                accepted = {seq for seq, sent in self._sent.items() if sent.enqueue_id is not None}
                # What never comes is reported missing.
                self._poll(lambda: accepted <= self._delivered(runtime), self.deliver_within)
                counts, mismatches, exact_after = self._counts_settled(runtime, fault_end)
                copies = self._copies(runtime)
            finally:
                exits, outputs = self._stop_processes()
        return self._report(copies, counts, mismatches, exact_after, exits, outputs, fault_start, fault_end)

    def _report(
        self,
        copies: dict[int, list[float]],
        counts: dict[str, object],
        mismatches: list[str],
        exact_after: float | None,
        exits: dict[str, int],
        outputs: dict[str, list[str]],
        fault_start: float | None,
        fault_end: float | None,
    ) -> Report:
        sent = [self._sent[seq] for seq in sorted(self._sent)]
        accepted = {s.seq for s in sent if s.enqueue_id is not None}
        first = {seq: min(dates) for seq, dates in copies.items()}
        delays = {s.seq: first[s.seq] - s.sent_at for s in sent if s.seq in first and s.seq != 0}
        start = math.inf if fault_start is None else fault_start
        end = -math.inf if fault_end is None else fault_end
        in_flight = sorted(s.seq for s in sent if s.sent_at < end and first.get(s.seq, math.inf) >= start)
        no_fault = [
            delay for seq, delay in delays.items() if first[seq] < start or self._sent[seq].sent_at > end
        ]
        no_fault_delay = statistics.median(no_fault) if no_fault else None
        slowest = max(delays, key=delays.__getitem__) if delays else None
        largest = None if slowest is None else delays[slowest]
        errors = list(self._errors)
        tracebacks = []
        for name, lines in outputs.items():
            text = "".join(lines)
            if _TRACEBACK in text:
                tracebacks.append(f"{name}: {text[text.index(_TRACEBACK) :][:400]}")
            for line in lines:
                if _ERROR_LINE in line:
                    message = line.strip().split(_ERROR_LINE, 1)[1]
                    errors.append(ErrorSeen(f"{name}: mailq error", message, math.nan, own=True))
        slack_end = end + DELAY_SLACK
        return Report(
            run=self.run_id,
            planned=1 + self.smtp_mails + self.api_mails,
            mails=len(sent),
            accepted=len(accepted),
            accepted_via=dict(Counter(s.via for s in sent if s.seq in accepted)),
            delivered=len(accepted & set(copies)),
            missing=sorted(accepted - set(copies)),
            delivered_unaccepted=sorted(set(copies) - accepted),
            duplicates={seq: len(dates) - 1 for seq, dates in sorted(copies.items()) if len(dates) > 1},
            in_flight_at_fault=in_flight,
            no_fault_delay=no_fault_delay,
            largest_delay=largest,
            largest_delay_over_no_fault=None
            if largest is None or no_fault_delay is None
            else largest - no_fault_delay,
            slowest=slowest,
            smtp_p99=p99([s.latency for s in sent if s.via == "smtp" and s.latency is not None]),
            enqueue_p99=p99([s.latency for s in sent if s.via == "api" and s.latency is not None and s.seq]),
            errors=dict(Counter(error.kind for error in errors)),
            error_lines={error.kind: error.line for error in reversed(errors)},
            foreign_errors=[f"{error.kind}: {error.line}" for error in errors if not error.own],
            multi_line_errors=[
                f"{error.kind}: {error.line!r}" for error in errors if "\n" in error.line.strip()
            ],
            errors_without_fault=[
                f"{error.kind}: {error.line}"
                for error in errors
                if error.own and not math.isnan(error.at) and not (start <= error.at <= slack_end)
            ],
            tracebacks=tracebacks,
            exits=exits,
            workers={host: _stats(self._stdouts.get(host, "")) for host in self.workers},
            sent_by={host: _matches(_SENT, outputs.get(host, [])) for host in self.workers},
            lease_lost_by={host: _matches(_LEASE_LOST, outputs.get(host, [])) for host in self.workers},
            counts=counts,
            count_mismatches=mismatches,
            counts_exact_after=exact_after,
            count_bound=self.count_bound,
            fault_start=fault_start,
            fault_end=fault_end,
            sent=sent,
        )


def _stats(stdout: str) -> dict:
    """A worker's stats: the JSON document `mailq --json worker` prints on stdout as it stops (its log
    lines go to stderr); empty if it printed none (killed, or failed)."""
    try:
        stats = json.loads(stdout)
    except ValueError:
        return {}
    return stats if isinstance(stats, dict) else {}


def _matches(pattern: re.Pattern[str], lines: list[str]) -> list[str]:
    return sorted({match.group(1) for line in lines if (match := pattern.search(line))})


def local_env() -> dict[str, str]:
    """The processes' environment on this machine: this one's, their output unbuffered, and this
    checkout first on their path (a worktree's code, not the one the venv was installed from)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
