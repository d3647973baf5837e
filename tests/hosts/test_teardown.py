"""`python -m mailq_servers down hosts` leaves nothing of the bed: no namespace, link, hosts file or
process, not even one a test started on a host and left running."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from mailq_servers import hosts as network
from mailq_servers.host_bed import HostBed


def _mentioning(text: str) -> list[str]:
    """The command lines of this machine's processes that name `text`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in argv:
            found.append(f"{cmdline.parent.name}: {argv[:200]}")
    return found


def test_down_hosts_leaves_no_namespace_link_or_process(host_bed: HostBed):
    running = host_bed.running()
    assert running is not None
    stray = subprocess.Popen(host_bed.host("worker2").command(["sleep", "600"]))
    assert stray.pid in host_bed.host("worker2").pids()
    down = subprocess.run(
        [sys.executable, "-m", "mailq_servers", "down", "hosts"], capture_output=True, text=True, timeout=600
    )
    assert down.returncode == 0 and down.stdout.startswith("hosts: stopped"), down
    assert stray.wait(30) is not None
    assert network.namespaces() == []
    assert network.links() == []
    assert network.processes() == {}
    assert not any(proc.alive() for proc in running.procs.values())
    assert list(network.NETNS_ETC.glob(f"{network.NAMESPACE_PREFIX}*")) == []
    assert _mentioning(str(host_bed.run_dir)) == []
    assert host_bed.recorded() is None
