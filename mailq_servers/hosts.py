"""Hosts of the test bed, made with Linux network namespaces (root only): each host a namespace with its
own address on a bridge the harness makes, in a private range that exists only on that bridge, and its
own view of the files.

The root namespace holds the bridge's first address, so the harness and the tests reach every host; the
hosts have no default route, and nothing forwards or translates their traffic, so no packet of theirs
leaves the machine. A program runs on a host through `Host.command()`: `ip netns exec` into its
namespace (which also puts the host's /etc/netns/<namespace>/hosts over /etc/hosts, naming every host of
the bed), with the host's name as its host name (a UTS namespace), in a mount namespace of its own where
every other host's directory is covered by an empty, read-only tmpfs, so no process of one host reads
another's data.

The faults of a network are functions here: `partition()` cuts a host off from chosen
others (blackhole routes both ways: packets vanish, as in a real partition, and connections time out),
`heal()` undoes it, `link_down()`/`link_up()` unplug the host's cable. This kernel has no netem qdisc
(CONFIG_NET_SCH_NETEM is not set), so delay and loss on a link are not offered here."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .base import Place, ServerError, say

BRIDGE = "mailq-bed0"
#: How long a link plugged back may take to forward (`link_up`), and the bridge port state that does.
LINK_UP_SECONDS = 30
BRIDGE_PORT_FORWARDING = "3"
#: The bed's private range: on the bridge only.
NETWORK_PREFIX = "10.213.0."
PREFIX_LENGTH = 24
BRIDGE_ADDRESS = NETWORK_PREFIX + "1"
NAMESPACE_PREFIX = "mailq-bed-"
#: The root namespace's end of each host's veth pair (a link name has at most 15 characters).
LINK_PREFIX = "mqbed-"
NETNS_ETC = Path("/etc/netns")
DOMAIN = "mailq-bed"

# Names the host (in the UTS namespace of its own that `unshare --uts` gave), covers each directory given
# before `--` with an empty read-only tmpfs, then runs the rest. `ip netns exec` has already given the
# process a mount namespace of its own (mounts made there stay there).
ON_HOST = (
    'hostname "$1" && shift && '
    'while [ "$1" != -- ]; do mount -t tmpfs -o ro,size=4k,mode=0 mailq-bed-elsewhere "$1" || exit 1; '
    'shift; done; shift; exec "$@"'
)


@dataclass(frozen=True)
class Host:
    """One host of the bed: its name (also its host name on the bed), its address and the directory that
    holds its files; `others` are the directories of the other hosts, which it does not see."""

    name: str
    address: str
    directory: Path
    others: tuple[Path, ...] = ()

    @property
    def namespace(self) -> str:
        return NAMESPACE_PREFIX + self.name

    @property
    def link(self) -> str:
        return LINK_PREFIX + self.name

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` as run on this host."""
        hidden = [str(path) for path in self.others]
        on_host = ["unshare", "--uts", "/bin/sh", "-c", ON_HOST, "sh", self.name, *hidden, "--"]
        return ["ip", "netns", "exec", self.namespace, *on_host, *argv]

    def place(self) -> Place:
        return Place(self.address, self.name, tuple(self.command([])))

    def pids(self) -> list[int]:
        """The processes running in the host's network namespace."""
        listed = subprocess.run(["ip", "netns", "pids", self.namespace], capture_output=True, text=True)
        return [int(pid) for pid in listed.stdout.split()] if listed.returncode == 0 else []


def _ip(*arguments: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *arguments], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise ServerError(f"ip {' '.join(arguments)}: {done.stderr.strip()}")
    return done


def create(hosts: Sequence[Host]) -> None:
    """The bridge with the root namespace's address, and each host: its namespace, its veth pair (eth0 in
    the host, its other end on the bridge), its address, its loopback, its hosts file and its directory."""
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{BRIDGE_ADDRESS}/{PREFIX_LENGTH}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    hosts_file = "127.0.0.1 localhost\n" + "".join(
        f"{host.address} {host.name}.{DOMAIN} {host.name}\n" for host in hosts
    )
    for host in hosts:
        host.directory.mkdir(parents=True, exist_ok=True)
        etc = NETNS_ETC / host.namespace
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(hosts_file)
        _ip("netns", "add", host.namespace)
        _ip("link", "add", host.link, "type", "veth", "peer", "name", "eth0", "netns", host.namespace)
        _ip("link", "set", host.link, "master", BRIDGE, "up")
        _ip("-n", host.namespace, "addr", "add", f"{host.address}/{PREFIX_LENGTH}", "dev", "eth0")
        _ip("-n", host.namespace, "link", "set", "lo", "up")
        _ip("-n", host.namespace, "link", "set", "eth0", "up")


