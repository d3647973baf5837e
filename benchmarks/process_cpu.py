"""CPU time per process, from /proc/<pid>/stat (utime + stime), for queue_throughput.py's cost per mail.

Not a benchmark itself. The servers are found by the loopback port they listen on (the Cassandra node's
native port, the S3 server's HTTP port, RabbitMQ's AMQP port): the inode of the listening socket in
/proc/net/tcp, then the process holding it among /proc/*/fd. The client is this process. A sample reads
every process's ticks; the difference of two samples is the CPU each spent in between, whoever caused
it, so other work on the same servers meanwhile counts too. The phases take turns to spread it alike,
and idle turns (nothing of ours running) measure that background's rate, which `net_ms_per_mail`
takes off each turn's CPU in proportion to its length: on shared servers, the slower side would
otherwise carry more of other people's work.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

TICK_SECONDS = 1 / os.sysconf("SC_CLK_TCK")
CLIENT = "client"
BACKGROUND = "background"
_LISTEN = "0A"


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def listening_pid(port: int) -> int | None:
    """The process listening on `port`, or None when none is found (or its descriptors are not readable)."""
    sockets = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if not sockets:
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in sockets:
                    return int(entry.name)
        except OSError:
            continue
    return None


def ticks(pid: int) -> int:
    """utime + stime of `pid`, in clock ticks. The command name may hold spaces: fields count after ')'."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


class CpuMeter:
    """The CPU seconds of named processes (the client and each server found) between `start` and `stop`,
    added up by a key (a side of the comparison and a phase)."""

    def __init__(self, ports: dict[str, int]) -> None:
        self.pids = {CLIENT: os.getpid()}
        for name, port in ports.items():
            pid = listening_pid(port)
            if pid is not None and pid != os.getpid():
                self.pids[name] = pid
        self.seconds: dict[str, dict[str, float]] = {}
        self.wall: dict[str, float] = {}
        self._started: dict[str, int] = {}
        self._started_at = 0.0

    def start(self) -> None:
        self._started = {name: ticks(pid) for name, pid in self.pids.items()}
        self._started_at = time.perf_counter()

    def stop(self, key: str) -> None:
        self.wall[key] = self.wall.get(key, 0.0) + time.perf_counter() - self._started_at
        spent = self.seconds.setdefault(key, dict.fromkeys(self.pids, 0.0))
        for name, pid in self.pids.items():
            spent[name] += (ticks(pid) - self._started[name]) * TICK_SECONDS

    def idle(self, seconds: float) -> None:
        """An idle turn: what the processes spend while this one waits, the background's rate."""
        self.start()
        time.sleep(seconds)
        self.stop(BACKGROUND)

    def ms_per_mail(self, key: str, mails: int) -> dict[str, float]:
        """Milliseconds per mail by process, and their total."""
        return _per_mail(self.seconds[key], mails)

    def net_ms_per_mail(self, key: str, mails: int) -> dict[str, float]:
        """The same, less the background's rate (idle turns) over the turns' length."""
        idle = self.seconds.get(BACKGROUND)
        if idle is None:
            return self.ms_per_mail(key, mails)
        share = self.wall[key] / self.wall[BACKGROUND]
        spent = self.seconds[key]
        return _per_mail({name: seconds - idle[name] * share for name, seconds in spent.items()}, mails)

    def background_percent(self) -> dict[str, float]:
        """Each process's CPU in the idle turns, in percent of one core."""
        idle = self.seconds.get(BACKGROUND, {})
        return {name: round(spent * 100 / self.wall[BACKGROUND], 1) for name, spent in idle.items()}


def _per_mail(seconds: dict[str, float], mails: int) -> dict[str, float]:
    figures = {name: round(spent * 1e3 / mails, 3) for name, spent in seconds.items()}
    figures["total"] = round(sum(seconds.values()) * 1e3 / mails, 3)
    return figures
