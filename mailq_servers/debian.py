"""Debian packages the harness installs when the machine lacks them (the servers without a build of their
own, and the tests' SMTP tools): apt-get, root only, with answers preset and no system service started."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .base import ServerError, cache_root, require_program, run_logged, say

# Answers given before installing: Postfix as a package only, with no system instance configured or
# started (the tests and benchmarks run private instances on loopback).
_PRESEEDS = {"postfix": b"postfix postfix/main_mailer_type select No configuration\n"}
_POLICY_RC = Path("/usr/sbin/policy-rc.d")


def apt_install(package: str, *, log: Path) -> None:
    """Debian's `package`, installed with apt-get (root only), its output in `log`."""
    if os.geteuid() != 0:
        raise ServerError(
            f"{package} is not installed and installing it needs root: "
            f"sudo apt-get install --no-install-recommends {package}"
        )
    apt = shutil.which("apt-get")
    if apt is None:
        raise ServerError(f"{package} is not installed and this is no Debian system (no apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    preseed = _PRESEEDS.get(package)
    if preseed is not None:
        run_logged(["debconf-set-selections"], log=log, what="debconf-set-selections", env=env, input=preseed)
    run_logged([apt, "update"], log=log, what="apt-get update", env=env)
    with _no_service_starts():
        run_logged(
            [apt, "install", "-y", "--no-install-recommends", package],
            log=log,
            what=f"apt-get install {package}",
            env=env,
        )


@contextmanager
def _no_service_starts() -> Iterator[None]:
    """Debian's policy-rc.d answering 101 (action forbidden) while a package installs: its daemon
    (rabbitmq-server, prometheus) is not started as a system service on every interface, since the
    harness runs its own on loopback. A machine's own policy is left as it is."""
    if _POLICY_RC.exists():
        yield
        return
    _POLICY_RC.write_text("#!/bin/sh\nexit 101\n")
    _POLICY_RC.chmod(0o755)
    try:
        yield
    finally:
        _POLICY_RC.unlink(missing_ok=True)


def debian_program(program: str, package: str) -> str:
    """The path of `program`, installed from Debian's `package` first when the machine lacks it (the
    tests' SMTP clients, as the servers, come with the project)."""
    found = shutil.which(program)
    if found is None:
        say(f"{program}: installing Debian's {package} with apt-get")
        apt_install(package, log=cache_root() / package / "install.log")
        found = require_program(program, f"apt-get install {package}")
    return found