def namespaces() -> list[str]:
    """The bed's namespaces that exist (made by this harness: the prefix is its own)."""
    listed = _ip("netns", "list", check=False).stdout.split("\n")
    names = [line.split()[0] for line in listed if line.strip()]
    return [name for name in names if name.startswith(NAMESPACE_PREFIX)]


def links() -> list[str]:
    """The bed's links in the root namespace: the bridge and the hosts' veth ends."""
    listed = _ip("-o", "link", "show", check=False).stdout.splitlines()
    names = [line.split(":")[1].strip().split("@")[0] for line in listed if ":" in line]
    return [name for name in names if name == BRIDGE or name.startswith(LINK_PREFIX)]


def processes() -> dict[str, list[int]]:
    """The processes left in the bed's namespaces, by namespace."""
    found = {}
    for namespace in namespaces():
        listed = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
        pids = [int(pid) for pid in listed.stdout.split()]
        if pids:
            found[namespace] = pids
    return found


def remove_all() -> None:
    """Every process still in a namespace of the bed (SIGKILL: the servers were stopped before), every
    namespace, link and hosts file of the bed."""
    for namespace, pids in processes().items():
        say(f"hosts: killing {len(pids)} processes left in {namespace}")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 30
    while processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    for namespace in namespaces():
        _ip("netns", "delete", namespace, check=False)
        etc = NETNS_ETC / namespace
        (etc / "hosts").unlink(missing_ok=True)
        if etc.exists():
            etc.rmdir()
    for link in links():
        _ip("link", "delete", link, check=False)
    # A partition that also cut this machine off from a host, left by a harness that died in it.
    _ip("route", "flush", "root", f"{NETWORK_PREFIX}0/{PREFIX_LENGTH}", "type", "blackhole", check=False)


# Faults of the network: partitions and unplugged links.


def partition(host: Host, others: Sequence[Host], *, from_here: bool = False) -> None:
    """Cut `host` off from `others` both ways: their packets to each other vanish. `from_here`: from this
    machine's root namespace too, whose processes (a test's own clients) are then on the others' side."""
    for other in others:
        _ip("-n", host.namespace, "route", "add", "blackhole", f"{other.address}/32")
        _ip("-n", other.namespace, "route", "add", "blackhole", f"{host.address}/32")
    if from_here:
        _ip("route", "add", "blackhole", f"{host.address}/32")


def heal(host: Host, others: Sequence[Host]) -> None:
    """Undo `partition(host, others)`, from this machine too."""
    for other in others:
        _ip("-n", host.namespace, "route", "delete", "blackhole", f"{other.address}/32", check=False)
        _ip("-n", other.namespace, "route", "delete", "blackhole", f"{host.address}/32", check=False)
    _ip("route", "delete", "blackhole", f"{host.address}/32", check=False)


def link_down(host: Host) -> None:
    """Unplug the host: its end of the link on the bridge goes down, nothing reaches it or leaves it."""
    _ip("link", "set", host.link, "down")


def link_up(host: Host) -> None:
    """Plug the host back, and return once its link carries traffic: the kernel brings a bridge port
    back to forwarding from a work queue of its own, which a loaded machine runs seconds late."""
    _ip("link", "set", host.link, "up")
    port = Path("/sys/class/net", host.link)
    deadline = time.monotonic() + LINK_UP_SECONDS
    while not _forwarding(host, port):
        if time.monotonic() > deadline:
            raise ServerError(
                f"host {host.name}: its link {host.link} did not forward within {LINK_UP_SECONDS} s"
            )
        time.sleep(0.05)


def _forwarding(host: Host, port: Path) -> bool:
    """Both ends of the host's link up (its eth0 in its namespace too), and the bridge's port forwarding."""
    inside = _ip("-n", host.namespace, "-o", "link", "show", "eth0").stdout
    return (
        (port / "operstate").read_text().strip() == "up"
        and (port / "brport" / "state").read_text().strip() == BRIDGE_PORT_FORWARDING
        and "state UP" in inside
    )
