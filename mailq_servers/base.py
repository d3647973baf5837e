"""What every server of the harness shares: the cache, its locks and state files, detached processes and
the checks that a process found there is really ours and alive."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
LOG_TAIL_LINES = 30
#: Set to 1 by the test suite (.ci/run, tests/servers/fixtures.py) alone: servers that skip syncs.
UNSAFE_VARIABLE = "MAILQ_SERVERS_UNSAFE"


class ServerError(Exception):
    """A server could not be installed, started or stopped; the message says why (with its log's tail)."""


def cache_root() -> Path:
    return Path(os.environ.get("MAILQ_SERVERS_CACHE") or Path.home() / ".cache" / "mailq-servers").absolute()


def port_setting(variable: str, default: int) -> int:
    value = os.environ.get(variable, "")
    if not value:
        return default
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise ServerError(f"{variable}={value!r} is not a TCP port")
    return int(value)


def unsafe_mode() -> bool:
    """True when the servers are asked for the suite's fast, unsafe mode (see UNSAFE_VARIABLE): a server
    that supports it then skips the syncs that make acknowledged writes survive a crash. Without it, the
    default, the servers are durable, as the ones a user's data lives on must be."""
    value = os.environ.get(UNSAFE_VARIABLE, "")
    if value not in ("", "0", "1"):
        raise ServerError(
            f"{UNSAFE_VARIABLE}={value!r}: 1 for the suite's unsafe mode, 0 or unset for durable"
        )
    return value == "1"


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"(no log at {path})"
    tail = text.splitlines()[-lines:]
    return f"last lines of {path}:\n" + "\n".join("    " + line for line in tail)


def log_tails(logs: Sequence[Path]) -> str:
    return "\n".join(log_tail(log) for log in logs)


@dataclass(frozen=True)
class Proc:
    """A process we started, named by its pid and its start time: a pid alone may be reused by another
    process after ours died."""

    pid: int
    start_ticks: int

    @classmethod
    def of(cls, pid: int) -> Proc:
        ticks = _start_ticks(pid)
        if ticks is None:
            raise ServerError(f"process {pid} vanished right after it started")
        return cls(pid, ticks)

    def alive(self) -> bool:
        # A dead server may stay a zombie while its parent lives, so kill -0 is no proof of life.
        stat = _stat_fields(self.pid)
        return stat is not None and stat[0] not in ("Z", "X") and int(stat[19]) == self.start_ticks

    def owns_listener(self, port: int) -> bool:
        """True when this process holds a socket listening on the port (in its own network namespace)."""
        wanted = {f"socket:[{inode}]" for inode in _listening_inodes(self.pid, port)}
        if not wanted:
            return False
        try:
            fds = list(Path(f"/proc/{self.pid}/fd").iterdir())
        except (FileNotFoundError, PermissionError):
            return False
        for fd in fds:
            try:
                if os.readlink(fd) in wanted:
                    return True
            except FileNotFoundError:
                continue  # closed since the listing: a busy server opens and closes files all the time
        return False

    def rss_bytes(self) -> int:
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except FileNotFoundError:
            pass
        return 0

    def uptime_seconds(self) -> float:
        boot_uptime = float(Path("/proc/uptime").read_text().split()[0])
        return boot_uptime - self.start_ticks / os.sysconf("SC_CLK_TCK")

    def signal(self, signum: int) -> None:
        if self.alive():
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def wait_gone(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.alive():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def terminate(self, name: str, timeout: float) -> None:
        """SIGTERM, then SIGKILL if the process is still there after the timeout."""
        self.signal(signal.SIGTERM)
        if not self.wait_gone(timeout):
            say(f"{name}: pid {self.pid} still running {timeout:.0f} s after SIGTERM, killing it")
            self.signal(signal.SIGKILL)
            self.wait_gone(10)

    def to_json(self) -> list[int]:
        return [self.pid, self.start_ticks]

    @classmethod
    def from_json(cls, value: Sequence[int]) -> Proc:
        return cls(int(value[0]), int(value[1]))


def _stat_fields(pid: int) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name in parentheses may hold spaces: the fields start after its closing parenthesis.
    return stat[stat.rindex(")") + 2 :].split()


def _start_ticks(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[19])


def _listening_inodes(pid: int, port: int) -> set[str]:
    inodes = set()
    # The process's own tables: a server of the host bed listens in a network namespace of its own.
    for table in (f"/proc/{pid}/net/tcp", f"/proc/{pid}/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for row in rows:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes


def port_answers(port: int, host: str = HOST) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex((host, port)) == 0


def spawn(argv: Sequence[str], *, env: dict[str, str], log: Path, cwd: Path) -> Proc:
    """Start a server detached from the caller: in its own session, with the caller's terminal and
    signals left behind, and not as the caller's child, so that a pytest run or a shell does not keep
    it as a zombie when it dies, nor take it down when it exits."""
    log.parent.mkdir(parents=True, exist_ok=True)
    launcher = subprocess.run(
        ["/bin/sh", "-c", 'log=$1; shift; "$@" >>"$log" 2>&1 </dev/null & echo $!', "sh", str(log), *argv],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        check=True,
    )
    return Proc.of(int(launcher.stdout.strip()))


def run_logged(
    argv: Sequence[str], *, log: Path, what: str, env: dict[str, str] | None = None, **kwargs
) -> None:
    """Run an installation step with its output in a log; a failure names the step and shows the log."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(argv)}\n")
        out.flush()
        try:
            if "input" not in kwargs:
                kwargs["stdin"] = subprocess.DEVNULL
            result = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env, **kwargs)
        except FileNotFoundError as missing:
            raise ServerError(f"{what}: {missing.filename} not found") from None
    if result.returncode != 0:
        raise ServerError(f"{what} failed (exit {result.returncode}); {log_tail(log)}")


def require_program(program: str, hint: str) -> str:
    found = shutil.which(program)
    if found is None:
        raise ServerError(f"{program} not found on PATH: {hint}")
    return found


def start_timeout() -> float:
    return float(os.environ.get("MAILQ_SERVERS_START_TIMEOUT", "240"))


def wait_for(
    what: str,
    ready: Callable[[], bool],
    *,
    alive: Callable[[], bool],
    logs: Sequence[Path],
    timeout: float | None = None,
) -> None:
    """Poll until ready; fail at once with the logs' tails when the server died, or at the timeout."""
    timeout = start_timeout() if timeout is None else timeout
    deadline = time.monotonic() + timeout
    while True:
        if ready():
            return
        if not alive():
            raise ServerError(f"{what}: the process exited while starting; {log_tails(logs)}")
        if time.monotonic() > deadline:
            raise ServerError(f"{what}: not ready after {timeout:.0f} s; {log_tails(logs)}")
        time.sleep(0.25)


def log_contains(path: Path, text: str) -> bool:
    try:
        return text in path.read_text(errors="replace")
    except FileNotFoundError:
        return False


def fresh_log(path: Path) -> Path:
    """Keep the previous run's log beside the new one, so readiness only reads this run's lines."""
    if path.exists():
        path.replace(path.with_name(path.name + ".previous"))
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def locked(path: Path, name: str) -> Iterator[None]:
    """One harness process at a time installs, starts or stops a given server (pytest sessions of
    several worktrees may ask for it together)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"{name}: waiting for another harness process working on it")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass(frozen=True)
class Place:
    """Where a server's processes run: the address they bind to, the name other nodes know that address
    by, and the command prefix that runs a program there (none on this machine's loopback; on a host of
    the bed, `ip netns exec` into its namespace, see hosts.py)."""

    address: str = HOST
    host_name: str = "localhost"
    prefix: tuple[str, ...] = ()

    def command(self, argv: Sequence[str]) -> list[str]:
        return [*self.prefix, *argv]


LOOPBACK = Place()


@dataclass(frozen=True)
class Running:
    """A started server as its state file records it: its processes, the ports its main process listens
    on, and the facts its clients need."""

    procs: dict[str, Proc]
    ports: dict[str, int]
    facts: dict[str, Any]


class Server(ABC):
    """One server of the harness. Subclasses say how to install, launch, wait for and stop it; this class
    keeps its state file and decides whether a recorded instance is still ours, alive and serving."""

    name: str
    #: The loopback ports the main process listens on, by role: the variable that overrides it, and the
    #: default (chosen away from the usual defaults, which other software on the machine may hold).
    port_settings: dict[str, tuple[str, int]]
    #: The process that holds the listening ports (the others, if any, only need to be alive).
    main_process = "server"
    #: Where it runs: this machine's loopback unless a subclass takes a place (a host of the bed).
    place = LOOPBACK

    def __init__(self, cache: Path | None = None, *, run_dir: Path | None = None) -> None:
        self.cache = cache or cache_root()
        self.home = self.cache / self.name
        # What it installs stays in the cache; its data, logs and state may live elsewhere (a bed's host).
        self.run_dir = run_dir or self.home / "run"
        self.state_file = self.run_dir / "state.json"

    def ports(self) -> dict[str, int]:
        return {
            role: port_setting(variable, default) for role, (variable, default) in self.port_settings.items()
        }

    # What a subclass provides.

    @abstractmethod
    def installed(self) -> bool: ...

    @abstractmethod
    def install(self) -> None:
        """Install what is missing into the cache; a server from a Debian package raises the error naming
        the package (system_packages.py), since only `make system-packages` installs those."""

    @abstractmethod
    def launch(self) -> dict[str, Proc]:
        """Start the processes and return them by role; readiness is waited for separately."""

    @abstractmethod
    def wait_ready(self, procs: dict[str, Proc]) -> None: ...

    @abstractmethod
    def facts(self) -> dict[str, Any]:
        """What clients need to connect (host, ports, keys, URLs), stored in the state file."""

    def shut_down(self, procs: dict[str, Proc]) -> None:
        for role, proc in reversed(procs.items()):
            proc.terminate(f"{self.name} {role}", timeout=30)

    # The common life cycle.

    def lock(self):
        return locked(self.cache / "locks" / f"{self.name}.lock", self.name)

    def recorded(self) -> Running | None:
        try:
            state = json.loads(self.state_file.read_text())
            return Running(
                procs={role: Proc.from_json(value) for role, value in state["procs"].items()},
                ports={role: int(port) for role, port in state["ports"].items()},
                facts=state["facts"],
            )
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError, IndexError):
            # Written atomically, so only a hand edit spoils it: treat it as no record.
            say(f"{self.name}: ignoring the unreadable state file {self.state_file}")
            return None

    def serving(self, running: Running) -> bool:
        """Every recorded process alive, and the main one holding every recorded port."""
        main = running.procs[self.main_process]
        return all(proc.alive() for proc in running.procs.values()) and all(
            main.owns_listener(port) for port in running.ports.values()
        )

    def running(self) -> Running | None:
        running = self.recorded()
        return running if running is not None and self.serving(running) else None

    def ensure(self) -> tuple[Running, str]:
        """The running instance, started (and installed) first when there is none; with what was done."""
        with self.lock():
            running = self.recorded()
            if running is not None:
                if self.serving(running):
                    self._check_same_ports(running)
                    return running, "reused"
                self._clean_up(running)
            ports = self.ports()
            for role, port in ports.items():
                if port_answers(port, self.place.address):
                    raise ServerError(
                        f"{self.name}: port {port} ({role}) on {self.place.address} is already in use by a "
                        "process that is not this "
                        f"harness's {self.name}: stop it or choose another port with "
                        f"{self.port_settings[role][0]}=PORT"
                    )
            did = "started"
            if not self.installed():
                started = time.monotonic()
                self.install()
                did = f"installed in {time.monotonic() - started:.0f} s, started"
            self.run_dir.mkdir(parents=True, exist_ok=True)
            procs = self.launch()
            running = Running(procs=procs, ports=ports, facts=self.facts())
            # Recorded before it is ready: if this process dies while waiting, the next `up` finds the
            # half-started server as its own and stops it, instead of taking its ports for a stranger's.
            self._write_state(running)
            try:
                self.wait_ready(procs)
            except BaseException:
                self.shut_down(procs)
                self.state_file.unlink(missing_ok=True)
                raise
            return running, did

    def stop(self) -> bool:
        """Stop the recorded instance; False when there was none running."""
        with self.lock():
            running = self.recorded()
            if running is None:
                return False
            alive = any(proc.alive() for proc in running.procs.values())
            self.shut_down(running.procs)
            self.state_file.unlink(missing_ok=True)
            return alive

    def _clean_up(self, running: Running) -> None:
        """A recorded instance that no longer serves: stop what is left of it before starting anew."""
        if any(proc.alive() for proc in running.procs.values()):
            say(f"{self.name}: the recorded instance is not serving, stopping what is left of it")
            self.shut_down(running.procs)
        self.state_file.unlink(missing_ok=True)

    def _check_same_ports(self, running: Running) -> None:
        wanted = self.ports()
        if wanted != running.ports:
            raise ServerError(
                f"{self.name} is running on ports {running.ports}, not the ports asked for {wanted}: "
                f"stop it first (`python -m mailq_servers down {self.name}`)"
            )

    def _write_state(self, running: Running) -> None:
        state = {
            "procs": {role: proc.to_json() for role, proc in running.procs.items()},
            "ports": running.ports,
            "facts": running.facts,
        }
        temporary = self.state_file.with_suffix(".tmp")
        # The facts may hold the S3 secret key: readable by the owner only.
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(state, out, indent=2)
        temporary.replace(self.state_file)
