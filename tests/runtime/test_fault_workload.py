"""A paused worker, on the embedded deployment: a `mailq worker` frozen (SIGSTOP) past its lease while
it holds mails, then thawed (SIGCONT), in the middle of the fault workload (tests/hosts/fault_workload.py:
`mailq smtp`, two workers, producers through SMTP and the API). What it held is delivered once, by the
other worker; its own late settlement is refused (the lease is another's) and changes nothing; no mail is
lost, none comes twice, the counts stay equal to a browse.

The pause must catch the worker holding mails, or it tests nothing, and must not catch it inside a write
transaction: it then holds the store's writers' lock (stores/embedded/writers.py) and every writer of the
data dir waits for it, the other worker too, which is the fault of a frozen store, not of a frozen
worker. So the fault stops the other worker for a moment (less than a lease, outside a write), so that
the leases taken meanwhile are the first's; stops the first once it took some, and lets it go on at once
if it was in a write; and once it is caught holding mails outside a write, lets the other go on, which
takes them over when their lease expires. The run then shows the paused worker lost those leases and the
other delivered those mails.

Only the embedded deployment: the other deployments' servers are not started here (the bed's scenarios
call the same workload with `bed.host(host).command` and a network fault)."""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from mailq_runtime import Runtime
from mailq_runtime.clock import MICROS_PER_SECOND
from tests.hosts.fault_workload import Workload, local_env, locally
from tests.smtp.helpers import free_port

from .backends import EmbeddedBackend

LEASE = 3.0  # the workers' visibility timeout, seconds
PAUSE = 2 * LEASE + 1.0  # past the lease, and past the lease keeper's last extension before the pause
OTHER_STOPPED = 1.0  # the longest stop of the other worker: well within a lease, which it keeps
FIND_WITHIN = 30.0  # seconds to catch the worker holding mails outside a write


def stopped(pid: int) -> bool:
    """Whether the kernel has stopped the process (state T): SIGSTOP is delivered asynchronously."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] in "Tt"


def holds_writers_lock(pid: int, lock: Path) -> bool:
    """Whether `pid` holds the flock of the store's writers' lock file (/proc/locks: the holders, and
    `->` lines for the waiters)."""
    inode = str(lock.stat().st_ino)
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if fields[1] == "FLOCK" and fields[4] == str(pid) and fields[5].rsplit(":", 1)[1] == inode:
            return True
    return False


def leased(backend: EmbeddedBackend) -> set[tuple[int, str]]:
    """(broker row, lease token) of every mail leased and not expired: held by a consumer now."""
    now = time.time() * MICROS_PER_SECOND
    return {(row, lease) for row, lease, until in backend.leases() if lease is not None and until > now}


class PauseHoldingMails:
    """SIGSTOP of a worker at a moment it holds mails and not the writers' lock, and its SIGCONT.

    To know whose a lease is, the other worker is stopped too for a moment (less than a lease, at a
    moment it holds no writers' lock): the leases taken meanwhile are the first worker's. Once it is
    caught holding some outside a write, the other goes on, and takes them over when they expire."""

    def __init__(self, workload: Workload, host: str, other: str, backend: EmbeddedBackend, data_dir: Path):
        self.workload, self.host, self.other, self.backend = workload, host, other, backend
        self.lock = data_dir / "mailq.db-writer"
        self.tries: Counter[str] = Counter()
        self.held: set[tuple[int, str]] = set()

    def _stop(self, host: str) -> bool:
        """Stop `host`'s worker; True if it stays stopped, False if it was in a write (let go on)."""
        worker = self.workload.workers[host]
        worker.popen.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while not stopped(worker.pid):
            assert time.monotonic() < deadline, f"{host} did not stop"
            time.sleep(0.001)
        if holds_writers_lock(worker.pid, self.lock):
            self.tries[f"{host} in a write"] += 1
            worker.popen.send_signal(signal.SIGCONT)
            return False
        return True

    def _catch(self, until: float) -> float | None:
        """With the other worker stopped: stop this one once it took mails; its stop time, or None if it
        took none (or settled them all) before `until`."""
        before = leased(self.backend)  # the other's, and this one's taken before: not told apart
        while time.monotonic() < until:
            taken = leased(self.backend) - before
            if not taken:
                time.sleep(0.002)
                continue
            at = time.time()
            if not self._stop(self.host):
                continue
            self.held = taken & leased(self.backend)
            if self.held:
                return at
            self.tries["settled before the stop"] += 1
            self.heal()
        self.tries["took no mail"] += 1
        return None

    def fault(self) -> float:
        deadline = time.monotonic() + FIND_WITHIN
        while time.monotonic() < deadline:
            if not self._stop(self.other):
                time.sleep(0.005)
                continue
            try:
                caught = self._catch(time.monotonic() + OTHER_STOPPED)
            finally:
                self.workload.workers[self.other].popen.send_signal(signal.SIGCONT)
            if caught is not None:
                return caught
            time.sleep(0.2)
        raise AssertionError(f"{self.host} never held a mail outside a write at a pause: {dict(self.tries)}")

    def heal(self) -> None:
        self.workload.workers[self.host].popen.send_signal(signal.SIGCONT)


@pytest.mark.alone  # it times SMTP replies, enqueues and deliveries across processes
def test_a_worker_paused_past_its_lease_loses_no_mail_and_its_mails_come_once(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    url = f"embedded://{data_dir}?visibility_timeout={LEASE:g}s"
    Runtime.open(url, create=True).close()
    # On the embedded store a row and its count are one transaction: the counts' bound is 0 s.
    workload = Workload(url, local_env(), locally, smtp_address=("127.0.0.1", free_port()), count_bound=0.0)
    pause = PauseHoldingMails(workload, "worker1", "worker2", EmbeddedBackend(data_dir), data_dir)
    report = workload.run(pause.fault, pause.heal, fault_seconds=PAUSE)
    print(report.to_json())
    print(f"paused holding {len(pause.held)} mails, after {dict(pause.tries)}")

    report.check(PAUSE)
    lost = set(report.lease_lost_by["worker1"])
    assert lost, f"worker1 held {len(pause.held)} mails at the pause, yet lost no lease"
    assert lost <= set(report.sent_by["worker2"]), "what the paused worker held, the other delivered"
    assert not lost & set(report.sent_by["worker1"]), "the paused worker's late settlement was refused"
    assert report.workers["worker1"]["lease_expired"] >= 1, report.workers
    assert report.workers["worker1"]["delivered"] and report.workers["worker2"]["delivered"], report.workers
