"""`python -m mailq_servers up|down|status|env [server ...]`: the servers of the distributed tests;
`python -m mailq_servers deployment [--hosts] DIR`: a fresh deployment on them (or on the host bed), its
URL in DIR/url (deployment.py); `python -m mailq_servers on HOST COMMAND...`: a command run on a host of
the bed, with what a mailq process there needs in its environment."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from . import FACTS, ON_DEMAND, SERVERS, TLS_VARIANTS, ServerError, cache_root
from .base import Proc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mailq_servers",
        description=f"Install, start and stop the servers of the distributed tests (cache: {cache_root()}).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for command, help_text in (
        ("up", "install what is missing, start (or reuse) the servers and wait until they serve"),
        ("down", "stop the servers gracefully"),
        ("status", "say which servers run, with their pids, ports and memory"),
        ("env", "print shell `export` lines pointing at the running servers"),
    ):
        sub = commands.add_parser(command, help=help_text)
        default = "all but " + ", ".join(sorted(ON_DEMAND)) if command == "up" else "all"
        sub.add_argument(
            "servers", nargs="*", metavar="server", help=f"{' | '.join(SERVERS)} (default: {default})"
        )
        sub.add_argument(
            "--tls",
            action="store_true",
            help=f"the TLS servers instead: {', '.join(TLS_VARIANTS.values())} (for those named, their own)",
        )
    fresh = commands.add_parser(
        "deployment",
        help="replace the deployment whose URL DIR/url holds by a new keyspace, bucket and vhost; "
        "print its URL",
    )
    fresh.add_argument("directory", type=Path, metavar="DIR")
    fresh.add_argument("--remove", action="store_true", help="only remove it, and DIR, making none")
    fresh.add_argument("--hosts", action="store_true", help="on the host bed (`up hosts`), not on loopback")
    on = commands.add_parser(
        "on",
        help="run COMMAND on a host of the bed, with the bed's AMQP password, S3 keys and Spark in its env",
    )
    on.add_argument("host", metavar="HOST")
    on.add_argument("argv", nargs=argparse.REMAINDER, metavar="COMMAND")
    args = parser.parse_args(argv)
    try:
        if args.command == "deployment":
            return _deployment(args.directory, remove=args.remove, hosts=args.hosts)
        if args.command == "on":
            return _on(args.host, args.argv)
    except ServerError as error:
        print(f"servers: error: {error}", file=sys.stderr)
        return 1
    unknown = [name for name in args.servers if name not in SERVERS]
    if unknown:
        parser.error(f"unknown server {unknown[0]!r} (choose from {', '.join(SERVERS)})")
    names = selected(args.command, args.servers, args.tls)
    try:
        if args.command == "env":
            return env(names, named=bool(args.servers))
        return {"up": up, "down": down, "status": status}[args.command](names)
    except ServerError as error:
        print(f"servers: error: {error}", file=sys.stderr)
        return 1


def _deployment(directory: Path, *, remove: bool, hosts: bool) -> int:
    from functools import partial

    from . import deployment  # imports mailq_runtime, which the other commands do without

    if hosts:
        from . import bed_deployment
        from .host_bed import HostBed

        bed = HostBed()
        steps = {"make": partial(bed_deployment.make, bed), "remove": partial(bed_deployment.remove, bed)}
    else:
        steps = {"make": deployment.make, "remove": deployment.remove}
    if remove:
        deployment.discard(directory, remove=steps["remove"])
    else:
        print(deployment.fresh(directory, **steps))
    return 0


def _on(host: str, argv: list[str]) -> int:
    import os
    import subprocess

    from .host_bed import HostBed, running_facts

    if not argv:
        raise ServerError("on: name the command to run on the host")
    command = HostBed().host(host).command(argv)
    return subprocess.run(command, env={**os.environ, **running_facts().client_env()}).returncode


def selected(command: str, named: list[str], tls: bool = False) -> list[str]:
    """The servers a command acts on: those named, once each; else `up` starts the servers the whole
    suite shares (not ON_DEMAND's), and down, status and env take every server. With `tls`, the TLS
    servers: those of the names given (a server that has none stays itself), else the single ones."""
    if tls:
        names = named or [name for name in TLS_VARIANTS if name not in ON_DEMAND]
        return list(dict.fromkeys(TLS_VARIANTS.get(name, name) for name in names))
    if named:
        return list(dict.fromkeys(named))
    return [name for name in SERVERS if command != "up" or name not in ON_DEMAND]


def up(names: list[str]) -> int:
    failed = []
    for name in names:
        started = time.monotonic()
        try:
            running, did = SERVERS[name]().ensure()
        except ServerError as error:
            print(f"servers: error: {error}", file=sys.stderr)
            failed.append(name)
            continue
        main_proc = running.procs[SERVERS[name].main_process]
        ports = "".join(f", {role} {port}" for role, port in running.ports.items())
        print(f"{name}: {did} ({time.monotonic() - started:.1f} s), pid {main_proc.pid}{ports}", flush=True)
    if failed:
        print(f"servers: error: could not start {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def down(names: list[str]) -> int:
    for name in reversed(names):
        started = time.monotonic()
        stopped = SERVERS[name]().stop()
        print(f"{name}: {'stopped' if stopped else 'was not running'} ({time.monotonic() - started:.1f} s)")
    return 0


def status(names: list[str]) -> int:
    for name in names:
        server = SERVERS[name]()
        recorded = server.recorded()
        if recorded is None:
            print(f"{name}: stopped")
        elif not server.serving(recorded):
            print(f"{name}: not serving (recorded in {server.state_file}; `up` restarts it)")
        else:
            procs = recorded.procs.values()
            ports = "".join(f", {role} {port}" for role, port in recorded.ports.items())
            print(
                f"{name}: running, pid {' '.join(str(proc.pid) for proc in procs)}{ports}, "
                f"RSS {_mib(procs)} MiB, up {_duration(recorded.procs[server.main_process])}"
            )
    return 0


def env(names: list[str], named: bool) -> int:
    missing = []
    for name in names:
        found = SERVERS[name]().running()
        if found is None:
            missing.append(name)
            print(f"# {name}: not running")
            continue
        for variable, value in FACTS[name](**found.facts).env().items():
            print(f"export {variable}={shlex.quote(value)}")
    # Asked for by name, a server that is not running is an error; the default listing only notes it.
    return 1 if missing and named else 0


def _mib(procs) -> int:
    return round(sum(proc.rss_bytes() for proc in procs) / 2**20)


def _duration(proc: Proc) -> str:
    seconds = int(proc.uptime_seconds())
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m{seconds % 60:02d}s"


if __name__ == "__main__":
    sys.exit(main())
